"""What we do to one host: preflight, apply (lock, backup, atomic upload, compile + smoke, restore on
failure, audit, unlock), rollback, smoke, status, history, lock. The host-side work is done by
``agent.py`` in as few SSH round trips as possible (one for preflight, one for the whole apply).
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ddtree_deploy.build.manifest import Manifest
from ddtree_deploy.errors import DriftError, HostRefusedError, LockHeldError, SmokeFailedError, UsageError
from ddtree_deploy.hashing import sha256_bytes
from ddtree_deploy.remote.connection import HostConnection
from ddtree_deploy.remote.inventory import HostConfig
from ddtree_deploy.remote.protocol import APPLIED, INTERRUPTED, NEEDS_HUMAN

MIN_PYTHON = (3, 10)
FREE_MARGIN = 16 << 20  # keep this much free on the host beyond what the deploy needs


# --- the build we push -----------------------------------------------------------------------------


@dataclass
class DeployFile:
    path: str
    action: str
    pristine_sha256: str | None
    patched_sha256: str | None
    mode: str
    patches: list[str]
    data: bytes | None


@dataclass
class BuildSet:
    dir: Path
    package: str
    version: str
    series_id: str
    files: list[DeployFile]
    raw: dict[str, Any]

    def default_smoke_modules(self) -> list[str]:
        return path_modules(self.compile_paths())

    def compile_paths(self) -> list[str]:
        return [f.path for f in self.files if f.action != "delete" and f.path.endswith(".py")]


def load_build(build_dir: str | os.PathLike[str]) -> BuildSet:
    """Read ``DIR/manifest.json`` and the files it names; check every file against its hash."""
    d = Path(build_dir)
    mpath = d / "manifest.json"
    rebuild = f"rebuild it: ddtree-deploy build --out {d}"
    if not mpath.exists():
        raise UsageError(f"{d} is not a build directory (no manifest.json)", hint="ddtree-deploy build --out DIR")
    try:
        raw = json.loads(mpath.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UsageError(f"{mpath}: not valid JSON: {exc}", hint=rebuild) from None
    Manifest.load(mpath)  # validates the format
    if raw.get("format") != 1:
        raise UsageError(f"{mpath}: unsupported manifest format {raw.get('format')!r}", hint=rebuild)
    files = []
    for e in raw.get("files", []):
        path = e["path"]
        if path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/")):
            raise UsageError(f"{mpath}: refused path {path!r}", hint=rebuild)
        data = None
        if e["action"] != "delete":
            fp = d / path
            try:
                data = fp.read_bytes()
            except FileNotFoundError:
                raise UsageError(f"{mpath}: {path} is missing from the build directory", hint=rebuild) from None
            if sha256_bytes(data) != e["patched_sha256"]:
                raise UsageError(
                    f"{d}: {path} does not match its manifest hash (the build dir was modified)",
                    hint="rebuild: ddtree-deploy build --out DIR",
                )
        if e["action"] not in ("create", "modify", "delete"):
            raise UsageError(f"{mpath}: {path}: unknown action {e['action']!r}", hint=rebuild)
        files.append(
            DeployFile(
                path,
                e["action"],
                e.get("pristine_sha256"),
                e.get("patched_sha256"),
                e.get("mode") or "0644",
                list(e.get("patches") or []),
                data,
            )
        )
    return BuildSet(d, raw.get("package", "sglang"), raw["version"], raw.get("series_id", "?"), files, raw)


def new_deploy_id() -> str:
    """Sortable and unique: UTC time to the millisecond + 3 random bytes (the host also keeps a sequence)."""
    t = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int(t * 1000) % 1000:03d}Z-" + secrets.token_hex(3)


def whoami() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# --- preflight -------------------------------------------------------------------------------------


@dataclass
class FilePlan:
    path: str
    action: str
    state: str  # pristine | patched | ours (an earlier deploy of ours) | drifted
    current_sha256: str | None
    send: bool
    series: str | None = None
    size: int = 0
    content: bytes | None = None


@dataclass
class Plan:
    host: str
    probe: dict[str, Any]
    files: list[FilePlan] = field(default_factory=list)

    @property
    def to_send(self) -> list[FilePlan]:
        return [f for f in self.files if f.send]

    @property
    def bytes_to_send(self) -> int:
        return sum(f.size for f in self.to_send)


def _ours(records: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(path, sha256) -> series id, for every file state one of our deploys put on the host."""
    out: dict[tuple[str, str], str] = {}
    for r in records:
        if r.get("status") in APPLIED:
            for f in r.get("files", []):
                if f.get("after_sha256"):
                    out[(f["path"], f["after_sha256"])] = r.get("series_id") or "?"
    return out


def classify(f: DeployFile, cur: str | None, ours: dict[tuple[str, str], str]) -> tuple[str, str | None]:
    if cur == f.patched_sha256:
        return "patched", None
    if cur == f.pristine_sha256:
        return "pristine", None
    if cur is not None and (f.path, cur) in ours:
        return "ours", ours[(f.path, cur)]
    return "drifted", None


def probe(
    hc: HostConnection,
    paths: list[str],
    *,
    want_content: set[str] | None = None,
    package: str = "sglang",
    check_import: bool = False,
) -> dict[str, Any]:
    h = hc.host
    return hc.run_agent(
        {
            "op": "probe",
            "package": package,
            "site_packages": h.site_packages,
            "state_dir": h.state_dir,
            "check_import": check_import,
            "files": [{"path": p, "want_content": bool(want_content and p in want_content)} for p in paths],
        },
        timeout=120,
    )


def preflight(hc: HostConnection, bs: BuildSet, *, dry_run: bool = False) -> Plan:
    """Everything we check before writing anything; raises a HostRefusedError subclass or LockHeldError.

    One probe of the host, then each check in turn; ``dry_run`` skips the ones about other deploys
    (lock, a deploy that needs a human, an interrupted one), since it writes nothing.
    """
    h = hc.host
    pr = probe(hc, [f.path for f in bs.files], package=bs.package, check_import=True)
    require_pinned_version(h, bs, pr)
    require_import_from_site(h, bs, pr)
    require_python(h, pr)
    require_state_outside_site(h, pr)
    plan = Plan(h.name, pr, plan_files(h, bs, pr))
    if not dry_run:
        refuse_if_locked(h, pr)
        refuse_if_needs_human(h, pr)
        refuse_if_interrupted(h, pr)
    check_disk(h, pr, plan.to_send)
    return plan


def require_pinned_version(h: HostConfig, bs: BuildSet, pr: dict[str, Any]) -> None:
    ver = pr.get("package_version")
    if ver != bs.version:
        raise HostRefusedError(
            f"{h.name}: {bs.package} on the host is {ver or 'not installed'} in {pr['site_packages']}; "
            f"the build is for {bs.version}",
            hint="install the pinned version on the host (or fix site_packages in the inventory)",
            details={"host": h.name, "host_version": ver},
        )


def require_import_from_site(h: HostConfig, bs: BuildSet, pr: dict[str, Any]) -> None:
    """The host's ``python`` imports the package from the inventory's site_packages (else the smoke
    test would run on another copy)."""
    where = pr.get("import_check") or {}
    if not where.get("ok"):
        found = where.get("found")
        raise HostRefusedError(
            f"{h.name}: {pr['python_executable']} "
            + (f"imports {bs.package} from {', '.join(found)}" if found else f"does not import {bs.package} at all")
            + f", not from site_packages {pr['site_packages']}: refusing (a deploy there would be smoke-tested on "
            f"the wrong copy)",
            hint="make `site_packages` in the inventory the directory this `python` imports it from (or drop it to "
            "ask the interpreter), or point `python` at the right interpreter",
            details={"host": h.name, "import_check": where},
        )


def require_python(h: HostConfig, pr: dict[str, Any]) -> None:
    pyv = tuple(int(x) for x in pr["python_version"].split(".")[:2])
    if pyv < MIN_PYTHON:
        raise HostRefusedError(
            f"{h.name}: the host's Python is {pr['python_version']}; SGLang needs >= 3.10", details={"host": h.name}
        )


def require_state_outside_site(h: HostConfig, pr: dict[str, Any]) -> None:
    if pr.get("state_inside_site"):
        raise HostRefusedError(
            f"{h.name}: state_dir {pr['state_dir']} is inside site-packages; backups there could be imported",
            hint="set state_dir outside site-packages in the inventory",
            details={"host": h.name},
        )


def plan_files(h: HostConfig, bs: BuildSet, pr: dict[str, Any]) -> list[FilePlan]:
    """Classify every target (pristine / patched / ours / drifted) and decide what to send; a
    drifted file or a symlink refuses the host (DriftError)."""
    ours = _ours(pr.get("records", []))
    files: list[FilePlan] = []
    drift = []
    for f in bs.files:
        info = pr["files"][f.path]
        cur = info.get("sha256")
        if info.get("is_symlink"):
            drift.append(f"{f.path}: is a symlink on the host")
            continue
        state, series = classify(f, cur, ours)
        files.append(
            FilePlan(f.path, f.action, state, cur, send=state in ("pristine", "ours"), series=series, size=len(f.data or b""))
        )
        if state == "drifted":
            drift.append(
                f"{f.path}: sha256 {cur or '(missing)'} is neither pristine {f.pristine_sha256 or '(absent)'} "
                f"nor patched {f.patched_sha256 or '(absent)'}"
            )
    if drift:
        raise DriftError(
            f"{h.name}: {len(drift)} target file(s) drifted; refusing before any write:\n  " + "\n  ".join(drift),
            hint=f"inspect with: ddtree-deploy status {h.name}; reinstall sglang=={bs.version} on the host to get pristine files",
            details={"host": h.name, "drifted": drift},
        )
    return files


def refuse_if_locked(h: HostConfig, pr: dict[str, Any]) -> None:
    lock = pr.get("lock")
    if lock:
        raise LockHeldError(
            f"{h.name}: deploy lock held by {lock.get('who')} since {lock.get('when')} ({lock.get('op')} {lock.get('deploy_id')}"
            f"{', why: ' + lock['why'] if lock.get('why') else ''})"
            + ("; its process is gone" if lock.get("alive") is False else ""),
            hint=(
                f"an interrupted deploy: ddtree-deploy status {h.name}, then ddtree-deploy rollback {h.name}"
                if lock.get("alive") is False
                else f"wait, or if you are sure: ddtree-deploy lock release {h.name}"
            ),
            details={"host": h.name, "holder": lock},
        )


def refuse_if_needs_human(h: HostConfig, pr: dict[str, Any]) -> None:
    broken = [r for r in pr.get("records", []) if r.get("status") == NEEDS_HUMAN]
    if broken:
        raise HostRefusedError(
            f"{h.name}: deploy {broken[-1]['deploy_id']} could not be restored earlier and needs a human: "
            + "; ".join(broken[-1].get("restore_problems", [])[:3]),
            hint=f"ddtree-deploy status {h.name}; fix the backup/files, then ddtree-deploy rollback {h.name} "
            f"(or, after reinstalling sglang, remove {pr['state_dir']}/deploys/{broken[-1]['deploy_id']})",
            details={"host": h.name, "needs_human": broken[-1]["deploy_id"]},
        )


def refuse_if_interrupted(h: HostConfig, pr: dict[str, Any]) -> None:
    """A deploy that stopped half way (its lock is gone: a held lock refuses first) may have left the host mixed."""
    stuck = [r for r in pr.get("records", []) if r.get("status") in INTERRUPTED]
    if stuck and not pr.get("lock"):
        raise HostRefusedError(
            f"{h.name}: deploy {stuck[-1]['deploy_id']} was interrupted ({stuck[-1]['status']}); the host may be mixed",
            hint=f"ddtree-deploy rollback {h.name}",
            details={"host": h.name, "interrupted": stuck[-1]["deploy_id"]},
        )


def check_disk(h: HostConfig, pr: dict[str, Any], sending: list[FilePlan]) -> None:
    """Write permission and free disk for what a push will write (site-packages and state dir)."""
    if not sending:
        return
    denied = []
    for fp in sending:
        info = pr["files"][fp.path]
        if not info.get("dir_writable") or (info.get("exists") and not info.get("writable")):
            denied.append(fp.path)
    if not pr.get("state_writable"):
        denied.append(f"state_dir {pr['state_dir']}")
    if denied:
        raise HostRefusedError(
            f"{h.name}: permission denied (cannot write): {', '.join(denied)}",
            hint="check the SSH user's rights on the host (or a read-only/immutable file)",
            details={"host": h.name, "denied": denied},
        )
    need_site = sum(fp.size for fp in sending) + FREE_MARGIN
    need_state = sum((pr["files"][fp.path].get("size") or 0) for fp in sending) + FREE_MARGIN
    free = dict(pr.get("free_bytes", {}))
    per_dir = [pr["files"][fp.path].get("free") for fp in sending]
    per_dir = [x for x in per_dir if x is not None]
    if per_dir:
        free["site"] = min(per_dir + ([free["site"]] if free.get("site") is not None else []))
    for key, need in (("site", need_site), ("state", need_state)):
        if free.get(key) is not None and free[key] < need:
            raise HostRefusedError(
                f"{h.name}: not enough free disk for {key} ({free[key]} bytes free, need {need})",
                hint="free some space on the host",
                details={"host": h.name, "free_bytes": free},
            )


def with_contents(hc: HostConnection, plan: Plan, bs: BuildSet) -> None:
    """For --dry-run: fetch the host's current text of the files that would change (to show a diff)."""
    want = {fp.path for fp in plan.to_send if fp.current_sha256}
    if not want:
        return
    pr = probe(hc, sorted(want), want_content=want, package=bs.package)
    for fp in plan.to_send:
        hx = pr["files"].get(fp.path, {}).get("content_hex")
        if hx is not None:
            fp.content = bytes.fromhex(hx)


# --- apply -----------------------------------------------------------------------------------------


# Test-only pauses and upload pacing, read from ``DDTREE_DEPLOY_TEST_HOOKS='{"before_commit": 2}'``:
# they only make a step slower (so a test can cut the connection or edit a file at that moment),
# never skip one. Any other key is refused, so the variable can never switch a safety check off;
# a test that needs a check out of the way injects that in-process (e.g. replaces ``check_disk``).
TEST_HOOK_DELAYS = ("after_receive", "before_commit", "between_renames", "throttle")


def test_hooks() -> dict[str, float]:
    raw = os.environ.get("DDTREE_DEPLOY_TEST_HOOKS")
    if not raw:
        return {}
    try:
        hooks = json.loads(raw)
        assert isinstance(hooks, dict)
    except (ValueError, AssertionError):
        raise UsageError("DDTREE_DEPLOY_TEST_HOOKS is not a JSON object", hint="unset DDTREE_DEPLOY_TEST_HOOKS") from None
    bad = sorted(set(hooks) - set(TEST_HOOK_DELAYS))
    if bad:
        raise UsageError(
            f"DDTREE_DEPLOY_TEST_HOOKS: unknown hook(s) {', '.join(bad)} (only delays exist: {', '.join(TEST_HOOK_DELAYS)})",
            hint="unset DDTREE_DEPLOY_TEST_HOOKS",
        )
    return {k: float(v) for k, v in hooks.items()}


def apply(
    hc: HostConnection,
    bs: BuildSet,
    plan: Plan,
    *,
    deploy_id: str,
    why: str | None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    on_sent: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    h = hc.host
    by_path = {f.path: f for f in bs.files}
    send = plan.to_send
    hooks = test_hooks()
    req = {
        "op": "apply",
        "package": bs.package,
        "site_packages": h.site_packages,
        "state_dir": h.state_dir,
        "deploy_id": deploy_id,
        "who": whoami(),
        "user": whoami().split("@")[0],
        "why": why,
        "series_id": bs.series_id,
        "version": bs.version,
        "files": [
            {
                "path": fp.path,
                "action": fp.action,
                "sha256": by_path[fp.path].patched_sha256,
                "mode": by_path[fp.path].mode,
                "size": fp.size,
                "allowed_current": [fp.current_sha256],
            }
            for fp in send
        ],
        "smoke": {
            "compile": bs.compile_paths(),
            "modules": smoke_modules(h, bs),
            "run": smoke_run(h, bs),
            "timeout": h.smoke_timeout,
        },
        "test_hooks": {k: v for k, v in hooks.items() if k != "throttle"},
    }
    payload = [by_path[fp.path].data or b"" for fp in send if fp.action != "delete"]
    return hc.run_agent(
        req,
        payload,
        on_event=on_event,
        on_sent=on_sent,
        cancel=cancel,
        timeout=h.smoke_timeout * 2 + 600,
        throttle=hooks.get("throttle", 0.0),
    )


# A module the series ships that checks itself on the host (``python -m ...``, exit 0 = healthy).
PROBE_MODULE = "sglang.srt.speculative.ddtree_probe"


def smoke_run(h: HostConfig, bs: BuildSet | None, modules: list[str] | None = None) -> list[str]:
    """Modules run as ``python -m M`` after the imports: the inventory's, else the DDTree probe if shipped
    (in the build, or among the modules installed on the host: ``modules``)."""
    if h.smoke_run is not None:
        return list(h.smoke_run)
    shipped = bs.default_smoke_modules() if bs is not None else list(modules or [])
    return [PROBE_MODULE] if PROBE_MODULE in shipped else []


def path_modules(paths: list[str]) -> list[str]:
    """``sglang/srt/x.py`` -> ``sglang.srt.x`` (``__init__.py`` -> its package)."""
    return [p[:-3].replace("/", ".").removesuffix(".__init__") for p in paths if p.endswith(".py")]


def series_paths() -> list[str]:
    """The ``.py`` files the repo's series patches (what a side-by-side venv's DDTree wheel carries
    patched): smoke's default for a host with no deploy records and no ``--build``."""
    from ddtree_deploy.patches.series import load_series
    from ddtree_deploy.paths import default_series_dir

    return [p for p in load_series(default_series_dir()).touched_paths() if p.endswith(".py")]


def smoke_modules(h: HostConfig, bs: BuildSet | None) -> list[str]:
    if h.smoke_modules is not None:
        return list(h.smoke_modules)
    return bs.default_smoke_modules() if bs else []


def rollback(
    hc: HostConnection,
    *,
    to: str | None,
    why: str | None = None,
    expect_latest: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Undo deploys. The agent checks every backup and every current file before its first write;
    ``dry_run`` only reports what would be restored; ``force`` restores over files edited on the host
    after the deploy, keeping a copy of each in the state dir first."""
    h = hc.host
    return hc.run_agent(
        {
            "op": "rollback",
            "site_packages": h.site_packages,
            "state_dir": h.state_dir,
            "to": to,
            "deploy_id": new_deploy_id(),
            "who": whoami(),
            "why": why,
            "expect_latest": expect_latest,
            "dry_run": dry_run,
            "force": force,
        },
        on_event=on_event,
        cancel=cancel,
        timeout=600,
    )


def deployed_paths(records: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for r in records:
        if r.get("status") in APPLIED:
            for f in r.get("files", []):
                if f.get("action") != "delete" and f["path"] not in out:
                    out.append(f["path"])
    return out


def smoke(
    hc: HostConnection,
    bs: BuildSet | None,
    *,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Re-run compile + smoke import (+ the probe) on what is installed: the in-place deploy records'
    files; else the build's; else, on a side-by-side host, the series' patched files in its venv.
    Nothing to check is a failure (``SmokeFailedError``), never a pass."""
    h = hc.host
    pr = probe(hc, [])
    paths = deployed_paths(pr.get("records", [])) or (bs.compile_paths() if bs else [])
    if not paths and bs is None and h.is_side_by_side:
        paths = series_paths()
    mods = smoke_modules(h, bs)
    if h.smoke_modules is None and not bs:
        mods = path_modules(paths)
    if not paths and not mods:
        raise SmokeFailedError(
            f"{h.name}: nothing to smoke-test: no deploy record on the host, no --build and no smoke_modules "
            "(0 files compiled, 0 modules imported would prove nothing)",
            hint=f"ddtree-deploy smoke {h.name} --build DIR   (or push / rollout first)",
        )
    return hc.run_agent(
        {
            "op": "smoke",
            "site_packages": h.site_packages,
            "package": bs.package if bs else "sglang",
            "compile": paths,
            "modules": mods,
            "run": smoke_run(h, bs, mods),
            "timeout": h.smoke_timeout,
        },
        on_event=on_event,
        cancel=cancel,
        timeout=h.smoke_timeout * 2 + 60,
    )


def record_check(hc: HostConnection, package: str = "sglang") -> dict[str, Any]:
    """Every file of the installed package's ``RECORD`` hashed against it on the host (the drift
    check of a pip-installed environment: production's untouched SGLang matches it byte for byte)."""
    h = hc.host
    return hc.run_agent({"op": "record_check", "package": package, "site_packages": h.site_packages}, timeout=300)


def record_verdict(rec: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """The RECORD check against our own deploy records: which differing files our live deploys
    explain, and which nothing explains (drift)."""
    ours = {f["path"] for r in records if r.get("status") in APPLIED for f in r.get("files", [])}
    differ = [m["path"] for m in rec.get("mismatched", [])] + list(rec.get("missing", []))
    unexplained = [p for p in differ if p not in ours]
    return {
        "dist_info": rec.get("dist_info"),
        "version": rec.get("version"),
        "files": rec.get("files", 0),
        "matched": rec.get("matched", 0),
        "differ": differ,
        "explained_by_deploys": [p for p in differ if p in ours],
        "unexplained": unexplained,
        "intact": bool(rec.get("ok")),
        "note": rec.get("note"),
    }


def status(hc: HostConnection, bs: BuildSet | None) -> dict[str, Any]:
    """Per file: pristine / patched (series) / unknown (drifted); the RECORD check; lock and last deploy."""
    paths = [f.path for f in bs.files] if bs else []
    pr0 = probe(hc, paths, package=bs.package if bs else "sglang")
    records = pr0.get("records", [])
    extra = [p for r in records for p in [f["path"] for f in r.get("files", [])] if p not in paths]
    extra = list(dict.fromkeys(extra))
    pr = probe(hc, paths + extra, package=bs.package if bs else "sglang") if extra else pr0
    ours = _ours(records)
    before: dict[str, str | None] = {}
    for r in records:  # the oldest record says what the file was before we ever touched it
        for f in r.get("files", []):
            before.setdefault(f["path"], f.get("before_sha256"))
    files = []
    by_path = {f.path: f for f in bs.files} if bs else {}
    for p in paths + extra:
        cur = pr["files"][p].get("sha256")
        f = by_path.get(p)
        if f is not None:
            state, series = classify(f, cur, ours)
            if state == "patched":
                series = bs.series_id  # type: ignore[union-attr]
            if state == "drifted":
                state = "unknown"
            elif state == "ours":  # an earlier series of ours
                state = "patched"
        else:
            if (p, cur) in ours:
                state, series = "patched", ours[(p, cur)]
            elif p in before and cur == before[p]:
                state, series = "pristine", None
            else:
                state, series = "unknown", None
        files.append({"path": p, "state": state, "series": series, "sha256": cur})
    last = next((r for r in reversed(records) if r.get("op") == "push"), None)
    stuck = [r["deploy_id"] for r in records if r.get("status") in INTERRUPTED]
    return {
        "host": hc.host.name,
        "site_packages": pr["site_packages"],
        "package_version": pr.get("package_version"),
        "python_version": pr.get("python_version"),
        "lock": pr.get("lock"),
        "files": files,
        "last_deploy": {k: last.get(k) for k in ("deploy_id", "status", "series_id", "who", "started", "finished", "failure")}
        if last
        else None,
        "interrupted": stuck,
        "needs_human": [r["deploy_id"] for r in records if r.get("status") == NEEDS_HUMAN],
        "applied": [r["deploy_id"] for r in records if r.get("status") in APPLIED],
        "record": record_verdict(record_check(hc, bs.package if bs else "sglang"), records),
    }


def audit_service_step(hc: HostConnection, *, after: str, deploy_id: str | None, why: str | None, result: str) -> None:
    """The restart + health check's outcome, as one line in the host's audit log."""
    h = hc.host
    hc.run_agent(
        {
            "op": "audit",
            "entry_op": "restart",
            "state_dir": h.state_dir,
            "after": after,
            "deploy_id": deploy_id,
            "who": whoami(),
            "why": why,
            "result": result,
            "health_url": h.health_url,
        },
        timeout=60,
    )


def history(hc: HostConnection, limit: int | None = None) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = hc.run_agent({"op": "history", "state_dir": hc.host.state_dir, "limit": limit}, timeout=60)[
        "entries"
    ]
    return entries


def lock_status(hc: HostConnection) -> dict[str, Any] | None:
    lock: dict[str, Any] | None = hc.run_agent({"op": "lock_status", "state_dir": hc.host.state_dir}, timeout=60)["lock"]
    return lock


def lock_release(hc: HostConnection, *, dry_run: bool = False) -> dict[str, Any]:
    return hc.run_agent({"op": "lock_release", "state_dir": hc.host.state_dir, "who": whoami(), "dry_run": dry_run}, timeout=60)
