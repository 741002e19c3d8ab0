"""Fixtures for the bench/compare tests (helpers live in ``bench_helpers.py``)."""

from __future__ import annotations

import pytest

from bench_helpers import core_env


@pytest.fixture(scope="session")
def bench_env(tmp_path_factory) -> dict[str, str]:
    """Env for subprocesses: PYTHONPATH to the repo's packages and a route to the DDTree core."""
    return core_env(tmp_path_factory.mktemp("bench-core"))
