"""The host inventory: ``deploy/hosts.toml`` (or ``--inventory PATH`` / ``$DDTREE_DEPLOY_INVENTORY``)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ddtree_deploy.errors import InventoryError
from ddtree_deploy.paths import repo_root

ENV_VAR = "DDTREE_DEPLOY_INVENTORY"
DEFAULT_STATE_DIR = "~/.local/state/ddtree-deploy"
DEFAULT_SMOKE_TIMEOUT = 300.0

_STR_KEYS = ("target", "identity_file", "known_hosts", "python", "site_packages", "restart_command", "health_url", "state_dir")
_KNOWN = set(_STR_KEYS) | {"smoke_modules", "smoke_run", "smoke_timeout", "health_timeout", "bench", "description"}


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
    raw: dict[str, Any] = field(default_factory=dict)

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

    def select(self, names: list[str] | None, all_hosts: bool) -> list[HostConfig]:
        if all_hosts and names:
            raise InventoryError("give host names or --all, not both")
        if all_hosts:
            if not self.hosts:
                raise InventoryError(f"{self.path} defines no hosts")
            return list(self.hosts.values())
        if not names:
            raise InventoryError("name at least one host (or --all)", hint="ddtree-deploy push HOST")
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
    if not isinstance(table, dict):
        raise InventoryError(f"{where} must be a table")
    for key in ("target", "python"):
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise InventoryError(f"{where}: '{key}' is required and must be a non-empty string")
    for key in _STR_KEYS:
        if key in table and not isinstance(table[key], str):
            raise InventoryError(f"{where}: '{key}' must be a string")
    unknown = sorted(set(table) - _KNOWN)
    if unknown:
        raise InventoryError(f"{where}: unknown key(s) {', '.join(unknown)}")
    mods = table.get("smoke_modules")
    if mods is not None and (not isinstance(mods, list) or not all(isinstance(m, str) for m in mods)):
        raise InventoryError(f"{where}: 'smoke_modules' must be a list of module names")
    run = table.get("smoke_run")
    if run is not None and (not isinstance(run, list) or not all(isinstance(m, str) and m for m in run)):
        raise InventoryError(f"{where}: 'smoke_run' must be a list of module names (each run as python -m M)")
    for key in ("smoke_timeout", "health_timeout"):
        if key in table and (not isinstance(table[key], (int, float)) or table[key] <= 0):
            raise InventoryError(f"{where}: '{key}' must be a positive number of seconds")
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
        raw=dict(table),
    )


def load_inventory(path: str | os.PathLike[str] | None = None) -> Inventory:
    p = Path(path).expanduser() if path else default_inventory_path()
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InventoryError(
            f"inventory {p} not found", hint="create it (see docs/deploy.md, 'Inventory') or pass --inventory PATH"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"inventory {p} is not valid TOML: {exc}") from None
    hosts_t = data.get("hosts", {})
    if not isinstance(hosts_t, dict):
        raise InventoryError(f"{p}: 'hosts' must be a table of tables")
    hosts = {name: _parse_host(name, t, p) for name, t in hosts_t.items()}
    return Inventory(path=p, hosts=hosts)
