"""Shim for ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` (installed by sitecustomize.py).

The real module (pinned wheel) builds a CuTe-DSL tcgen05 kernel for Blackwell (SM100) and imports
``cutlass`` (nvidia-cutlass-dsl, not on the H200 machine, too large to carry) at module load.
SGLang imports it on every CUDA machine from ``sglang/srt/layers/dual_gemm.py:40`` (``DualGemm._select_mode``)
only to ask ``can_use_dual_gemm(...)``, whose answer on anything but SM100 is ``False``
(``cutedsl_dual_gemm.py:1602-1620``: ``... and is_sm100_supported()``). The shim gives the same
answer on the H200 (sm90) and refuses to run on an SM100 GPU, so the code under test is unchanged:
the dual GEMM is never selected, Qwen3's MLP runs its gate_up / down projections as on any Hopper.
"""

from __future__ import annotations

from enum import IntEnum

import torch

MAX_DUAL_GEMM_DECODE_TOKENS = 16


class DualGemmQuantMode(IntEnum):
    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_dynamic(self) -> bool:
        return self in (DualGemmQuantMode.DYNAMIC_PER_TENSOR, DualGemmQuantMode.DYNAMIC_PER_TOKEN)

    @property
    def is_quantized(self) -> bool:
        return self is not DualGemmQuantMode.UNQUANT


def can_use_dual_gemm(num_tokens, hidden_size, intermediate_size, quant_mode) -> bool:
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10:
        raise NotImplementedError(
            "cutedsl_dual_gemm is shimmed by the H200 harness: on an SM100 GPU the real kernel would be "
            "selected, which the harness cannot run"
        )
    return False
