"""Launch shims for the real-engine CPU tests (tests/real_engine only; put on PYTHONPATH of the
engine driver, so every process SGLang spawns with multiprocessing 'spawn' loads them too).

Active only when ``DDTREE_REAL_ENGINE_SHIMS=1``. Each shim is applied right after the module it
touches is imported; none touches a worker, the scheduler, an attention backend or a model:

1. ``arg_groups/speculative_hook.py`` ``_handle_dflash`` (pinned wheel :294-301) and the series'
   ``_handle_ddtree`` (absent from the unpatched wheel, ``DDTREE_REAL_ENGINE_PRISTINE=1``) refuse
   device ``cpu`` (the real kernels are CUDA ones). While (only while)
   those two functions run, the live config view they read reports ``device == "cuda"``; every
   other check and every value they derive is theirs, and the engine still runs with device cpu.
2. ``torch.Tensor.record_stream`` raises on CPU tensors ("unknown parameter type"); DFlash
   (``dflash_worker_v2.py:2481`` in the wheel) and the DDTree worker call it on ``batch.seq_lens``.
   CUDA stream bookkeeping has no meaning on a CPU: a no-op for CPU tensors only.
3. ``ModelRunner._extend_forward_kwargs`` hard-codes ``input_embeds.bfloat16()``
   (``model_runner.py:1772``), a dtype mismatch in a float32 model (the DFlash drafter is fed the
   target's embeddings as input_embeds). When the runner's dtype is float32 the embeds stay
   float32 (same values, no rounding); nothing else in the kwargs changes.
The tree-mask layout is deliberately NOT shimmed: the DDTree worker's own choice is under test.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys


def _shim_speculative_hook(mod):
    real_view = mod.resolving_view

    class _CudaDeviceView:
        __slots__ = ("_v",)

        def __init__(self, v):
            object.__setattr__(self, "_v", v)

        def __getattr__(self, name):
            if name == "device":
                return "cuda"
            return getattr(object.__getattribute__(self, "_v"), name)

    def wrap(fn):
        def run(server_args, *a, **k):
            mod.resolving_view = lambda sa: _CudaDeviceView(real_view(sa))
            try:
                return fn(server_args, *a, **k)
            finally:
                mod.resolving_view = real_view

        run.__wrapped__ = fn
        return run

    pristine = os.environ.get("DDTREE_REAL_ENGINE_PRISTINE") == "1"  # the unpatched wheel: no DDTREE
    for name in ("_handle_dflash", "_handle_ddtree"):
        if not hasattr(mod, name):
            if pristine and name == "_handle_ddtree":
                continue
            raise RuntimeError(f"real-engine shim: {mod.__name__}.{name} is gone; update the shim")
        setattr(mod, name, wrap(getattr(mod, name)))


def _shim_torch(mod):
    orig = mod.Tensor.record_stream

    def record_stream(self, stream):
        if self.device.type == "cpu":
            return None
        return orig(self, stream)

    mod.Tensor.record_stream = record_stream


def _shim_model_runner(mod):
    import torch

    cls = mod.ModelRunner
    orig = cls._extend_forward_kwargs

    def _extend_forward_kwargs(self, forward_batch, pp_proxy_tensors):
        kwargs = orig(self, forward_batch, pp_proxy_tensors)
        emb = forward_batch.input_embeds
        if (emb is not None and "input_embeds" in kwargs and getattr(self, "dtype", None) == torch.float32
                and emb.dtype == torch.float32):
            kwargs["input_embeds"] = emb
        return kwargs

    cls._extend_forward_kwargs = _extend_forward_kwargs


_SHIMS = {
    "torch": _shim_torch,
    "sglang.srt.arg_groups.speculative_hook": _shim_speculative_hook,
    "sglang.srt.model_executor.model_runner": _shim_model_runner,
}


class _PostImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        shim = _SHIMS.get(fullname)
        if shim is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            shim(module)

        loader.exec_module = exec_module
        return spec


if os.environ.get("DDTREE_REAL_ENGINE_SHIMS") == "1":
    sys.meta_path.insert(0, _PostImport())
