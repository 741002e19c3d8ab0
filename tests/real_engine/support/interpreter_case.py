"""One call of SGLang's extend-attention Triton kernel (``kernels/ops/attention/extend_attention.py``,
the kernel every real-engine verify and prefill runs) under ``TRITON_INTERPRET=1``, on fixed random
inputs: two requests with a KV prefix, one with a custom tree mask over prefix + extend, one causal.

``python interpreter_case.py OUT.pt`` writes the outputs and what the interpreter shim of
``sitecustomize.py`` did ({"out": tensor, "shim": {...}}); ``test_00_interpreter_shim.py`` runs it with
the launch shims on and off (the patched SGLang on PYTHONPATH) and compares.
"""

from __future__ import annotations

import sys

import torch


def main(out_path: str) -> None:
    import triton.runtime.interpreter as interp

    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = 4, 2, 16
    prefix, extend = [37, 5], [9, 6]
    total_kv = sum(prefix) + sum(extend)
    k_buf = torch.randn(total_kv, kv_heads, dim, generator=g)
    v_buf = torch.randn(total_kv, kv_heads, dim, generator=g)
    q = torch.randn(sum(extend), heads, dim, generator=g)
    # Each request's extend tokens are the last rows of its slice of the KV buffer.
    k_ext, v_ext, kv_idx, starts = [], [], [], 0
    for p, e in zip(prefix, extend):
        kv_idx.append(torch.arange(starts, starts + p))
        k_ext.append(k_buf[starts + p : starts + p + e])
        v_ext.append(v_buf[starts + p : starts + p + e])
        starts += p + e
    k_ext, v_ext = torch.cat(k_ext), torch.cat(v_ext)
    kv_indices = torch.cat(kv_idx).to(torch.int64)
    qo_indptr = torch.tensor([0, extend[0], sum(extend)], dtype=torch.int32)
    kv_indptr = torch.tensor([0, prefix[0], sum(prefix)], dtype=torch.int32)
    # A tree mask (each node sees the prefix, its ancestors and itself) for request 0; request 1 causal.
    parents = [-1, 0, 0, 1, 1, 2, 3, 5, 6]
    rows = []
    for r, (p, e) in enumerate(zip(prefix, extend)):
        m = torch.zeros(e, p + e, dtype=torch.bool)
        m[:, :p] = True
        for i in range(e):
            j = i
            while j >= 0:
                m[i, p + j] = True
                j = parents[j] if r == 0 else j - 1
        rows.append(m.reshape(-1))
    custom_mask = torch.cat(rows).to(torch.uint8)
    mask_indptr = torch.tensor([0, extend[0] * (prefix[0] + extend[0]), custom_mask.numel()], dtype=torch.int64)
    o = torch.empty_like(q)
    extend_attention_fwd(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, custom_mask,
                         True, mask_indptr, max(extend), 1.0, 1.0, skip_prefix_custom_mask=False)
    shim = getattr(interp, "_ddtree_shim_stats", None)
    torch.save({"out": o, "shim": dict(shim) if shim is not None else None,
                "sanitize_overflow": interp.interpreter_builder.options.sanitize_overflow}, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
