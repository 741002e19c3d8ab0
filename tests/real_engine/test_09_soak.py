"""The soak (tools/soak/soak.py, ``make soak``) at CI size on the CPU engine: 50 requests from 8
concurrent clients against DDTREE B 16 with a 300-token KV pool (retraction), aborts mid-stream
and after a delay, prompts at and past the context limit, greedy and sampled (top-k / top-p /
min-p) requests, streaming and not. It must pass with zero failures: every greedy answer equal to
target-only's on the same engine settings, every final message well formed, no KV tokens in use
once idle and flushed (and SGLang's strict idle memory check on), no leak or traceback in the
log, flat resident memory. The soak's own verdict is unit-tested in tests/soak."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Enough for every kind (the workload covers each at least once from 8 requests on), retraction
# in the 300-token pool, and 19 greedy answers to compare (seed 0); 100 took 2x as long.
REQUESTS = 50


def test_soak_small(engines, re_models, tmp_path):
    engines.stop()  # at most one engine process group at a time (this test starts its own)
    out = tmp_path / "soak"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "soak" / "soak.py"), "--cpu", "--requests", str(REQUESTS),
         "--model", str(re_models["target"]), "--draft", str(re_models["draft"]), "--out", str(out)],
        capture_output=True, text=True, timeout=1500)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    assert proc.returncode == 0 and summary.get("ok"), (proc.returncode, proc.stderr[-4000:])
    # the load did what it is there for (else a pass proves little)
    assert summary["run"] == summary["requests"] == REQUESTS
    assert summary["retracted_reqs"] > 0, summary
    assert summary["aborted"] > 0 and summary["errors_expected"] > 0, summary
    assert summary["greedy_equal"] >= 15, summary
    assert summary["loads"]["after_flush"]["used_tokens"] == 0, summary
