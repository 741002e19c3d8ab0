"""Many hosts at once: a thread per host, a progress line per host, a result table, ``--json``.

One host failing never stops or corrupts another: each host runs its own pipeline on its own SSH
connection and ends as one ``HostResult``. Ctrl-C sets a shared cancel event; each pipeline stops
at its next step (an upload that is cut short is discarded by the host before any write; a host
that already has the whole payload finishes, or rolls back, on its own and records it).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ddtree_deploy.cli.console import err, print_error
from ddtree_deploy.errors import EXIT_INTERRUPTED, DDTreeDeployError, ExitCode, PartialFailureError
from ddtree_deploy.remote.inventory import HostConfig


@dataclass
class HostResult:
    host: str
    ok: bool
    status: str  # deployed | unchanged | would-change | refused | rolled-back | failed | interrupted | ...
    exit_code: int = 0
    message: str = ""
    hint: str | None = None
    deploy_id: str | None = None
    files_sent: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# A failed host's status word, by the exit code its error maps to.
_ERROR_STATUS = {
    ExitCode.HOST_REFUSED: "refused", ExitCode.LOCK_HELD: "locked", ExitCode.ROLLED_BACK: "rolled-back",
    ExitCode.NEEDS_HUMAN: "NEEDS-HUMAN", ExitCode.SMOKE_FAILED: "smoke-failed", ExitCode.UNREACHABLE: "unreachable",
    ExitCode.INTERRUPTED: "interrupted", ExitCode.USAGE: "usage-error",
}


def result_from_error(host: str, exc: BaseException, t0: float) -> HostResult:
    if isinstance(exc, DDTreeDeployError):
        status = _ERROR_STATUS.get(exc.exit_code, "failed")
        return HostResult(host, False, status, exc.exit_code, exc.message, exc.hint,
                          deploy_id=exc.details.get("deploy_id"), seconds=time.monotonic() - t0,
                          files_sent=int(exc.details.get("files_sent") or 0),
                          bytes_sent=int(exc.details.get("bytes_sent") or 0),
                          error=exc.kind, data={k: v for k, v in exc.details.items() if k != "host"})
    return HostResult(host, False, "failed", 1, f"{host}: unexpected {type(exc).__name__}: {exc}", None,
                      seconds=time.monotonic() - t0, error=type(exc).__name__,
                      data={"traceback": traceback.format_exc()[-3000:]})


class UI:
    """Per-host progress lines on stderr (a live display on a terminal, plain lines otherwise)."""

    def __init__(self, hosts: list[str], *, title: str, quiet: bool = False):
        self.quiet = quiet
        self.live = err.is_terminal and not quiet
        self._lock = threading.Lock()
        self._last: dict[str, str] = {}
        self.progress: Progress | None = None
        self.tasks: dict[str, Any] = {}
        if self.live:
            self.progress = Progress(TextColumn("[bold]{task.fields[host]:<12}"), BarColumn(bar_width=20),
                                     TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                                     transient=False)
            for h in hosts:
                self.tasks[h] = self.progress.add_task("waiting", total=100, host=h)
        self.title = title

    def __enter__(self) -> "UI":
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress:
            self.progress.stop()

    def phase(self, host: str, text: str, pct: float | None = None) -> None:
        if self.quiet:
            return
        if self.progress:
            kw: dict[str, Any] = {"description": text}
            if pct is not None:
                kw["completed"] = pct
            self.progress.update(self.tasks[host], **kw)
            return
        key = text.split(" ")[0]  # plain lines: one per phase, not per progress tick
        with self._lock:
            if self._last.get(host) != key:
                self._last[host] = key
                err.print(f"{host}: {text}", markup=False, highlight=False)

    def note(self, host: str, text: str) -> None:
        if self.quiet:
            return
        if self.progress:
            self.progress.console.print(f"{host}: {text}", markup=False, highlight=False)
        else:
            err.print(f"{host}: {text}", markup=False, highlight=False)


Pipeline = Callable[[HostConfig, UI, threading.Event], HostResult]


def run_fleet(hosts: list[HostConfig], pipeline: Pipeline, *, title: str, quiet: bool = False,
              max_workers: int = 32) -> list[HostResult]:
    """Run ``pipeline`` for every host in parallel; return results in host order."""
    cancel = threading.Event()
    names = [h.name for h in hosts]
    results: dict[str, HostResult] = {}
    with UI(names, title=title, quiet=quiet) as ui:
        pool = cf.ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(hosts))), thread_name_prefix="host")

        def wrapped(h: HostConfig) -> HostResult:
            t0 = time.monotonic()
            try:
                r = pipeline(h, ui, cancel)
            except BaseException as exc:  # noqa: BLE001 (one host never takes the others down)
                r = result_from_error(h.name, exc, t0)
            r.seconds = round(time.monotonic() - t0, 3)
            ui.phase(h.name, f"{r.status}", 100)
            return r

        futs = {pool.submit(wrapped, h): h.name for h in hosts}
        try:
            pending = set(futs)
            while pending:
                done, pending = cf.wait(pending, timeout=0.1)
                for f in done:
                    results[futs[f]] = f.result()
        except KeyboardInterrupt:
            cancel.set()
            ui.note("*", "interrupted: stopping every host at its next step")
            cf.wait(list(futs), timeout=60)
            for f, name in futs.items():
                if f.done():
                    results[name] = f.result()
            pool.shutdown(wait=False)
            _print_table(title, [results[n] for n in names if n in results], quiet)
            raise
        pool.shutdown(wait=True)
    out = [results[n] for n in names]
    return out


def _print_table(title: str, results: list[HostResult], quiet: bool = False) -> None:
    if quiet or not results:
        return
    t = Table(title=title, show_lines=False)
    for col in ("host", "result", "files", "bytes", "time", "deploy id", "message"):
        t.add_column(col, overflow="fold")
    for r in results:
        style = "green" if r.ok else ("yellow" if r.exit_code in (6, 7, 8, 12, 13) else "red")
        msg = r.message.split("\n")[0]
        if r.message.startswith(r.host + ": "):
            msg = msg[len(r.host) + 2:]
        t.add_row(r.host, f"[{style}]{r.status}[/]", str(r.files_sent), str(r.bytes_sent), f"{r.seconds:.2f}s",
                  r.deploy_id or "", msg)
    err.print(t)


def finish(title: str, results: list[HostResult], *, json_mode: bool, quiet: bool = False,
           extra: dict[str, Any] | None = None, ok_code: int = 0) -> int:
    """Print the table (stderr) and the JSON (stdout); return the exit code (``ok_code`` when no
    host failed: ``status --strict`` uses it for hosts that answered but need attention)."""
    from ddtree_deploy.cli.console import out_json

    _print_table(title, results, quiet)
    failed = [r for r in results if not r.ok]
    if not failed:
        code = ok_code
    elif len(results) == 1:
        code = failed[0].exit_code
    else:
        code = PartialFailureError.exit_code
    if any(r.exit_code == EXIT_INTERRUPTED for r in failed):
        code = EXIT_INTERRUPTED
    for r in failed:
        print_error(r.message, r.hint)
    if len(results) > 1 and failed:
        err.print(f"{len(failed)} of {len(results)} hosts failed")
    if json_mode:
        doc = {"ok": not failed and not code, "exit_code": code, "hosts": [r.to_json() for r in results]}
        if extra:
            doc.update(extra)
        out_json(doc)
    return code
