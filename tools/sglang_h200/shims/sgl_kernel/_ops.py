"""The shimmed ``sgl_kernel`` ops, in torch (see the package doc and docs/h200-harness.md).

Each op: the SGLang 0.5.23 call site that reaches it on CUDA (file:line in the pinned wheel), what the
CUDA kernel computes (sgl-kernel's csrc, which wraps FlashInfer's norm/activation kernels), and the
independent torch reference ``tools/sglang_h200/check_ops.py`` checks it against.

Numerics follow the CUDA kernels: fp32 accumulation, one rounding to the output dtype at the end.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _mark(name):
    from . import _log

    _log("call", f"sgl_kernel.{name}")


# --- norms: sglang/srt/layers/layernorm.py:102 (import), :628 fused_add_rmsnorm, :631 rmsnorm
#     (RMSNorm.forward_cuda); :1143/:1147 gemma_* (GemmaRMSNorm). Qwen3 calls rmsnorm for q/k norm and
#     the final norm, fused_add_rmsnorm for every decoder layer's input/post-attention norm.


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    _mark("rmsnorm")
    x = input.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if out is None:
        return y.to(input.dtype)
    out.copy_(y)
    return out


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """In place: ``residual <- input + residual``; ``input <- rmsnorm(residual) * weight``.

    As FlashInfer's FusedAddRMSNorm: the sum is formed in fp32, stored to ``residual`` in its dtype, and
    the norm is taken of the fp32 sum."""
    _mark("fused_add_rmsnorm")
    s = input.float() + residual.float()
    residual.copy_(s)
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    input.copy_(y)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    _mark("gemma_rmsnorm")
    x = input.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    if out is None:
        return y.to(input.dtype)
    out.copy_(y)
    return out


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _mark("gemma_fused_add_rmsnorm")
    s = input.float() + residual.float()
    residual.copy_(s)
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    input.copy_(y)


# --- activations: sglang/srt/layers/activation.py:60-62/:108-110 (imports); SiluAndMul.forward_cuda
#     calls silu_and_mul(x, out) for every MLP (Qwen3MLP.act_fn).


def _gated(name, act, input, out):
    _mark(name)
    d = input.shape[-1] // 2
    x = input.float()
    y = act(x[..., :d]) * x[..., d:]
    if out is None:
        return y.to(input.dtype)
    out.copy_(y)
    return out


def silu_and_mul(input, out=None, enable_pdl=None):
    return _gated("silu_and_mul", F.silu, input, out)


def gelu_and_mul(input, out=None, enable_pdl=None):
    return _gated("gelu_and_mul", lambda t: F.gelu(t, approximate="none"), input, out)


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    return _gated("gelu_tanh_and_mul", lambda t: F.gelu(t, approximate="tanh"), input, out)


# --- sampling renorms: sglang/srt/layers/sampler.py:40 (import); only reached at temperature > 0
#     with top-k / top-p set. Greedy (the harness's runs) never calls them.


def _flashinfer_sampling():
    """FlashInfer's sampling module when the carry holds it (H200_FLASHINFER=1), else None."""
    import os

    if os.environ.get("H200_FLASHINFER") != "1":
        return None
    import flashinfer.sampling

    return flashinfer.sampling


def top_k_renorm_prob(probs, top_k, *args, **kwargs):
    # With FlashInfer carried: the kernel sgl-kernel's top_k_renorm_prob wraps (FlashInfer's
    # top_k_renorm_probs, csrc/renorm.cu), so T > 0 runs through the real renorm.
    fi = _flashinfer_sampling()
    if fi is not None:
        _mark("top_k_renorm_prob->flashinfer")
        return fi.top_k_renorm_probs(probs, top_k)
    _mark("top_k_renorm_prob")
    p = probs.float()
    k = top_k if torch.is_tensor(top_k) else torch.full((p.shape[0],), int(top_k), device=p.device)
    k = k.to(torch.long).clamp(1, p.shape[-1]).view(-1, 1)
    sorted_p, _ = p.sort(dim=-1, descending=True)
    pivot = sorted_p.gather(-1, k - 1)
    p = torch.where(p >= pivot, p, torch.zeros_like(p))
    return (p / p.sum(-1, keepdim=True)).to(probs.dtype)


def top_p_renorm_prob(probs, top_p, *args, **kwargs):
    fi = _flashinfer_sampling()
    if fi is not None:
        _mark("top_p_renorm_prob->flashinfer")
        return fi.top_p_renorm_probs(probs, top_p)
    _mark("top_p_renorm_prob")
    p = probs.float()
    tp = top_p if torch.is_tensor(top_p) else torch.full((p.shape[0],), float(top_p), device=p.device)
    tp = tp.float().view(-1, 1)
    sorted_p, idx = p.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    keep_sorted = before < tp
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    p = torch.where(keep, p, torch.zeros_like(p))
    return (p / p.sum(-1, keepdim=True)).to(probs.dtype)


# --- graphs: sglang/srt/model_executor/runner_backend_utils/weak_ref_tensor.py:8 (import); the CUDA graph
#     runner keeps weak references to graph outputs so their memory can be reused. The shim returns
#     the tensor itself (a strong reference): outputs stay alive a little longer, values are identical.


def weak_ref_tensor(tensor):
    _mark("weak_ref_tensor")
    return tensor


SHIMMED = {
    f.__name__: f
    for f in (
        rmsnorm,
        fused_add_rmsnorm,
        gemma_rmsnorm,
        gemma_fused_add_rmsnorm,
        silu_and_mul,
        gelu_and_mul,
        gelu_tanh_and_mul,
        top_k_renorm_prob,
        top_p_renorm_prob,
        weak_ref_tensor,
    )
}
