"""Shim for ``sgl_kernel.utils`` (see the package doc).

``is_arch_support_pdl`` is read by the Triton attention backend (sglang/srt/layers/attention/
triton_backend.py:71 import, :340 ``self.use_pdl = is_arch_support_pdl()``) and by SGLang's JIT kernels,
to decide whether kernels are launched with programmatic dependent launch (PDL: a kernel may start
while the previous one drains). The real function answers ``True`` on sm90+. The shim answers
``False`` unless ``H200_SHIM_PDL=1``: PDL changes only launch overlap, never results, and with
it off nothing depends on the shim's torch ops cooperating with PDL's grid-dependency waits.
Both DFLASH and DDTREE run with the same setting, so their step-time ratio is unaffected in kind.
"""

from __future__ import annotations

import functools
import os

from . import _log, _stub_getattr


@functools.cache
def is_arch_support_pdl() -> bool:
    _log("call", "sgl_kernel.utils.is_arch_support_pdl")
    if os.environ.get("H200_SHIM_PDL") != "1":
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


__getattr__ = _stub_getattr("sgl_kernel.utils")
