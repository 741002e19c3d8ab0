"""Fixtures for the offline reference engine tests (CPU only, tiny random-weight models).

The engine imports the DDTree core through ``ddtree_offline.core.ddtree_utils()`` (the patch
series via ``ddtree_deploy.overlay.import_patched``, or ``DDTREE_UTILS_PATH``). If neither works the
tests fail, unless ``DDTREE_OFFLINE_ALLOW_STANDIN=1`` is set, in which case the slow stand-in
``standin_ddtree_utils.py`` next to this file is used (development only).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for sub in ("tools", "deploy"):
    p = str(ROOT / sub)
    if p not in sys.path:
        sys.path.insert(0, p)

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


def _resolve_core():
    from ddtree_offline import core

    try:
        return core.ddtree_utils()
    except core.CoreUnavailable:
        if os.environ.get("DDTREE_OFFLINE_ALLOW_STANDIN") == "1":
            os.environ[core.ENV_VAR] = str(Path(__file__).with_name("standin_ddtree_utils.py"))
            core.ddtree_utils.cache_clear()
            return core.ddtree_utils()
        raise


@pytest.fixture(scope="session")
def du():
    """The DDTree core module the engine uses."""
    return _resolve_core()


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
