"""Launch shims of the H200 harness, active in every process the engine spawns (PYTHONPATH).

See docs/h200-harness.md. Each shim names what it replaces and why the code under test is unchanged.

1. ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` -> ``h200_shims/cutedsl_dual_gemm.py`` (needs the
   CuTe DSL ``cutlass``; answers "no dual GEMM" off SM100 like the real one). The name ``cutlass`` itself
   is left unimportable: anything else that imports it fails with ImportError naming it.
2. ``H200_FAKE_CUDA=1`` (CPU import-chain test only, tests/h200_harness): report a CUDA sm90 device to
   SGLang's platform checks so its ``if _is_cuda:`` import branches are taken on a CPU machine. Never
   set on the GPU.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_REDIRECT = {
    "sglang.kernels.ops.gemm.cutedsl_dual_gemm": _HERE / "h200_shims" / "cutedsl_dual_gemm.py",
}


class _Redirect(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        dest = _REDIRECT.get(fullname)
        if dest is None:
            return None
        return importlib.util.spec_from_file_location(fullname, dest)


if not any(isinstance(f, _Redirect) for f in sys.meta_path):
    sys.meta_path.insert(0, _Redirect())

os.environ.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")

if os.environ.get("H200_FAKE_CUDA") == "1":
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H200 (faked for the CPU import-chain test)"
    torch.cuda.device_count = lambda: 1
