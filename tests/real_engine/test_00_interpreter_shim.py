"""The interpreter shim (``support/sitecustomize.py``, shim 4) changes no value a kernel computes.

SGLang's extend-attention Triton kernel (what every CPU-engine prefill and verify runs) on fixed random
inputs, a tree mask over a KV prefix and a causal request, in two processes under ``TRITON_INTERPRET=1``
with the patched SGLang on ``PYTHONPATH``: once with the launch shims on (as every engine of this suite
runs), once with none. The outputs must be equal bit for bit, and the shimmed run must show the shim at
work (overflow sanitizing off, nested re-patches skipped), else the comparison proves nothing.
"""

from __future__ import annotations

import subprocess
import sys

import torch
from re_engine_proc import SUPPORT, engine_env


def _run(site, tmp_path, shims: bool) -> dict:
    env = engine_env(site)
    if not shims:
        env.pop("DDTREE_REAL_ENGINE_SHIMS")
    out = tmp_path / f"case-{int(shims)}.pt"
    proc = subprocess.run([sys.executable, str(SUPPORT / "interpreter_case.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


def test_interpreter_shim_changes_no_kernel_output(re_site, tmp_path):
    plain = _run(re_site, tmp_path, shims=False)
    shimmed = _run(re_site, tmp_path, shims=True)
    assert plain["shim"] is None and plain["sanitize_overflow"] is True
    st = shimmed["shim"]
    assert shimmed["sanitize_overflow"] is False and st["launches"] >= 1 and st["nested_skipped"] > 0, st
    assert torch.isfinite(plain["out"]).all()
    assert torch.equal(shimmed["out"], plain["out"]), (shimmed["out"] - plain["out"]).abs().max()
