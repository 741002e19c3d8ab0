"""Fixtures shared by every test directory.

The pinned snapshot is the REAL sglang 0.5.23 wheel from PyPI, fetched and verified by
``ddtree-deploy snapshot fetch`` (``make test`` runs it first; the cache lives outside the repo).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A suite started in the background by a non-interactive shell (`make test &`) inherits SIGINT
# ignored, and so would every CLI process the Ctrl-C tests start (an ignored signal survives exec,
# and Python then installs no KeyboardInterrupt handler): those tests would time out for a reason
# that is not theirs. The children get the default disposition back from here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
