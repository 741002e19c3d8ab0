"""Shim for ``sglang.kernels.ops.sampling.renorm`` on the H200 harness (redirected by sitecustomize).

What it replaces: on CUDA the real module binds ``top_k_renorm_prob`` / ``top_p_renorm_prob`` to
FlashInfer's ``flashinfer.sampling.top_{k,p}_renorm_probs`` (``kernels/ops/sampling/renorm.py:9-13``,
0.5.23), and FlashInfer is not on the H200 machine (no network, no wheel small enough to carry).
DFlash's CUDA sampling prewarm calls them at start-up (``srt/speculative/dflash_worker_v2.py:861`` ->
``dflash_utils.py:114``), so DFLASH and DDTREE engines died there.

What it binds instead: SGLang's own Triton renormalization, the one its ROCm branch of the same module
uses (``renorm.py:14-20`` -> ``kernels/ops/sampling/renorm_triton.py``), compiled by Triton for real,
applied ``H200_RENORM_ROWS`` rows at a time (default 1024). That Triton renorm sorts each whole row
(``renorm_triton.py:165``): over DDTREE's start-up sampling rehearsal at B 256 x batch 32 (8224 rows of a
151936-word vocabulary) the sort alone asked 9.3-14 GiB and the engine did not start (H200 runs 5 and 6,
``bench/engine-h200/step-time.md``); FlashInfer's kernels do not sort. The rows are independent, so
the chunked result is the same row for row; only the peak memory of the sort changes.
Why the code under test is unchanged: the harness decodes greedily, so these ops only run in the
prewarm rehearsal (which sizes a memory headroom, not tokens); the DFlash / DDTree workers, EAGLE's
verify and the samplers call the same names with the same arguments as on a host with FlashInfer.
"""

import os

import torch


def row_chunked(fn):
    """fn(probs [rows, vocab], param: scalar or one value per row) -> fp32 [rows, vocab], applied to
    at most ``rows`` (default ``H200_RENORM_ROWS``) rows at a time into one output tensor."""

    def wrapper(probs, param, *, rows=None):
        n = int(rows or os.environ.get("H200_RENORM_ROWS", "1024"))
        total = probs.shape[0] if probs.dim() == 2 else 0
        per_row = isinstance(param, torch.Tensor) and param.numel() == total
        scalar = not isinstance(param, torch.Tensor) or param.numel() == 1
        if n < 1 or total <= n or not (per_row or scalar):
            return fn(probs, param)  # small, or a shape the real op should refuse itself
        flat = param.reshape(-1) if per_row else param
        out = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)
        for i in range(0, total, n):
            out[i : i + n] = fn(probs[i : i + n], flat[i : i + n] if per_row else param)
        return out

    wrapper.__name__ = getattr(fn, "__name__", "renorm")
    wrapper.__wrapped__ = fn
    return wrapper


def _bind():
    from sglang.kernels.ops.sampling import renorm_triton

    return (row_chunked(renorm_triton.top_k_renorm_probs_triton), row_chunked(renorm_triton.top_p_renorm_probs_triton))


top_k_renorm_prob, top_p_renorm_prob = _bind()

__all__ = ["top_k_renorm_prob", "top_p_renorm_prob", "row_chunked"]
