"""Every engine started by this suite shut down with all its processes (runs last)."""

from __future__ import annotations

import re_engine_proc


def test_no_engine_process_outlived_its_engine(engines):
    engines.stop()
    assert not re_engine_proc.LEAKED, f"engine processes alive after shutdown: {re_engine_proc.LEAKED}"
