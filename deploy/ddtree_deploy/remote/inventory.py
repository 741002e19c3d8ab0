"""The host inventory: ``deploy/hosts.toml`` (or ``--inventory PATH`` / ``$DDTREE_DEPLOY_INVENTORY``)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ddtree_deploy.errors import InventoryError
from ddtree_deploy.paths import repo_root

ENV_VAR = "DDTREE_DEPLOY_INVENTORY"
DEFAULT_STATE_DIR = "~/.local/state/ddtree-deploy"
DEFAULT_SMOKE_TIMEOUT = 300.0
DEFAULT_CONNECT_TIMEOUT = 15.0

_STR_KEYS = (
    "target",
    "identity_file",
    "known_hosts",
    "python",
    "site_packages",
    "restart_command",
    "stop_command",
    "health_url",
    "state_dir",
    "side_by_side_of",
    "venv",
)
_NUM_KEYS = ("smoke_timeout", "health_timeout", "connect_timeout")
# serving: the host serves traffic (implied for a host a side-by-side entry names): `push` refuses it.
# allow_in_place: the explicit opt-in for a serving host that is really meant to be patched in place.
_BOOL_KEYS = ("serving", "allow_in_place")
_KNOWN = set(_STR_KEYS) | set(_NUM_KEYS) | set(_BOOL_KEYS) | {"smoke_modules", "smoke_run", "bench", "description"}
# A side-by-side host copies these from the host it sits beside when it does not set them.
_INHERITED = ("target", "identity_file", "known_hosts")


@dataclass
class HostConfig:
    name: str
    target: str
    python: str
    identity_file: str | None = None
    known_hosts: str | None = None
    site_packages: str | None = None
    smoke_modules: list[str] | None = None
    smoke_run: list[str] | None = None  # modules run as `python -m M` after the imports
    restart_command: str | None = None
    health_url: str | None = None
    state_dir: str = DEFAULT_STATE_DIR
    smoke_timeout: float = DEFAULT_SMOKE_TIMEOUT
    health_timeout: float = 120.0
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    stop_command: str | None = None
    # A side-by-side target: a venv beside ``side_by_side_of``'s production environment, made and
    # patched by ``ddtree-deploy rollout``; ``python`` is the venv's interpreter, ``production``
    # the host it sits beside (never written by a rollout).
    side_by_side_of: str | None = None
    venv: str | None = None
    production: HostConfig | None = None
    # ``serving = true`` in the inventory; the side-by-side entries that name this host (filled by
    # load_inventory); ``allow_in_place = true``: the user's explicit opt-in to patch it in place anyway.
    serving: bool = False
    side_by_side_entries: list[str] = field(default_factory=list)
    allow_in_place: bool = False
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def is_side_by_side(self) -> bool:
        return self.side_by_side_of is not None

    @property
    def serves_traffic(self) -> bool:
        """Production: marked ``serving = true``, or a side-by-side entry sits beside it."""
        return self.serving or bool(self.side_by_side_entries)

    @property
    def in_place_refused(self) -> bool:
        """``push`` must not patch this host's live environment (no ``allow_in_place = true``)."""
        return self.serves_traffic and not self.allow_in_place

    @property
    def known_hosts_path(self) -> Path:
        return Path(os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts"))

    @property
    def identity_path(self) -> Path | None:
        return Path(os.path.expanduser(self.identity_file)) if self.identity_file else None


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, HostConfig]

    def get(self, name: str) -> HostConfig:
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "(none)"
            raise InventoryError(
                f"no host {name!r} in {self.path} (known: {known})",
                hint=f"add a [hosts.{name}] table to {self.path}, or pass --inventory PATH",
            ) from None

    def select(self, names: list[str] | None, all_hosts: bool, command: str = "push") -> list[HostConfig]:
        """The hosts a command runs on; ``command`` (e.g. ``status``, ``lock release``) names it in the hint."""
        if all_hosts and names:
            raise InventoryError("give host names or --all, not both", hint=f"ddtree-deploy {command} HOST...  (or --all)")
        if all_hosts:
            if not self.hosts:
                raise InventoryError(f"{self.path} defines no hosts", hint="add a [hosts.NAME] table (see docs/deploy.md)")
            return list(self.hosts.values())
        if not names:
            known = ", ".join(sorted(self.hosts)) or "none in " + str(self.path)
            raise InventoryError(
                f"{command}: name at least one host (or --all)",
                hint=f"ddtree-deploy {command} HOST...   (hosts: {known}; or --all)",
            )
        seen: list[HostConfig] = []
        for n in names:
            h = self.get(n)
            if h not in seen:
                seen.append(h)
        return seen


def default_inventory_path() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return repo_root() / "deploy" / "hosts.toml"


def _parse_host(name: str, table: Any, path: Path) -> HostConfig:
    where = f"{path}: [hosts.{name}]"
    fix = f"edit [hosts.{name}] in {path} (its keys: docs/deploy.md, 'Inventory')"
    if not isinstance(table, dict):
        raise InventoryError(f"{where} must be a table", hint=fix)
    for key in ("target", "python"):
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise InventoryError(f"{where}: '{key}' is required and must be a non-empty string", hint=fix)
    for key in _STR_KEYS:
        if key in table and not isinstance(table[key], str):
            raise InventoryError(f"{where}: '{key}' must be a string", hint=fix)
    unknown = sorted(set(table) - _KNOWN)
    if unknown:
        raise InventoryError(f"{where}: unknown key(s) {', '.join(unknown)}", hint=fix)
    if "venv" in table and "side_by_side_of" not in table:
        raise InventoryError(f"{where}: 'venv' belongs to a side-by-side host (with side_by_side_of)", hint=fix)
    mods = table.get("smoke_modules")
    if mods is not None and (not isinstance(mods, list) or not all(isinstance(m, str) for m in mods)):
        raise InventoryError(f"{where}: 'smoke_modules' must be a list of module names", hint=fix)
    run = table.get("smoke_run")
    if run is not None and (not isinstance(run, list) or not all(isinstance(m, str) and m for m in run)):
        raise InventoryError(f"{where}: 'smoke_run' must be a list of module names (each run as python -m M)", hint=fix)
    for key in _NUM_KEYS:
        if key in table and (isinstance(table[key], bool) or not isinstance(table[key], (int, float)) or table[key] <= 0):
            raise InventoryError(f"{where}: '{key}' must be a positive number of seconds", hint=fix)
    for key in _BOOL_KEYS:
        if key in table and not isinstance(table[key], bool):
            raise InventoryError(f"{where}: '{key}' must be true or false (got {table[key]!r})", hint=fix)
    return HostConfig(
        name=name,
        target=table["target"],
        python=table["python"],
        identity_file=table.get("identity_file"),
        known_hosts=table.get("known_hosts"),
        site_packages=table.get("site_packages"),
        smoke_modules=list(mods) if mods is not None else None,
        smoke_run=list(run) if run is not None else None,
        restart_command=table.get("restart_command"),
        health_url=table.get("health_url"),
        state_dir=table.get("state_dir") or DEFAULT_STATE_DIR,
        smoke_timeout=float(table.get("smoke_timeout", DEFAULT_SMOKE_TIMEOUT)),
        health_timeout=float(table.get("health_timeout", 120.0)),
        connect_timeout=float(table.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)),
        stop_command=table.get("stop_command"),
        serving=bool(table.get("serving", False)),
        allow_in_place=bool(table.get("allow_in_place", False)),
        raw=dict(table),
    )


def _port(url: str | None) -> int | None:
    if not url:
        return None
    try:
        u = urlparse(url)
        return u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None


def _parse_side_by_side(name: str, table: dict[str, Any], tables: dict[str, Any], path: Path) -> HostConfig:
    """A ``side_by_side_of`` host: a venv beside another host's production environment."""
    where = f"{path}: [hosts.{name}]"
    of = table["side_by_side_of"]
    prod_t = tables.get(of)
    if of == name or not isinstance(prod_t, dict):
        raise InventoryError(
            f"{where}: side_by_side_of = {of!r} names no other host in the inventory",
            hint=f"set side_by_side_of to the production host's name (one of: {', '.join(sorted(set(tables) - {name}))})",
        )
    if "side_by_side_of" in prod_t:
        raise InventoryError(f"{where}: side_by_side_of = {of!r} is itself a side-by-side host; name the production host")
    for key in _BOOL_KEYS:
        if key in table:
            raise InventoryError(
                f"{where}: '{key}' belongs to the production host ([hosts.{of}]); a side-by-side host is only ever "
                "installed by rollout, beside it",
                hint=f"remove '{key}' from [hosts.{name}]",
            )
    for key in ("python", "site_packages"):
        if key in table:
            raise InventoryError(
                f"{where}: '{key}' is derived for a side-by-side host (the venv's interpreter and site-packages)",
                hint=f"remove '{key}' from [hosts.{name}]; set 'venv' to where the side-by-side venv goes",
            )
    venv = table.get("venv")
    if not isinstance(venv, str) or not venv.strip() or not (venv.startswith("/") or venv.startswith("~")):
        raise InventoryError(
            f"{where}: a side-by-side host needs 'venv', an absolute path on the host (where rollout makes the venv)",
            hint=f'add venv = "/opt/sglang-ddtree/venv" (for example) to [hosts.{name}]',
        )
    prod = _parse_host(of, prod_t, path)
    full = dict(table)
    for key in _INHERITED:
        if key not in full and key in prod_t:
            full[key] = prod_t[key]
    full["python"] = venv.rstrip("/") + "/bin/python"
    if "target" not in full:
        raise InventoryError(f"{where}: 'target' is required (here or in [hosts.{of}])")
    full.setdefault("state_dir", f"{DEFAULT_STATE_DIR}-{name}")
    prod_venv = os.path.dirname(os.path.dirname(prod.python))
    if os.path.normpath(venv) in (os.path.normpath(prod_venv), os.path.normpath(prod.site_packages or "//")):
        raise InventoryError(
            f"{where}: venv {venv} is production's own environment ([hosts.{of}])",
            hint="give the side-by-side venv its own directory beside production's, e.g. /opt/sglang-ddtree/venv",
        )
    if os.path.normpath(os.path.expanduser(full["state_dir"])) == os.path.normpath(os.path.expanduser(prod.state_dir)):
        raise InventoryError(
            f"{where}: state_dir is production's ([hosts.{of}]); the side-by-side target keeps its own records and lock",
            hint=f"remove state_dir from [hosts.{name}] (default: {DEFAULT_STATE_DIR}-{name})",
        )
    mine, theirs = _port(full.get("health_url")), _port(prod.health_url)
    if mine is not None and mine == theirs:
        raise InventoryError(
            f"{where}: health_url port {mine} is production's ([hosts.{of}] health_url {prod.health_url}); "
            "the side-by-side server runs on its own port",
            hint=f"give the side-by-side server another port in its restart_command and health_url (e.g. {mine + 100})",
        )
    h = _parse_host(name, full, path)
    h.raw = dict(table)
    h.side_by_side_of, h.venv, h.production = of, venv, prod
    return h


def read_inventory_text(p: Path) -> str:
    """The inventory file's text; every way it can be unusable is an ``InventoryError`` (exit 2)."""
    fix = "pass --inventory PATH with a TOML inventory (see docs/deploy.md, 'Inventory')"
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InventoryError(
            f"inventory {p} not found", hint="create it (see docs/deploy.md, 'Inventory') or pass --inventory PATH"
        ) from None
    except IsADirectoryError:
        raise InventoryError(f"inventory {p} is a directory, not a file", hint=fix) from None
    except PermissionError:
        raise InventoryError(
            f"inventory {p} is not readable (permission denied)", hint=f"check its permissions, or {fix}"
        ) from None
    except OSError as exc:
        raise InventoryError(f"inventory {p} cannot be read: {exc.strerror or exc}", hint=fix) from None
    if b"\0" in data:
        raise InventoryError(f"inventory {p} is a binary file, not TOML", hint=fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"inventory {p} is not UTF-8 text (byte {exc.start}), not TOML", hint=fix) from None


def load_inventory(path: str | os.PathLike[str] | None = None) -> Inventory:
    p = Path(path).expanduser() if path else default_inventory_path()
    try:
        data = tomllib.loads(read_inventory_text(p))
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"inventory {p} is not valid TOML: {exc}", hint=f"fix the TOML syntax in {p}") from None
    hosts_t = data.get("hosts", {})
    if not isinstance(hosts_t, dict):
        raise InventoryError(f"{p}: 'hosts' must be a table of tables", hint=f"write one [hosts.NAME] table per host in {p}")
    hosts = {}
    for name, t in hosts_t.items():
        if isinstance(t, dict) and "side_by_side_of" in t:
            if not isinstance(t["side_by_side_of"], str):
                raise InventoryError(f"{p}: [hosts.{name}]: 'side_by_side_of' must be a string")
            hosts[name] = _parse_side_by_side(name, t, hosts_t, p)
        else:
            hosts[name] = _parse_host(name, t, p)
    for name, h in hosts.items():
        if h.side_by_side_of is not None:
            hosts[h.side_by_side_of].side_by_side_entries.append(name)
            if h.production is not None:
                h.production.side_by_side_entries.append(name)
    for h in hosts.values():
        if h.side_by_side_entries and h.raw.get("serving") is False:
            raise InventoryError(
                f"{p}: [hosts.{h.name}]: serving = false, but {', '.join(h.side_by_side_entries)} sits beside it "
                "(a host with a side-by-side entry serves traffic)",
                hint=f"remove serving from [hosts.{h.name}]; to patch it in place anyway, set allow_in_place = true there",
            )
    return Inventory(path=p, hosts=hosts)
