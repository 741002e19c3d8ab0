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
4. Triton's interpreter (``triton.runtime.interpreter``): two paths whose work is thrown away are
   skipped (see ``_shim_triton_interpreter``); the kernels and every value they compute are unchanged.
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


def _shim_triton_interpreter(mod):
    """Shim 4: two pure-overhead paths of Triton's interpreter (triton 3.8 ``runtime/interpreter.py``)
    skipped; every value an interpreted kernel computes is unchanged. Together they halve the time of
    an interpreted attention kernel, which is nearly all of a CPU engine step.

    a. ``InterpreterOptions.sanitize_overflow`` (:107, True) makes every integer add / sub / mul also
       build an int64 overflow check whose ``device_assert`` then returns at once, since ``debug`` is
       False (``language/semantic.py:1811``): the work is thrown away, as in a GPU build without debug.
       Off here.
    b. Every call of a ``@triton.jit`` device function from inside a kernel (``tl.max``, ``tl.zeros``,
       ``tl.sum``... are such functions) re-patches ``triton.language`` (``_patch_lang`` at :1544:
       ``inspect.getmembers`` over the language modules) although the kernel's launch (:1397) or an
       earlier call already patched those same module objects, which stay patched until the launch's
       grid ends. Here a nested call whose modules are patched already in this launch does nothing;
       a nested call that needs more, every launch and every restore are the interpreter's own code.

    ``tests/real_engine/test_00_interpreter_shim.py`` runs SGLang's extend-attention kernel (tree mask
    and causal, with a KV prefix) with and without the shims and requires the same output bit for bit.
    """
    import dataclasses

    builder = mod.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)

    orig_patch_lang = mod._patch_lang
    stats = mod._ddtree_shim_stats = {"launches": 0, "nested_skipped": 0, "nested_patched": 0}
    patched: set = set()  # ids of what the launch running now has patched; empty between launches
    launch: list = []

    def _targets(fn):
        """The objects the interpreter's _patch_lang(fn) patches (interpreter.py:1247-1258)."""
        tl = mod.tl
        out = set()
        for v in fn.__globals__.values():
            if v is tl or v is tl.core:
                out.update((id(v), id(v.tensor)))
                if v is tl:
                    out.add(id(tl.math))
        return out

    def _patch_lang(fn):
        need = _targets(fn)
        if launch and need <= patched:
            stats["nested_skipped"] += 1
            return mod._LangPatchScope()  # patched already in this launch: nothing to do
        scope = orig_patch_lang(fn)
        patched.update(need)
        if launch:
            stats["nested_patched"] += 1
            return scope  # a device function that needed more: the interpreter's own path
        stats["launches"] += 1
        launch.append(fn)
        restore = scope.restore

        def restore_and_forget():
            try:
                restore()
            finally:
                launch.clear()
                patched.clear()

        scope.restore = restore_and_forget
        return scope

    mod._patch_lang = _patch_lang


_SHIMS = {
    "triton.runtime.interpreter": _shim_triton_interpreter,
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
