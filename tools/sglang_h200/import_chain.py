"""Import the modules a Qwen3 + DFlash/DDTree engine loads on CUDA, with the H200 shims.

On the H200 it runs as is; on a CPU machine (tests/h200_harness) with ``H200_FAKE_CUDA=1`` so that
SGLang's ``if _is_cuda:`` import branches are taken. Prints one ``ok``/``FAIL`` line per module and
exits 1 if any failed.
"""

from __future__ import annotations

import importlib
import sys
import traceback

MODULES = [
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.rotary_embedding",
    "sglang.srt.layers.logits_processor",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.models.qwen3",
    "sglang.srt.models.dflash",
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.speculative.dflash_worker_v2",
    "sglang.srt.speculative.ddtree_worker_v2",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.managers.scheduler",
    "sglang.srt.entrypoints.engine",
]


def main(argv: list[str]) -> int:
    bad = 0
    for name in argv or MODULES:
        try:
            importlib.import_module(name)
            print(f"ok   {name}", flush=True)
        except Exception as exc:  # report every module, then fail
            bad += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc(limit=-4)
    if not argv:
        bad += _check_bindings()
    return 1 if bad else 0


# Names SGLang's CUDA branches bind from sgl_kernel at module load (file:line in the pinned wheel):
# each must be the shim's object, which shows the CUDA branch was taken and resolved to it.
BINDINGS = [
    ("sglang.srt.layers.layernorm", "rmsnorm", "sgl_kernel", "rmsnorm"),  # layernorm.py:102
    ("sglang.srt.layers.layernorm", "fused_add_rmsnorm", "sgl_kernel", "fused_add_rmsnorm"),
    # activation.py:62: the sgl_kernel op for hidden sizes the JIT kernel cannot vectorize (:85-96)
    ("sglang.srt.layers.activation", "_sgl_silu_and_mul", "sgl_kernel", "silu_and_mul"),
    (
        "sglang.srt.layers.attention.triton_backend",
        "is_arch_support_pdl",
        "sgl_kernel.utils",
        "is_arch_support_pdl",
    ),  # triton_backend.py:71
    (
        "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",
        "weak_ref_tensor",
        "sgl_kernel",
        "weak_ref_tensor",
    ),  # weak_ref_tensor.py:8
]


def _check_bindings() -> int:
    bad = 0
    for mod, attr, kmod, kattr in BINDINGS:
        try:
            got = getattr(importlib.import_module(mod), attr)
            ok = got is getattr(importlib.import_module(kmod), kattr)
        except Exception as exc:  # noqa: BLE001
            ok, got = False, exc
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} binding {mod}.{attr} is {kmod}.{kattr}" + ("" if ok else f" ({got!r})"))
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
