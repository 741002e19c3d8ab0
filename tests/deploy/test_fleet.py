"""The fleet runner without SSH: ``run_fleet`` over real threads with plain-Python pipelines.

The pipelines here are not stand-ins for SSH: ``run_fleet`` only calls ``pipeline(host, reporter,
cancel)`` and collects what it returns or raises (remote/fleet.py), which is what these do. The
SSH pipelines themselves are tested against real sshd hosts in test_remote_deploy.py.
"""

from __future__ import annotations

import _thread
import threading
import time

import pytest

from ddtree_deploy.errors import (
    ExitCode,
    HostRefusedError,
    LockHeldError,
    RolledBackError,
    fleet_exit_code,
)
from ddtree_deploy.remote.connection import Interrupted
from ddtree_deploy.remote.fleet import (
    DONE,
    NOTE,
    PHASE,
    FleetEvent,
    FleetInterrupted,
    FleetResult,
    HostResult,
    run_fleet,
)
from ddtree_deploy.remote.inventory import HostConfig


def hosts(*names: str) -> list[HostConfig]:
    return [HostConfig(name=n, target=f"root@127.0.0.1:{9 + i}", python="python3") for i, n in enumerate(names)]


def by_name(outcomes: dict[str, object]):
    """A pipeline whose outcome per host is a HostResult to return or an exception to raise."""

    def run(h, report, cancel):
        report.phase(h.name, "working", 50)
        what = outcomes[h.name]
        if isinstance(what, BaseException):
            raise what
        return what

    return run


def ok(host: str, status: str = "deployed") -> HostResult:
    return HostResult(host, True, status, ExitCode.OK, f"{host}: fine")


def test_succeeded_and_failed_by_host_and_one_failure_stops_nobody():
    pipeline = by_name({"a": ok("a"), "b": HostRefusedError("b: drifted"), "c": ok("c", "unchanged"), "d": ValueError("a bug")})
    res = run_fleet(hosts("a", "b", "c", "d"), pipeline, title="push x")
    assert isinstance(res, FleetResult) and res.title == "push x"
    assert [r.host for r in res] == ["a", "b", "c", "d"] and len(res) == 4  # host order, every host
    assert sorted(res.succeeded) == ["a", "c"] and sorted(res.failed) == ["b", "d"]
    assert not res.ok
    b, d = res.failed["b"], res["d"]
    assert (b.status, b.exit_code, b.error) == ("refused", ExitCode.HOST_REFUSED, "HostRefusedError")
    assert (d.status, d.exit_code, d.error) == ("failed", ExitCode.UNEXPECTED, "ValueError")
    assert "ValueError: a bug" in d.data["traceback"]
    assert [r.to_json()["exit_code"] for r in res] == [0, 6, 0, 1]


def test_fleet_exit_code_is_derived_from_the_result():
    run = lambda outcomes: run_fleet(hosts(*outcomes), by_name(outcomes))  # noqa: E731
    assert fleet_exit_code(run({"a": ok("a"), "b": ok("b")})) == ExitCode.OK
    assert fleet_exit_code(run({"a": ok("a")}), ok_code=ExitCode.ATTENTION) == ExitCode.ATTENTION
    assert fleet_exit_code(run({"a": LockHeldError("a: held")})) == ExitCode.LOCK_HELD  # one host: its own code
    assert fleet_exit_code(run({"a": ok("a"), "b": RolledBackError("b: restored")})) == ExitCode.PARTIAL
    assert fleet_exit_code(run({"a": RolledBackError("a"), "b": Interrupted("b: ^C")})) == ExitCode.INTERRUPTED
    assert fleet_exit_code(run({"a": Interrupted("a: ^C")})) == ExitCode.INTERRUPTED


def test_events_reach_the_callback_one_at_a_time_and_end_with_done():
    seen: list[FleetEvent] = []
    inside = [0]
    overlaps = []

    def on_event(ev: FleetEvent) -> None:
        inside[0] += 1
        overlaps.append(inside[0] > 1)
        time.sleep(0.002)
        seen.append(ev)
        inside[0] -= 1

    def pipeline(h, report, cancel):
        for i in range(20):
            report.phase(h.name, f"step {i}", i * 5)
        report.note(h.name, "a note")
        return ok(h.name)

    run_fleet(hosts(*"abcdefgh"), pipeline, on_event=on_event)
    assert not any(overlaps)  # the Reporter serialises the host threads
    for name in "abcdefgh":
        mine = [e for e in seen if e.host == name]
        assert [e.kind for e in mine] == [PHASE] * 20 + [NOTE, DONE]
        assert mine[-1] == FleetEvent(name, "deployed", 100, DONE)


def test_run_fleet_without_a_callback_is_silent(capfd):
    run_fleet(hosts("a", "b"), by_name({"a": ok("a"), "b": HostRefusedError("b: no")}))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_ctrl_c_cancels_every_host_and_carries_the_ones_that_ended():
    started = threading.Barrier(3)
    seen: list[FleetEvent] = []

    def pipeline(h, report, cancel):
        started.wait(5)
        if h.name == "c":
            time.sleep(0.2)
            _thread.interrupt_main()  # what Ctrl-C does: KeyboardInterrupt in the main thread
            return ok("c")
        if not cancel.wait(10):
            return ok(h.name)
        raise Interrupted(f"{h.name}: stopped at the next step")

    with pytest.raises(FleetInterrupted) as ei:
        run_fleet(hosts("a", "b", "c"), pipeline, title="t", on_event=seen.append)
    assert isinstance(ei.value, KeyboardInterrupt)  # cli.main still maps it to 130
    part = ei.value.partial
    assert [r.host for r in part] == ["a", "b", "c"]
    assert sorted(part.failed) == ["a", "b"] and [r.status for r in part.failed.values()] == ["interrupted"] * 2
    assert fleet_exit_code(part) == ExitCode.INTERRUPTED
    assert FleetEvent("*", "interrupted: stopping every host at its next step", None, NOTE) in seen
