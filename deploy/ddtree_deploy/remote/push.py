"""The per-host pipelines behind ``push``, ``smoke``, ``rollback``, ``status``, ``history``, ``lock``."""

from __future__ import annotations

import difflib
import shlex
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ddtree_deploy.errors import (
    DDTreeDeployError,
    ExitCode,
    Interrupted,
    RemoteError,
    RolledBackError,
    SmokeFailedError,
    UsageError,
)
from ddtree_deploy.remote import hostops
from ddtree_deploy.remote.connection import HostConnection
from ddtree_deploy.remote.fleet import HostResult, Pipeline, Reporter
from ddtree_deploy.remote.hostops import BuildSet
from ddtree_deploy.remote.inventory import HostConfig

PHASES = {"receiving": 35, "backup": 45, "staging": 55, "commit": 65, "compile": 75, "smoke": 85, "restore": 90}


@dataclass
class PushOptions:
    dry_run: bool = False
    accept_new_host_key: bool = False
    restart: bool = False
    no_rollback: bool = False
    why: str | None = None


def _connect(h: HostConfig, report: Reporter, accept_new: bool, cancel: threading.Event | None = None) -> HostConnection:
    report.phase(h.name, "connecting", 5)
    hc = HostConnection(h, accept_new_host_key=accept_new, connect_timeout=h.connect_timeout).open(cancel)
    if hc.new_host_key:
        report.note(h.name, f"recorded new host key {hc.new_host_key} in {h.known_hosts_path}")
    return hc


def _event_cb(h: HostConfig, report: Reporter) -> Callable[[dict[str, Any]], None]:
    def cb(ev: dict[str, Any]) -> None:
        ph = ev.get("phase", "")
        if ph == "test-hook":
            return
        report.phase(h.name, ph, PHASES.get(ph))

    return cb


def file_diff(fp: hostops.FilePlan, new: bytes | None) -> str:
    old = fp.content
    if fp.current_sha256 is None:
        old_lines: list[str] = []
    elif old is None:
        return f"--- {fp.path} (on host: {fp.current_sha256}, not shown)\n"
    else:
        old_lines = old.decode("utf-8", "replace").splitlines(keepends=True)
    new_lines = [] if new is None else new.decode("utf-8", "replace").splitlines(keepends=True)
    a = f"a/{fp.path}" if fp.current_sha256 else "/dev/null"
    b = f"b/{fp.path}" if new is not None else "/dev/null"
    return "".join(difflib.unified_diff(old_lines, new_lines, a, b))


def _sent_counts(send: list[hostops.FilePlan], nbytes: int) -> tuple[int, int]:
    """(files, bytes) of the payload that went out: a file counts once all of its bytes did."""
    files, total = 0, 0
    for fp in send:
        if total + fp.size > nbytes:
            break
        total += fp.size
        files += 1
    return files, nbytes


def _interrupted(h: HostConfig, deploy_id: str, exc: DDTreeDeployError) -> Interrupted:
    return Interrupted(
        f"{h.name}: interrupted during deploy {deploy_id}; a partial upload is discarded by the host, a "
        f"complete one finishes (or rolls back) on its own and is recorded",
        hint=f"ddtree-deploy status {h.name}",
        details={**exc.details, "deploy_id": deploy_id},
    )


def push_pipeline(bs: BuildSet, opts: PushOptions) -> Pipeline:
    def run(h: HostConfig, report: Reporter, cancel: threading.Event) -> HostResult:
        refuse_side_by_side(h, "push")
        if opts.restart and not h.restart_command:
            raise UsageError(
                f"{h.name}: --restart, but the inventory has no restart_command for this host",
                hint=f"add restart_command (and health_url) to [hosts.{h.name}], or drop --restart",
            )
        hc = _connect(h, report, opts.accept_new_host_key, cancel)
        try:
            report.phase(h.name, "preflight", 15)
            plan = hostops.preflight(hc, bs, dry_run=opts.dry_run)
            send = plan.to_send
            files = [{"path": f.path, "state": f.state, "action": f.action, "send": f.send} for f in plan.files]
            if opts.dry_run:
                hostops.with_contents(hc, plan, bs)
                by_path = {f.path: f for f in bs.files}
                diffs = {fp.path: file_diff(fp, by_path[fp.path].data) for fp in send}
                lock = plan.probe.get("lock")
                msg = f"would change {len(send)} file(s) ({plan.bytes_to_send} bytes); wrote nothing"
                if lock:
                    msg += f"; NOTE: the deploy lock is held by {lock.get('who')} ({lock.get('deploy_id')})"
                return HostResult(
                    h.name, True, "would-change" if send else "unchanged", ExitCode.OK, msg, data={"files": files, "diffs": diffs}
                )
            if not send:
                return HostResult(
                    h.name,
                    True,
                    "unchanged",
                    ExitCode.OK,
                    f"already patched with {bs.series_id}: nothing to send",
                    data={"files": files, "wire_bytes": hc.bytes_sent},
                )
            deploy_id = hostops.new_deploy_id()
            sent = [0]

            def on_sent(n: int) -> None:
                sent[0] += n
                total = max(1, plan.bytes_to_send)
                report.phase(h.name, f"uploading {sent[0]}/{total} bytes", 20 + 15 * sent[0] / total)

            report.phase(h.name, "uploading", 20)
            try:
                rec = hostops.apply(
                    hc, bs, plan, deploy_id=deploy_id, why=opts.why, on_event=_event_cb(h, report), on_sent=on_sent, cancel=cancel
                )
            except DDTreeDeployError as exc:  # every outcome says what went over the wire
                exc.details["files_sent"], exc.details["bytes_sent"] = _sent_counts(send, sent[0])
                if isinstance(exc, Interrupted):
                    raise _interrupted(h, deploy_id, exc) from None
                if isinstance(exc, RemoteError):
                    exc.details.setdefault("deploy_id", deploy_id)
                    if exc.details.get("connection_lost"):
                        exc.hint = exc.hint or (
                            f"check, then undo if needed: ddtree-deploy status {h.name}; ddtree-deploy rollback {h.name}"
                        )
                raise
            result = HostResult(
                h.name,
                True,
                "deployed",
                ExitCode.OK,
                f"deployed {bs.series_id}: {len(send)} file(s), compile + smoke ok",
                deploy_id=deploy_id,
                files_sent=len(send),
                bytes_sent=plan.bytes_to_send,
                data={"files": files, "checks": rec.get("checks"), "wire_bytes": hc.bytes_sent},
            )
            if opts.restart:
                try:
                    _service_step(hc, bs, deploy_id, opts, report, cancel)
                except DDTreeDeployError as exc:
                    exc.details["files_sent"], exc.details["bytes_sent"] = len(send), plan.bytes_to_send
                    raise
                result.message += "; restarted, healthy"
            return result
        finally:
            hc.close()

    return run


HEALTH_SRC = r"""
import sys, time, urllib.request
url, timeout = sys.argv[1], float(sys.argv[2])
deadline = time.time() + timeout
last = "no attempt"
while time.time() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            if 200 <= r.status < 300:
                print("healthy"); sys.exit(0)
            last = "HTTP %d" % r.status
    except Exception as e:
        last = "%s: %s" % (type(e).__name__, e)
    time.sleep(1)
print("unhealthy: " + last); sys.exit(1)
"""


def refuse_side_by_side(h: HostConfig, command: str) -> None:
    """A side-by-side host is installed by ``rollout`` (a wheel in its own venv), never patched in place."""
    if h.is_side_by_side:
        raise UsageError(
            f"{h.name} is a side-by-side host (a venv beside {h.side_by_side_of}): `{command}` patches files in place, "
            "which is not how that venv is installed",
            hint=f"ddtree-deploy rollout {h.name}   (--pristine installs the pinned wheel there; --remove deletes the venv)",
        )


def refuse_serving(h: HostConfig, command: str) -> None:
    """A host that serves traffic is never patched in place unless its entry opts in."""
    if not h.in_place_refused:
        return
    why = (
        f"{', '.join(h.side_by_side_entries)} sits beside it, side_by_side_of = {h.name!r}"
        if h.side_by_side_entries
        else "its inventory entry says serving = true"
    )
    fix = (
        f"ddtree-deploy rollout {h.side_by_side_entries[0]}   (DDTree in its own venv beside production)"
        if h.side_by_side_entries
        else f"ddtree-deploy rollout {h.name}-ddtree   "
        f"(after adding a [hosts.{h.name}-ddtree] entry with side_by_side_of = {h.name!r})"
    )
    raise UsageError(
        f"{h.name} serves traffic ({why}): `{command}` would patch its live SGLang in place. "
        f"To do that on purpose, set allow_in_place = true in [hosts.{h.name}]",
        hint=fix,
    )


def service_step(hc: HostConnection, report: Reporter, *, after: str, deploy_id: str | None, why: str | None) -> tuple[bool, str]:
    """``restart_command``, then ``health_url`` polled from the host until 2xx, audited on the host."""
    ok, reason = _restart(hc, report)
    try:
        hostops.audit_service_step(hc, after=after, deploy_id=deploy_id, why=why, result="healthy" if ok else reason[:500])
    except DDTreeDeployError as exc:
        reason += f" (and its audit line was not written: {exc.message})"
    return ok, reason


def _restart(hc: HostConnection, report: Reporter) -> tuple[bool, str]:
    h = hc.host
    if not h.restart_command:
        return False, "no restart_command in the inventory"
    report.phase(h.name, "restarting", 92)
    assert hc.conn is not None
    r = hc.conn.run(h.restart_command, hide=True, warn=True, timeout=int(h.health_timeout) + 60, in_stream=False)
    if r.failed:
        return False, f"restart_command exited {r.exited}: {(r.stderr or r.stdout).strip()[-500:]}"
    if h.health_url:
        report.phase(h.name, "waiting for health", 95)
        cmd = f"{shlex.quote(h.python)} -c {shlex.quote(HEALTH_SRC)} {shlex.quote(h.health_url)} {h.health_timeout:g}"
        r = hc.conn.run(cmd, hide=True, warn=True, timeout=int(h.health_timeout) + 30, in_stream=False)
        if r.failed:
            return False, f"health check {h.health_url} failed: {r.stdout.strip()[-300:]}"
    return True, "ok"


def _service_step(
    hc: HostConnection, bs: BuildSet, deploy_id: str, opts: PushOptions, report: Reporter, cancel: threading.Event
) -> None:
    h = hc.host
    ok, why = service_step(hc, report, after="push", deploy_id=deploy_id, why=opts.why)
    if ok:
        report.phase(h.name, "smoke (after restart)", 97)
        chk = hostops.smoke(hc, bs, cancel=cancel)["checks"]
        if not chk.get("ok"):
            ok, why = False, f"smoke after restart failed ({chk.get('failed_step')}): {chk.get('output_tail', '')[-300:]}"
    if ok:
        return
    if opts.no_rollback:
        raise SmokeFailedError(
            f"{h.name}: {why}; left deployed ({deploy_id}) because of --no-rollback",
            hint=f"ddtree-deploy rollback {h.name}",
            details={"deploy_id": deploy_id},
        )
    report.phase(h.name, "rolling back", 98)
    hostops.rollback(hc, to=None, why=f"service step failed: {why}", expect_latest=deploy_id)
    ok2, why2 = service_step(hc, report, after="rollback", deploy_id=deploy_id, why=f"service step failed: {why}")
    raise RolledBackError(
        f"{h.name}: {why}; rolled back {deploy_id} (verified)"
        + ("" if ok2 else f"; the restart after rollback ALSO failed: {why2}"),
        hint=f"ddtree-deploy status {h.name}",
        details={"deploy_id": deploy_id},
    )


def smoke_pipeline(bs: BuildSet | None, accept_new: bool = False) -> Pipeline:
    def run(h: HostConfig, report: Reporter, cancel: threading.Event) -> HostResult:
        with _connect(h, report, accept_new, cancel) as hc:
            report.phase(h.name, "smoke", 30)
            res = hostops.smoke(hc, bs, on_event=_event_cb(h, report), cancel=cancel)
            chk = res["checks"]
            if not chk.get("ok"):
                raise SmokeFailedError(
                    f"{h.name}: {chk.get('failed_step')} failed on the host (nothing was changed):\n"
                    + chk.get("output_tail", "")[-1500:],
                    hint=f"ddtree-deploy rollback {h.name}",
                    details={"checks": chk},
                )
            return HostResult(
                h.name,
                True,
                "smoke-ok",
                ExitCode.OK,
                f"compiled {chk['compiled']} file(s), imported {len(chk['modules'])} module(s)"
                + (f", ran {', '.join(chk['run'])}" if chk.get("run") else ""),
                data={"checks": chk, "import_check": res.get("import_check")},
            )

    return run


NOT_RESTARTED = (
    "; the service was NOT restarted: it keeps running the code it loaded until it restarts "
    "(rerun with --restart, or restart it yourself)"
)


def rollback_pipeline(
    to: str | None,
    accept_new: bool = False,
    why: str | None = None,
    *,
    dry_run: bool = False,
    force: bool = False,
    restart: bool = False,
) -> Pipeline:
    def run(h: HostConfig, report: Reporter, cancel: threading.Event) -> HostResult:
        refuse_side_by_side(h, "rollback")
        if restart and not h.restart_command:
            raise UsageError(
                f"{h.name}: --restart, but the inventory has no restart_command for this host",
                hint=f"add restart_command (and health_url) to [hosts.{h.name}], or drop --restart",
            )
        with _connect(h, report, accept_new, cancel) as hc:
            report.phase(h.name, "rolling back" if not dry_run else "checking the rollback", 30)
            res = hostops.rollback(hc, to=to, why=why, dry_run=dry_run, force=force, on_event=_event_cb(h, report), cancel=cancel)
            if dry_run:
                return _rollback_dry_run_result(h, res, restart)
            undone = res.get("undone", [])
            if not undone:
                result = HostResult(h.name, True, "unchanged", ExitCode.OK, res.get("note", "nothing to roll back"), data=res)
            else:
                ids = ", ".join(u["deploy_id"] for u in undone)
                n = sum(len(u["files"]) for u in undone)
                msg = f"undid {ids}: {n} file(s) restored and verified"
                if res.get("kept"):
                    msg += f"; kept {len(res['kept'])} host-edited file(s) under {h.state_dir}/edited/"
                result = HostResult(
                    h.name, True, "rolled-back", ExitCode.OK, msg, deploy_id=undone[0]["deploy_id"], files_sent=0, data=res
                )
            if restart:
                ok, reason = service_step(hc, report, after="rollback", deploy_id=result.deploy_id, why=why)
                result.data["restart"] = {"ok": ok, "result": "healthy" if ok else reason}
                if not ok:
                    raise SmokeFailedError(
                        f"{h.name}: {result.message}; then {reason}: the files are as the rollback left them, "
                        "the service is not healthy",
                        hint=f"look at the service on {h.name} (its logs); ddtree-deploy status {h.name}",
                        details={"deploy_id": result.deploy_id, "rollback": res, "restart_failed": reason},
                    )
                result.message += "; restarted, healthy" if h.health_url else "; restarted (no health_url to check)"
            elif undone and h.restart_command:
                result.message += NOT_RESTARTED
                result.data["restart"] = None
            return result

    return run


def _rollback_dry_run_result(h: HostConfig, res: dict[str, Any], restart: bool) -> HostResult:
    steps = res.get("would_undo", [])
    then = "; then would run restart_command and wait for health_url" if restart else ""
    if not steps:
        return HostResult(h.name, True, "unchanged", ExitCode.OK, "nothing to roll back (dry run)" + then, data=res)
    n = sum(1 for s in steps for f in s["files"] if f["write"])
    problems = []
    if res.get("broken_backups"):
        problems.append(f"{len(res['broken_backups'])} broken backup(s): " + ", ".join(b["path"] for b in res["broken_backups"]))
    if res.get("edited"):
        problems.append(
            f"{len(res['edited'])} file(s) edited on the host (needs --force): " + ", ".join(e["path"] for e in res["edited"])
        )
    msg = f"would undo {', '.join(s['deploy_id'] for s in steps)}: {n} file(s) to restore{then}; wrote nothing" + (
        "; WOULD BE REFUSED: " + "; ".join(problems) if problems else ""
    )
    return HostResult(h.name, True, "would-roll-back", ExitCode.OK, msg, deploy_id=steps[0]["deploy_id"], data=res)


def status_pipeline(bs: BuildSet | None, accept_new: bool = False) -> Pipeline:
    def run(h: HostConfig, report: Reporter, cancel: threading.Event) -> HostResult:
        with _connect(h, report, accept_new, cancel) as hc:
            report.phase(h.name, "status", 50)
            st = hostops.status(hc, bs)
            counts: dict[str, int] = {}
            for f in st["files"]:
                counts[f["state"]] = counts.get(f["state"], 0) + 1
            summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no tracked files"
            if st["interrupted"]:
                summary += f"; INTERRUPTED deploy {st['interrupted'][-1]}: run rollback"
            if st["needs_human"]:
                summary += f"; deploy {st['needs_human'][-1]} NEEDS A HUMAN (restore failed)"
            if st["lock"]:
                summary += f"; locked by {st['lock'].get('who')} ({st['lock'].get('deploy_id')})"
            rec = st["record"]
            summary += "; " + record_phrase(rec)
            ok = not st["interrupted"] and not st["needs_human"] and not counts.get("unknown") and not rec["unexplained"]
            return HostResult(h.name, True, "ok" if ok else "attention", ExitCode.OK, summary, data=st)

    return run


def record_phrase(rec: dict[str, Any]) -> str:
    """The RECORD check in words (``status``): untouched, or how many files differ and why."""
    if not rec.get("dist_info"):
        return f"RECORD: {rec.get('note') or 'no dist-info'}"
    if rec["intact"]:
        return f"RECORD: all {rec['files']} files match {rec['dist_info']} (untouched)"
    return (
        f"RECORD: {len(rec['differ'])} of {rec['files']} files differ from {rec['dist_info']} "
        f"({len(rec['explained_by_deploys'])} by our deploys, {len(rec['unexplained'])} unexplained)"
    )


def history_pipeline(limit: int | None, accept_new: bool = False) -> Pipeline:
    def run(h: HostConfig, report: Reporter, cancel: threading.Event) -> HostResult:
        with _connect(h, report, accept_new, cancel) as hc:
            entries = hostops.history(hc, limit)
            return HostResult(h.name, True, "ok", ExitCode.OK, f"{len(entries)} entries", data={"entries": entries})

    return run


def lock_pipeline(action: str, accept_new: bool = False, *, dry_run: bool = False) -> Pipeline:
    def run(h: HostConfig, report: Reporter, cancel: threading.Event) -> HostResult:
        with _connect(h, report, accept_new, cancel) as hc:
            if action == "status":
                lk = hostops.lock_status(hc)
                if not lk:
                    return HostResult(h.name, True, "free", ExitCode.OK, "no deploy lock held", data={"lock": None})
                alive = {True: "alive", False: "its process is GONE", None: "liveness unknown"}[lk.get("alive")]
                return HostResult(
                    h.name,
                    True,
                    "held",
                    ExitCode.OK,
                    f"held by {lk.get('who')} since {lk.get('when')} ({lk.get('op')} {lk.get('deploy_id')}, "
                    f"why: {lk.get('why') or '-'}; {alive})",
                    data={"lock": lk},
                )
            res = hostops.lock_release(hc, dry_run=dry_run)
            if res.get("would_release"):
                holder = res.get("holder") or {}
                return HostResult(
                    h.name,
                    True,
                    "would-release",
                    ExitCode.OK,
                    f"would release the lock of {holder.get('who')} ({holder.get('op')} "
                    f"{holder.get('deploy_id')}, since {holder.get('when')}); wrote nothing",
                    data=res,
                )
            if not res.get("released"):
                return HostResult(h.name, True, "free", ExitCode.OK, "no deploy lock was held", data=res)
            holder = res.get("holder") or {}
            return HostResult(
                h.name,
                True,
                "released",
                ExitCode.OK,
                f"released the lock of {holder.get('who')} ({holder.get('deploy_id')})",
                data=res,
            )

    return run
