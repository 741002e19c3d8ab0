"""Fixtures for the offline reference engine tests (CPU only, tiny random-weight models).

The engine imports the DDTree core through ``ddtree_offline.core.ddtree_utils()`` (the patch
series via ``ddtree_deploy.build.overlay.import_patched``, or ``DDTREE_UTILS_PATH``). If neither works the
tests fail: they always run against the real core from the series.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")



@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: intra-op threading only adds overhead (and the CI box has 2 cores).

    Module-scoped and restored afterwards, so other test directories keep their setting.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def du():
    """The DDTree core module the engine uses (from the patch series)."""
    from ddtree_offline import core

    return core.ddtree_utils()


@pytest.fixture(scope="session")
def target64(du):
    """A tiny float64 Llama-architecture target (float64: no near-tie argmax flips)."""
    from ddtree_offline.models import tiny_target

    return tiny_target(seed=0, vocab=384, hidden=64, layers=2, dtype=torch.float64)


@pytest.fixture(scope="session")
def target64_qwen3(du):
    """A tiny float64 Qwen3-architecture target."""
    from ddtree_offline.models import tiny_target

    return tiny_target(seed=3, vocab=320, hidden=64, layers=2, arch="qwen3", dtype=torch.float64)
