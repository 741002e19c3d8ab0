"""Import the modules a Qwen3 + DFlash/DDTree engine loads on CUDA, with the H200 stand-ins.

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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
