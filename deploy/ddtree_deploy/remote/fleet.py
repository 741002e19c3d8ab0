"""Many hosts at once: a thread per host; each host ends as one ``HostResult``, the run as one ``FleetResult``.

One host failing never stops or corrupts another: each host runs its own pipeline on its own SSH
connection and ends as one ``HostResult``. Ctrl-C sets a shared cancel event; each pipeline stops
at its next step (an upload that is cut short is discarded by the host before any write; a host
that already has the whole payload finishes, or rolls back, on its own and records it).

Nothing here draws or prints: a pipeline reports its phases through a :class:`Reporter`, which
hands each one as a :class:`FleetEvent` to the caller's callback (the CLI draws them, see
``cli/fleet_ui.py``). The exit code of a run is derived from its ``FleetResult`` in one place,
``errors.fleet_exit_code``.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

from ddtree_deploy.errors import DDTreeDeployError, ExitCode, Interrupted
from ddtree_deploy.remote.inventory import HostConfig


@dataclass
class HostResult:
    host: str
    ok: bool
    status: str  # deployed | unchanged | would-change | refused | rolled-back | failed | interrupted | ...
    exit_code: int = ExitCode.OK
    message: str = ""
    hint: str | None = None
    deploy_id: str | None = None
    files_sent: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = int(self.exit_code)
        return d


@dataclass
class FleetResult:
    """The outcome of one run over several hosts (like Fabric's ``GroupResult``), in host order.

    ``succeeded`` and ``failed`` map host name -> ``HostResult``; the CLI turns the whole into an
    exit code with ``errors.fleet_exit_code``.
    """

    results: list[HostResult]
    title: str = ""

    @property
    def succeeded(self) -> dict[str, HostResult]:
        return {r.host: r for r in self.results if r.ok}

    @property
    def failed(self) -> dict[str, HostResult]:
        return {r.host: r for r in self.results if not r.ok}

    @property
    def ok(self) -> bool:
        return not self.failed

    def __iter__(self) -> Iterator[HostResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, host: str) -> HostResult:
        for r in self.results:
            if r.host == host:
                return r
        raise KeyError(host)


class FleetInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_fleet`: every host was told to stop at its next step; ``partial``
    holds the hosts that ended within the grace period."""

    def __init__(self, partial: FleetResult, hosts: list[str] | None = None):
        super().__init__("interrupted")
        self.partial = partial
        names = " ".join(hosts or [r.host for r in partial.results])
        self.hint = f"see where each host stands: ddtree-deploy status {names}" if names else None


# --- progress events ----------------------------------------------------------------------------

PHASE = "phase"  # a step of a host's pipeline (``pct``: a rough share of the pipeline done)
NOTE = "note"  # a line worth keeping (a new host key recorded, the fleet being interrupted)
DONE = "done"  # the host's pipeline ended; ``text`` is its status word


@dataclass(frozen=True)
class FleetEvent:
    host: str  # a host name, or "*" for the whole fleet
    text: str
    pct: float | None = None
    kind: str = PHASE


OnEvent = Callable[[FleetEvent], None]


class Reporter:
    """What a pipeline reports through. Every call becomes one :class:`FleetEvent` for ``on_event``;
    calls from the host threads reach it one at a time, so the callback need not lock."""

    def __init__(self, on_event: OnEvent | None = None):
        self._on_event = on_event
        self._lock = threading.Lock()

    def emit(self, ev: FleetEvent) -> None:
        if self._on_event is None:
            return
        with self._lock:
            self._on_event(ev)

    def phase(self, host: str, text: str, pct: float | None = None) -> None:
        self.emit(FleetEvent(host, text, pct, PHASE))

    def note(self, host: str, text: str) -> None:
        self.emit(FleetEvent(host, text, None, NOTE))


# A failed host's status word, by the exit code its error maps to.
_ERROR_STATUS = {
    ExitCode.HOST_REFUSED: "refused",
    ExitCode.LOCK_HELD: "locked",
    ExitCode.ROLLED_BACK: "rolled-back",
    ExitCode.NEEDS_HUMAN: "NEEDS-HUMAN",
    ExitCode.SMOKE_FAILED: "smoke-failed",
    ExitCode.UNREACHABLE: "unreachable",
    ExitCode.INTERRUPTED: "interrupted",
    ExitCode.USAGE: "usage-error",
}


def result_from_error(host: str, exc: BaseException, t0: float) -> HostResult:
    if isinstance(exc, DDTreeDeployError):
        status = _ERROR_STATUS.get(exc.exit_code, "failed")
        return HostResult(
            host,
            False,
            status,
            exc.exit_code,
            exc.message,
            exc.hint,
            deploy_id=exc.details.get("deploy_id"),
            seconds=time.monotonic() - t0,
            files_sent=int(exc.details.get("files_sent") or 0),
            bytes_sent=int(exc.details.get("bytes_sent") or 0),
            error=exc.kind,
            data={k: v for k, v in exc.details.items() if k != "host"},
        )
    return HostResult(
        host,
        False,
        "failed",
        ExitCode.UNEXPECTED,
        f"{host}: unexpected {type(exc).__name__}: {exc}",
        None,
        seconds=time.monotonic() - t0,
        error=type(exc).__name__,
        data={"traceback": traceback.format_exc()[-3000:]},
    )


Pipeline = Callable[[HostConfig, Reporter, threading.Event], HostResult]


# After Ctrl-C, how long the hosts get to notice and end (every pipeline checks its cancel event at
# least every 0.1 s, and a connection being made is closed); the rest are reported as interrupted.
INTERRUPT_GRACE_S = 0.5


def run_fleet(
    hosts: list[HostConfig],
    pipeline: Pipeline,
    *,
    on_event: OnEvent | None = None,
    title: str = "",
    max_workers: int = 32,
) -> FleetResult:
    """Run ``pipeline`` for every host in parallel; return the results in host order.

    ``on_event`` gets every phase and note of every host (see :class:`Reporter`) and a ``DONE``
    event per host. On Ctrl-C every host is told to stop and gets ``INTERRUPT_GRACE_S`` to end;
    :class:`FleetInterrupted` carries the hosts that ended. The host threads are daemons, so a host
    stuck in a system call never keeps the process alive after it (a host with the whole payload
    finishes, or rolls back, on its own). This module never prints.
    """
    cancel = threading.Event()
    reporter = Reporter(on_event)
    names = [h.name for h in hosts]
    results: dict[str, HostResult] = {}
    done = threading.Condition()
    slots = threading.Semaphore(max(1, min(max_workers, len(hosts))))

    def wrapped(h: HostConfig) -> None:
        t0 = time.monotonic()
        with slots:
            try:
                if cancel.is_set():
                    raise _cancelled(h.name)
                r = pipeline(h, reporter, cancel)
            except BaseException as exc:  # noqa: BLE001 (one host never takes the others down)
                r = result_from_error(h.name, exc, t0)
        r.seconds = round(time.monotonic() - t0, 3)
        reporter.emit(FleetEvent(h.name, r.status, 100, DONE))
        with done:
            results[h.name] = r
            done.notify_all()

    threads = [threading.Thread(target=wrapped, args=(h,), name=f"host-{h.name}", daemon=True) for h in hosts]
    for t in threads:
        t.start()
    try:
        with done:
            while len(results) < len(hosts):
                done.wait(0.1)
    except KeyboardInterrupt:
        cancel.set()
        reporter.note("*", "interrupted: stopping every host at its next step")
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with done:
            ended = dict(results)
        raise FleetInterrupted(FleetResult([ended[n] for n in names if n in ended], title), names) from None
    return FleetResult([results[n] for n in names], title)


def _cancelled(host: str) -> DDTreeDeployError:
    return Interrupted(f"{host}: interrupted before it started")
