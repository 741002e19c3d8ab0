"""The side-by-side rollout (``ddtree-deploy rollout``): DDTree in a venv beside production, never in it.

A side-by-side host in the inventory (``side_by_side_of = "ct129"``, ``venv = "/opt/sglang-ddtree/venv"``)
is a second environment on the production host's machine. ``rollout`` connects with the production
interpreter (it only reads production), checks production (pinned version, its RECORD), then has the
host-side half (``agent_venv.py``) make the venv from production's base interpreter, layered on
production's site-packages, ``pip install`` the locally versioned wheel (``build --wheel``) into it
with its hash, verify its RECORD, smoke it with the venv's interpreter and check production's RECORD
again. Then the host's ``restart_command`` starts the DDTREE server on its own port and GPUs, and
``health_url`` is polled (audited like ``push --restart``). ``--pristine`` installs the pinned wheel
itself there (an A/B baseline in the same environment, "rollback = reinstall the pin"); ``--remove``
runs ``stop_command`` and deletes the venv (only one this tool made).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_deploy.errors import ExitCode, HostRefusedError, LockHeldError, SmokeFailedError, UsageError
from ddtree_deploy.hashing import sha256_file
from ddtree_deploy.remote import hostops
from ddtree_deploy.remote.connection import HostConnection
from ddtree_deploy.remote.fleet import HostResult, Pipeline, Reporter
from ddtree_deploy.remote.hostops import BuildSet
from ddtree_deploy.remote.inventory import HostConfig

FREE_MARGIN = 64 << 20  # beyond the installed package (about 3x the wheel)


@dataclass(frozen=True)
class WheelFile:
    path: Path
    filename: str
    sha256: str
    version: str

    @property
    def size(self) -> int:
        return self.path.stat().st_size


@dataclass
class RolloutOptions:
    dry_run: bool = False
    accept_new_host_key: bool = False
    start: bool = True
    why: str | None = None
    pristine: bool = False


@dataclass
class Wheels:
    """The wheel each host gets, by the host's Python (``cp311``...): the build's own wheel when it
    has one for that Python, else made from the build and the pinned wheel into ``work`` (once per
    Python, shared by the host threads). With ``pristine`` the pinned wheel itself."""

    bs: BuildSet | None  # None with ``pristine``
    work: Path
    pristine: bool = False
    _made: dict[str, WheelFile] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def version(self) -> str:
        """The pinned version production must run (the venv reuses its other packages)."""
        return self.bs.version if self.bs is not None else self._pin().version

    def _pin(self) -> Any:
        from ddtree_deploy.paths import default_pin_path
        from ddtree_deploy.pin.pin import load_pin

        return load_pin(default_pin_path(self.bs.version) if self.bs is not None else default_pin_path())

    def for_python(self, python_version: str) -> WheelFile:
        major_minor = ".".join(python_version.split(".")[:2])
        tag = "cp" + major_minor.replace(".", "")
        with self._lock:
            if tag not in self._made:
                self._made[tag] = self._make(major_minor, tag)
            return self._made[tag]

    def _make(self, major_minor: str, tag: str) -> WheelFile:
        from ddtree_deploy.build.manifest import Manifest
        from ddtree_deploy.build.wheel import local_version, make_wheel, verify_wheel_file
        from ddtree_deploy.pin import snapshot

        pin = self._pin()
        if self.pristine or self.bs is None:
            path = snapshot.pinned_wheel_file(pin, major_minor)
            return WheelFile(path, path.name, sha256_file(path), pin.version)
        manifest = Manifest.load(self.bs.dir)
        version = local_version(manifest)
        own = sorted(self.bs.dir.glob(f"{self.bs.package}-{version}-{tag}-*.whl"))
        if own:  # the build's own wheel (build --wheel), checked against the build's manifest
            info = verify_wheel_file(own[0], manifest)
            return WheelFile(info.path, info.filename, info.sha256, version)
        pinned = snapshot.pinned_wheel_file(pin, major_minor)
        made = make_wheel(self.bs.dir, pinned, self.work / tag)
        return WheelFile(made.path, made.filename, made.sha256, made.version)


def agent_connection(h: HostConfig, accept_new: bool) -> HostConnection:
    """A connection whose agent runs under the PRODUCTION interpreter (the venv may not exist yet)."""
    if h.production is None:
        raise UsageError(f"{h.name} is not a side-by-side host", hint=side_by_side_hint(h))
    return HostConnection(h, accept_new_host_key=accept_new, connect_timeout=h.connect_timeout, agent_python=h.production.python)


def side_by_side_hint(h: HostConfig) -> str:
    return (
        f'add a side-by-side host to the inventory: [hosts.{h.name}-ddtree] with side_by_side_of = "{h.name}" and '
        f'venv = "/opt/sglang-ddtree/venv" (see docs/deploy.md, "Side-by-side rollout"); or, on a dedicated eval host, '
        f"ddtree-deploy push {h.name}"
    )


def _request(h: HostConfig, action: str, **extra: Any) -> dict[str, Any]:
    assert h.production is not None
    req = {
        "op": "side_by_side",
        "action": action,
        "package": "sglang",
        "host": h.name,
        "side_by_side_of": h.side_by_side_of,
        "production_site": h.production.site_packages,
        "venv": h.venv,
        "state_dir": h.state_dir,
        "who": hostops.whoami(),
        "user": hostops.whoami().split("@")[0],
    }
    req.update(extra)
    return req


def probe(hc: HostConnection) -> dict[str, Any]:
    return hc.run_agent(_request(hc.host, "probe"), timeout=300)


def preflight(h: HostConfig, pr: dict[str, Any], version: str, wheel_size: int) -> None:
    """Everything checked before the first write; raises ``HostRefusedError`` / ``LockHeldError``."""
    if pr["problems"]:
        raise HostRefusedError(f"{h.name}: " + "; ".join(pr["problems"]), hint=f"fix venv for [hosts.{h.name}] in the inventory")
    if pr["package_version"] != version:
        raise HostRefusedError(
            f"{h.name}: production ({pr['production_site']}) has sglang {pr['package_version'] or 'not installed'}; "
            f"the side-by-side venv reuses its other packages, which are those of sglang {version}",
            hint=f"the rollout needs production on the pinned sglang=={version}",
        )
    if pr["venv_state"] == "foreign":
        raise HostRefusedError(
            f"{h.name}: {pr['venv']} exists and was not made by ddtree-deploy; refusing to touch it",
            hint=f"choose another venv for [hosts.{h.name}] in the inventory, or move that directory away",
        )
    if not pr["pip"] and not pr["ensurepip"]:
        raise HostRefusedError(
            f"{h.name}: neither pip nor ensurepip is importable by {pr['production_python']}: nothing can install the wheel",
            hint="install pip for that interpreter's base Python (e.g. the python3-venv / python3-pip package)",
        )
    if not pr["venv_parent_writable"]:
        raise HostRefusedError(
            f"{h.name}: cannot create {pr['venv']} (its parent directory is not writable)",
            hint="create the parent directory for the SSH user, or choose another venv path",
        )
    need = 4 * wheel_size + FREE_MARGIN
    if pr["free_bytes"] is not None and pr["free_bytes"] < need:
        raise HostRefusedError(
            f"{h.name}: not enough free disk for the venv ({pr['free_bytes']} bytes free, need {need})",
            hint="free some space on the host",
        )
    lock = pr.get("lock")
    if lock:
        raise LockHeldError(
            f"{h.name}: the side-by-side deploy lock is held by {lock.get('who')} ({lock.get('op')} {lock.get('deploy_id')})",
            hint=f"wait, or if you are sure it is dead: ddtree-deploy lock release {h.name}",
            details={"holder": lock},
        )


def _record_words(rec: dict[str, Any]) -> str:
    if rec.get("ok"):
        return f"all {rec['files']} files match {rec['dist_info']}"
    return f"{rec.get('matched', 0)} of {rec.get('files', 0)} files match {rec.get('dist_info') or '(no dist-info)'}"


def rollout_pipeline(wheels: Wheels, opts: RolloutOptions) -> Pipeline:
    from ddtree_deploy.remote.push import service_step

    def run(h: HostConfig, report: Reporter, cancel: threading.Event) -> HostResult:
        if not h.is_side_by_side:
            raise UsageError(f"{h.name} is not a side-by-side host (it has no side_by_side_of)", hint=side_by_side_hint(h))
        if opts.start and not opts.dry_run and not h.restart_command:
            raise UsageError(
                f"{h.name}: no restart_command to start the side-by-side server with",
                hint=f"add restart_command and health_url to [hosts.{h.name}] (its own port and GPUs), or pass --no-start",
            )
        report.phase(h.name, "connecting", 5)
        with agent_connection(h, opts.accept_new_host_key).open(cancel) as hc:
            report.phase(h.name, "preflight", 15)
            pr = probe(hc)
            wheel = wheels.for_python(pr["python_version"])
            preflight(h, pr, wheels.version, wheel.size)
            prod = f"production {pr['production_site']}: {_record_words(pr['record'])}"
            if opts.dry_run:
                verb = "replace" if pr["venv_state"] == "ours" else "make"
                start = "; then restart_command + health_url" if opts.start and h.restart_command else ""
                return HostResult(
                    h.name,
                    True,
                    "would-install",
                    ExitCode.OK,
                    f"would {verb} {pr['venv']} and pip install {wheel.filename} (sha256 {wheel.sha256[:16]}...){start}; "
                    f"{prod}; wrote nothing",
                    data={"probe": pr, "wheel": wheel.filename, "sha256": wheel.sha256},
                )
            deploy_id = hostops.new_deploy_id()
            sent = [0]

            def on_sent(n: int) -> None:
                sent[0] += n
                report.phase(h.name, f"uploading {sent[0]}/{wheel.size} bytes", 20 + 20 * sent[0] / max(1, wheel.size))

            smoke: dict[str, Any] = {"compile": [], "modules": [], "run": [], "timeout": h.smoke_timeout}
            if wheels.bs is not None and not opts.pristine:  # the pinned wheel: its RECORD and import check do
                smoke.update(
                    compile=wheels.bs.compile_paths(),
                    modules=hostops.smoke_modules(h, wheels.bs),
                    run=hostops.smoke_run(h, wheels.bs),
                )
            req = _request(
                h,
                "install",
                deploy_id=deploy_id,
                why=opts.why,
                series_id=None if wheels.bs is None or opts.pristine else wheels.bs.series_id,
                wheel={"filename": wheel.filename, "sha256": wheel.sha256, "size": wheel.size, "version": wheel.version},
                smoke=smoke,
            )
            res = hc.run_agent(
                req,
                [wheel.path.read_bytes()],
                on_event=lambda ev: report.phase(h.name, str(ev.get("phase", "")), None),
                on_sent=on_sent,
                cancel=cancel,
                timeout=h.smoke_timeout * 2 + 1200,
            )
            p = res["production"]
            result = HostResult(
                h.name,
                True,
                "rolled-out",
                ExitCode.OK,
                f"installed sglang {res['version']} in {res['venv']} (RECORD: {_record_words(res['record'])}; smoke ok); "
                f"production {p['site_packages']} untouched ({_record_words(p['record_after'])}, as before)",
                deploy_id=deploy_id,
                files_sent=1,
                bytes_sent=wheel.size,
                data=res,
            )
            if not opts.start or not h.restart_command:
                result.message += "; server not started (--no-start)"
                return result
            ok, reason = service_step(hc, report, after="rollout", deploy_id=deploy_id, why=opts.why)
        result.data["restart"] = {"ok": ok, "result": "healthy" if ok else reason}
        if not ok:
            raise SmokeFailedError(
                f"{h.name}: {result.message}; but its server: {reason} (the venv is kept; production untouched)",
                hint=f"look at the side-by-side server's log on the host; ddtree-deploy rollout {h.name} --remove undoes it",
                details={"deploy_id": deploy_id, "rollout": res, "restart_failed": reason},
            )
        result.message += f"; server healthy at {h.health_url}" if h.health_url else "; server started (no health_url)"
        return result

    return run


def remove_pipeline(opts: RolloutOptions) -> Pipeline:
    def run(h: HostConfig, report: Reporter, cancel: threading.Event) -> HostResult:
        if not h.is_side_by_side:
            raise UsageError(f"{h.name} is not a side-by-side host (it has no side_by_side_of)", hint=side_by_side_hint(h))
        report.phase(h.name, "connecting", 5)
        with agent_connection(h, opts.accept_new_host_key).open(cancel) as hc:
            pr = probe(hc)
            if pr["venv_state"] == "absent":
                return HostResult(h.name, True, "unchanged", ExitCode.OK, f"no side-by-side venv at {pr['venv']}", data=pr)
            if pr["venv_state"] == "foreign":
                raise HostRefusedError(
                    f"{h.name}: {pr['venv']} was not made by ddtree-deploy; refusing to remove it",
                    hint="remove it by hand if it is yours",
                )
            if opts.dry_run:
                stop = f"run stop_command ({h.stop_command}), then " if h.stop_command else ""
                return HostResult(
                    h.name, True, "would-remove", ExitCode.OK, f"would {stop}remove {pr['venv']}; wrote nothing", data=pr
                )
            stopped = ""
            if h.stop_command:
                report.phase(h.name, "stopping its server", 40)
                assert hc.conn is not None
                r = hc.conn.run(h.stop_command, hide=True, warn=True, timeout=int(h.health_timeout) + 60, in_stream=False)
                if r.failed:
                    raise SmokeFailedError(
                        f"{h.name}: stop_command exited {r.exited}: {(r.stderr or r.stdout).strip()[-500:]}; the venv is kept",
                        hint=f"stop the side-by-side server by hand, then: ddtree-deploy rollout {h.name} --remove",
                    )
                stopped = "stopped its server, "
            report.phase(h.name, "removing", 70)
            res = hc.run_agent(_request(h, "remove", deploy_id=hostops.new_deploy_id(), why=opts.why), timeout=600, cancel=cancel)
            return HostResult(
                h.name,
                True,
                "removed",
                ExitCode.OK,
                f"{stopped}removed {res['venv']}; production untouched ({_record_words(pr['record'])})",
                data=res,
            )

    return run
