"""How a fleet run looks: a progress line per host (a live display on a terminal, plain lines
otherwise), the result table, the errors and ``--json``. ``remote/`` reports through events and
returns a ``FleetResult``; everything drawn is drawn here."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ddtree_deploy.cli.console import Environment
from ddtree_deploy.errors import AttentionError, ExitCode, PartialFailureError, fleet_exit_code
from ddtree_deploy.remote.fleet import NOTE, FleetEvent, FleetInterrupted, FleetResult, HostResult, Pipeline, run_fleet
from ddtree_deploy.remote.inventory import HostConfig
from ddtree_deploy.remote.protocol import ErrorKind

# A failed host drawn yellow (it was refused, or restored, or is only unreachable: nothing is half done)
# rather than red.
_YELLOW = {ExitCode.HOST_REFUSED, ExitCode.LOCK_HELD, ExitCode.ROLLED_BACK, ExitCode.SMOKE_FAILED, ExitCode.UNREACHABLE}


class FleetUI:
    """The callback for ``run_fleet``'s events: per-host progress on stderr."""

    def __init__(self, env: Environment, hosts: list[str], *, quiet: bool = False):
        err = self.err = env.err
        self.quiet = quiet
        self._last: dict[str, str] = {}
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        if env.stderr_isatty and not quiet:
            self.progress = Progress(
                TextColumn("[bold]{task.fields[host]:<12}"),
                BarColumn(bar_width=20),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=err,
                transient=False,
            )
            for h in hosts:
                self.tasks[h] = self.progress.add_task("waiting", total=100, host=h)

    def __enter__(self) -> FleetUI:
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress:
            self.progress.stop()

    def __call__(self, ev: FleetEvent) -> None:
        if self.quiet:
            return
        if ev.kind == NOTE:
            self.err.print(f"{ev.host}: {ev.text}", markup=False, highlight=False)
            return
        if self.progress and ev.host in self.tasks:
            kw: dict[str, Any] = {"description": ev.text}
            if ev.pct is not None:
                kw["completed"] = ev.pct
            self.progress.update(self.tasks[ev.host], **kw)
            return
        key = ev.text.split(" ")[0]  # plain lines: one per phase, not per progress tick
        if self._last.get(ev.host) != key:
            self._last[ev.host] = key
            self.err.print(f"{ev.host}: {ev.text}", markup=False, highlight=False)


def run(env: Environment, hosts: list[HostConfig], pipeline: Pipeline, *, title: str, quiet: bool = False) -> FleetResult:
    """``run_fleet`` with the progress drawn (none with ``quiet`` or ``-q``); on Ctrl-C the table of
    the hosts that ended, then re-raise."""
    with FleetUI(env, [h.name for h in hosts], quiet=quiet or env.quiet) as ui:
        try:
            return run_fleet(hosts, pipeline, on_event=ui, title=title)
        except FleetInterrupted as exc:
            print_table(env, title, exc.partial.results, quiet)
            raise


# The table holds ids only (host names, statuses, numbers, deploy ids), never folded, so a log line
# or a terminal row always has the whole id (off a terminal nothing wraps at all: console.LOG_WIDTH);
# each host's message follows the table on its own line ("host: message"; a failure's as error:/fix:).
_ID_COLUMNS = ("host", "result", "files", "bytes", "time", "deploy id")


def print_table(env: Environment, title: str, results: list[HostResult], quiet: bool = False) -> None:
    if quiet or env.quiet or not results:
        return
    t = Table(title=title, show_lines=False)
    for col in _ID_COLUMNS:
        t.add_column(col, no_wrap=True)
    for r in results:
        style = "green" if r.ok else ("yellow" if r.exit_code in _YELLOW else "red")
        t.add_row(r.host, f"[{style}]{r.status}[/]", str(r.files_sent), str(r.bytes_sent), f"{r.seconds:.2f}s", r.deploy_id or "")
    env.err.print(t)
    for r in results:
        if r.ok:
            msg = r.message if r.message.startswith(r.host + ": ") else f"{r.host}: {r.message}"
            env.err.print(msg, markup=False, highlight=False, soft_wrap=True)


def finish(
    env: Environment,
    fleet: FleetResult,
    *,
    json_mode: bool,
    quiet: bool = False,
    extra: dict[str, Any] | None = None,
    ok_code: int = ExitCode.OK,
) -> int:
    """Print the table (stderr) and the JSON (stdout); return the exit code (``ok_code`` when no
    host failed: ``status --strict`` uses it for hosts that answered but need attention)."""
    results = fleet.results
    print_table(env, fleet.title, results, quiet)
    failed = list(fleet.failed.values())
    code = fleet_exit_code(fleet, ok_code=ok_code)
    for r in failed:
        env.print_error(r.message, r.hint)
    if len(results) > 1 and failed:
        env.err.print(f"{len(failed)} of {len(results)} hosts failed")
    if json_mode:
        error, message, hint = outcome(fleet, code)
        env.out_result(
            {"hosts": [r.to_json() for r in results], **(extra or {})}, exit_code=code, error=error, message=message, hint=hint
        )
    return int(code)


def outcome(fleet: FleetResult, code: int) -> tuple[str | None, str, str | None]:
    """The envelope's ``error`` id, ``message`` and ``hint`` for a run over hosts."""
    results, failed = fleet.results, list(fleet.failed.values())
    if code == ExitCode.INTERRUPTED:
        return ErrorKind.INTERRUPTED, "interrupted", None
    if not failed:
        if code == AttentionError.exit_code:
            names = [r.host for r in results if r.status == "attention"]
            return AttentionError.kind, f"{len(names)} host(s) need attention: {', '.join(names)}", "ddtree-deploy status HOST"
        if len(results) == 1:
            return None, results[0].message, None
        return None, "; ".join(f"{r.host}: {r.status}" for r in results), None
    if len(results) == 1:
        r = failed[0]
        return r.error or ErrorKind.UNEXPECTED, r.message, r.hint
    which = ", ".join(f"{r.host} ({r.status})" for r in failed)
    return PartialFailureError.kind, f"{len(failed)} of {len(results)} hosts failed: {which}", "see each host in `hosts`"
