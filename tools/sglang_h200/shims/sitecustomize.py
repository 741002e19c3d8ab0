"""Launch shims of the H200 harness, active in every process the engine spawns (PYTHONPATH).

See docs/h200-harness.md (3. is a timing probe, below; 4. is the input_embeds dtype). Each shim names
what it replaces and why the code under test is unchanged.

1. ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` -> ``h200_shims/cutedsl_dual_gemm.py`` (needs the
   CuTe DSL ``cutlass``; answers "no dual GEMM" off SM100 like the real one). The name ``cutlass`` itself
   is left unimportable: anything else that imports it fails with ImportError naming it.
   ``sglang.kernels.ops.sampling.renorm`` -> ``h200_shims/sampling_renorm.py`` (FlashInfer's renorm ops
   are not on the machine; binds SGLang's own Triton renorm, as its ROCm branch does).
   ``sglang.kernels.ops.speculative.verify_sampling`` -> ``h200_shims/verify_sampling.py`` (the sampling
   verify kernel's JIT build needs FlashInfer's headers: reported as absent, SGLang's own no-kernel path).
2. ``H200_FAKE_CUDA=1`` (CPU import-chain test only, tests/h200_harness): report a CUDA sm90 device to
   SGLang's platform checks so its ``if _is_cuda:`` import branches are taken on a CPU machine. Never
   set on the GPU.
4. ``ModelRunner._extend_forward_kwargs`` (``srt/model_executor/model_runner.py:1772`` in the pinned
   wheel) casts ``forward_batch.input_embeds`` with ``.bfloat16()`` whatever the runner's dtype. The
   DFlash drafter's block forward is an eager TARGET_VERIFY extend fed the target's embeddings as
   input_embeds (``dflash_worker_v2.py`` ``_run_draft_block`` -> ``eager_runner.py:281``), so with the
   harness's float32 models and graphs off the float32 drafter gets bf16 activations and dies at its
   first projection (``srt/models/dflash.py:380``). When the embeds are already in the runner's dtype
   (float32 here) they are passed as they are; a bf16 runner is unchanged (the cast is a no-op there).
   The CPU real-engine suite has the same shim (tests/real_engine/support/sitecustomize.py, 3.).
   ``H200_KEEP_BF16_EMBEDS=1`` turns it off (to see SGLang's own behaviour on the GPU).
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
    "sglang.kernels.ops.sampling.renorm": _HERE / "h200_shims" / "sampling_renorm.py",
    "sglang.kernels.ops.speculative.verify_sampling": _HERE / "h200_shims" / "verify_sampling.py",
}
# H200_FLASHINFER=1 (h200.sh sets it when the carry holds FlashInfer): the real modules bind FlashInfer's
# renorm kernels and SGLang's JIT tree-sampling kernel (its build reads FlashInfer's headers), so the two
# shims that exist only because FlashInfer was absent step aside.
if os.environ.get("H200_FLASHINFER") == "1":
    del _REDIRECT["sglang.kernels.ops.sampling.renorm"], _REDIRECT["sglang.kernels.ops.speculative.verify_sampling"]


class _Redirect(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        dest = _REDIRECT.get(fullname)
        if dest is None:
            return None
        return importlib.util.spec_from_file_location(fullname, dest)


if not any(isinstance(f, _Redirect) for f in sys.meta_path):
    sys.meta_path.insert(0, _Redirect())

os.environ.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")

_MODEL_RUNNER = "sglang.srt.model_executor.model_runner"


def _shim_model_runner(mod):
    import torch

    cls = mod.ModelRunner
    orig = cls._extend_forward_kwargs

    def _extend_forward_kwargs(self, forward_batch, pp_proxy_tensors):
        kwargs = orig(self, forward_batch, pp_proxy_tensors)
        emb = forward_batch.input_embeds
        dtype = getattr(self, "dtype", None)
        if (
            emb is not None
            and "input_embeds" in kwargs
            and dtype is not None
            and dtype != torch.bfloat16
            and emb.dtype == dtype
            and forward_batch.replace_embeds is None
        ):
            kwargs["input_embeds"] = emb
        return kwargs

    _extend_forward_kwargs.__wrapped__ = orig
    cls._extend_forward_kwargs = _extend_forward_kwargs


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``fn(module)`` right after the module ``name`` is first executed (the shims 3 and 4)."""

    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                orig_exec = spec.loader.exec_module

                def exec_module(module, _orig=orig_exec):
                    _orig(module)
                    self.fn(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


if os.environ.get("H200_KEEP_BF16_EMBEDS") != "1" and not any(
    isinstance(f, _AfterImport) and f.name == _MODEL_RUNNER for f in sys.meta_path
):
    sys.meta_path.insert(0, _AfterImport(_MODEL_RUNNER, _shim_model_runner))

if os.environ.get("H200_FAKE_CUDA") == "1":
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H200 (faked for the CPU import-chain test)"
    torch.cuda.device_count = lambda: 1


# 3. H200_TIME_BUILDER=<file> (the harness's builder-share cases only): wrap the DDTree worker's tree
#    build (DDTreeWorkerV2._build_ddtree: top-K of the drafter's block + the tree builder) and its decode
#    step with CUDA synchronizes and wall clocks; cumulative "steps build_s step_s" are rewritten to
#    <file> after every decode step. The syncs change the timing a little, so these cases are reported
#    apart from the step-time table; nothing else is touched.
if os.environ.get("H200_TIME_BUILDER"):
    import time as _time

    _TIMED = "sglang.srt.speculative.ddtree_worker_v2"

    def _instrument(mod):
        import torch

        cls = getattr(mod, "DDTreeWorkerV2", None)
        if cls is None:
            return
        acc = {"steps": 0, "build": 0.0, "step": 0.0}
        path = os.environ["H200_TIME_BUILDER"]
        orig_build, orig_decode = cls._build_ddtree, cls._forward_ddtree_decode

        def _build(self, *a, **k):
            torch.cuda.synchronize()
            t0 = _time.perf_counter()
            out = orig_build(self, *a, **k)
            torch.cuda.synchronize()
            acc["build"] += _time.perf_counter() - t0
            return out

        def _decode(self, *a, **k):
            torch.cuda.synchronize()
            t0 = _time.perf_counter()
            out = orig_decode(self, *a, **k)
            torch.cuda.synchronize()
            acc["step"] += _time.perf_counter() - t0
            acc["steps"] += 1
            with open(path, "w") as fh:
                fh.write(f"{acc['steps']} {acc['build']} {acc['step']}\n")
            return out

        cls._build_ddtree, cls._forward_ddtree_decode = _build, _decode

    sys.meta_path.insert(0, _AfterImport(_TIMED, _instrument))
