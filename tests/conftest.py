"""Fixtures shared by every test directory.

The pinned snapshot is the REAL sglang 0.5.23 wheel from PyPI, fetched and verified by
``ddtree-deploy snapshot fetch`` (``make test`` runs it first; the cache lives outside the repo).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Under pytest-xdist every worker is a CPU-bound process of its own (two workers on two cores), and
# so is each engine a real-engine test starts: torch's and OpenMP's default of one thread per core
# would put twice as many busy threads as cores on the machine (measured slower). One thread each,
# unless the caller set it; the engines take it from here (tests/real_engine/re_engine_proc.py).
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"

# A suite started in the background by a non-interactive shell (`make test &`) inherits SIGINT
# ignored, and so would every CLI process the Ctrl-C tests start (an ignored signal survives exec,
# and Python then installs no KeyboardInterrupt handler): those tests would time out for a reason
# that is not theirs. The children get the default disposition back from here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# --- Running the suite on several workers (pytest-xdist; `make test` passes -n WORKERS; README "Tests and CI") ----------
# Almost all of the suite's time is the real-engine modules (tests/real_engine), each one engine process
# bound to one core (the Triton interpreter is single-threaded), so two workers on two cores run two of
# them at once. A work unit is a whole module (its module-scoped engine and fixtures stay on one worker);
# units go out longest first (measured seconds per module on the 2-core CI machine; a module not listed
# here counts as short and keeps its collection order after these), so the short tail evens out the end.
HEAVY_MODULES = (
    "tests/real_engine/test_09_soak.py",
    "tests/real_engine/test_03_ddtree_budgets.py",
    "tests/real_engine/test_08_request_features.py",
    "tests/real_engine/test_07_trained_pair.py",
    "tests/real_engine/test_01_plain_dflash.py",
    "tests/real_engine/test_02_ddtree_main.py",
    "tests/real_engine/test_05b_unpatched_behaviour.py",
    "tests/real_engine/test_04_refusals_and_headroom.py",
    "tests/sglang/test_args_and_imports.py",
    "tests/real_engine/test_05_sampling_runs.py",
    "tests/sglang/test_series_by_concern.py",
    "tests/kernels/test_ddtree_tree_kernel.py",
)
# Runs after every other module of its worker (it checks that worker's engines left no process behind).
LAST_MODULES = ("tests/real_engine/test_06_no_leaked_processes.py",)


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavy modules first (longest first), the rest in collection order, LAST_MODULES at the end;
    the order inside a module is never changed. The same order with or without workers."""
    rank = {m: i for i, m in enumerate(HEAVY_MODULES)}

    def key(pair: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        i, item = pair
        mod = _module_of(item)
        if mod in LAST_MODULES:
            return (2, 0, i)
        if mod in rank:
            return (0, rank[mod], i)
        return (1, 0, i)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


@pytest.hookimpl(optionalhook=True)  # defined only while pytest-xdist is loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """One work unit per module (xdist's loadscope: a module's fixtures stay on one worker), handed
    out in the order above, not xdist's own re-ordering by number of tests."""
    from xdist.scheduler import LoadScopeScheduling

    class ModulesInOrder(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False
    return ModulesInOrder(config, log)


_FOLDER_SECONDS: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Seconds per test folder (setup + call + teardown), summed where the reports arrive (with
    workers: the controller), for the summary below."""
    parts = report.nodeid.split("/")
    folder = "/".join(parts[:2]) if len(parts) > 2 else parts[0].split("::")[0]
    row = _FOLDER_SECONDS.setdefault(folder, [0.0, 0.0])
    row[0] += report.duration
    if report.when == "call":
        row[1] += 1


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if not _FOLDER_SECONDS:
        return
    rows = sorted(_FOLDER_SECONDS.items(), key=lambda kv: -kv[1][0])
    total = sum(s for s, _ in _FOLDER_SECONDS.values())
    terminalreporter.write_sep("=", "test seconds per folder (summed over tests; with workers they overlap)")
    for folder, (secs, n) in rows:
        terminalreporter.write_line(f"{secs:8.0f} s  {int(n):4d} tests  {folder}")
    terminalreporter.write_line(f"{total:8.0f} s  in all")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def snapshot_root() -> Path:
    """The cached, verified pinned snapshot (dir containing ``sglang/``)."""
    from ddtree_deploy.pin import snapshot

    return snapshot.ensure_snapshot()


@pytest.fixture
def make_series(tmp_path):
    """Write a series dir from ``{name: patch_bytes_or_str}`` (in order); returns its path."""

    def make(patches: dict[str, bytes | str], name: str = "sglang-0.5.23") -> Path:
        d = tmp_path / "series" / name
        d.mkdir(parents=True, exist_ok=True)
        for n, data in patches.items():
            (d / n).write_bytes(data.encode() if isinstance(data, str) else data)
        (d / "series").write_text("# test series\n" + "".join(n + "\n" for n in patches))
        return d

    return make


from testkit import git_diff, run_cli  # noqa: E402,F401  (re-exported for fixtures)
