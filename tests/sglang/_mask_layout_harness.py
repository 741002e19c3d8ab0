"""The verify-mask layout DDTreeWorkerV2 hands the target attention backend (patch ddtree-verify-mask-layout).

Run in a subprocess with PYTHONPATH = a patched sglang tree, as on SGLang's CPU engine
(SGLANG_USE_CPU_ENGINE=1: ``eagle_utils.default_tree_mask_mode()`` returns QLEN_ONLY there, the
intel_amx layout). REAL: the attention backend classes' ``verify_tree_mask_mode`` /
``verify_mask`` (Triton, FlashInfer, intel_amx, the hybrid-linear wrapper around Triton),
``DDTreeWorkerV2._make_verify_input``, ``build_ddtree_tree_from_topk``,
``DDTreeVerifyInput.from_tree``. STOOD IN: the backends are created with ``object.__new__``
and only the fields their ``verify_mask`` reads (``_verify_mask = None``: CUDA graphs off, as
under DDTREE); their __init__ needs a model runner. The worker likewise (object.__new__ with
the fields ``_make_verify_input`` reads). Neither changes the code under test: the layout
decision and the mask construction run as shipped.
"""

from __future__ import annotations

import json
import types

import torch


def full_layout(tree_mask, prefix) -> list:
    """EAGLE's FULL_MASK layout written out cell by cell: per request, N rows of
    (prefix + N) cells, the prefix cells visible, then that row of the ancestor mask."""
    out = []
    n = tree_mask.shape[1]
    for b in range(tree_mask.shape[0]):
        for r in range(n):
            out += [True] * int(prefix[b]) + [bool(x) for x in tree_mask[b, r]]
    return out


def main() -> None:
    from sglang.srt.speculative import eagle_utils

    # SGLang's CPU engine: SGLANG_USE_CPU_ENGINE=1 makes is_cpu() true and eagle_utils'
    # module-level _is_cpu (eagle_utils.py:52) with it; setting the env var here would also
    # need the sgl_kernel CPU ops at import (cache_move.py:10), so set the flag it computes.
    eagle_utils._is_cpu = True
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
        HybridLinearAttnBackend,
    )
    from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.speculative import ddtree_worker_v2 as W
    from sglang.srt.speculative.ddtree_utils import build_ddtree_tree_from_topk
    from sglang.srt.speculative.eagle_utils import default_tree_mask_mode

    backends = {}
    tri = object.__new__(TritonAttnBackend)
    tri._verify_mask = None
    tri.max_context_len = 64
    backends["triton"] = tri
    amx = object.__new__(IntelAMXAttnBackend)
    amx.max_context_len = 64
    backends["intel_amx"] = amx
    hyb = object.__new__(HybridLinearAttnBackend)
    hyb.full_attn_backend = tri
    hyb.max_context_len = 64
    backends["hybrid_linear(triton)"] = hyb
    try:
        from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

        fi = object.__new__(FlashInferAttnBackend)
        fi.max_context_len = 64
        backends["flashinfer"] = fi
    except Exception as e:  # noqa: BLE001 -- flashinfer is not installed on a CPU host
        backends["flashinfer"] = None
        flashinfer_error = repr(e)

    bs, depth, k, budget, block = 2, 3, 2, 5, 4
    n = budget + 1
    g = torch.Generator().manual_seed(0)
    topk_ids = torch.randint(2, 30, (bs, depth, k), generator=g)
    topk_lp = torch.sort(torch.log_softmax(torch.randn(bs, depth, k, generator=g), -1),
                         dim=-1, descending=True).values
    prefix = torch.tensor([7, 3])
    tree = build_ddtree_tree_from_topk(topk_ids, topk_lp, torch.tensor([1, 2]), prefix, budget)

    report = {"default_mode": default_tree_mask_mode().name, "backends": {}}
    if backends["flashinfer"] is None:
        report["flashinfer_error"] = flashinfer_error
    for name, be in backends.items():
        if be is None:
            continue
        w = object.__new__(W.DDTreeWorkerV2)
        w.__dict__.update(block_size=block, ddtree_budget=budget, ddtree_topk=k,
                          ddtree_metrics=None)
        w._target_worker = types.SimpleNamespace(
            model_runner=types.SimpleNamespace(attn_backend=be))
        vi = w._make_verify_input(types.SimpleNamespace(seq_lens_sum=int(prefix.sum())),
                                  tree, prefix, bs, budget)
        mask = vi.custom_mask.reshape(-1).bool().tolist()
        report["backends"][name] = {
            "mode": be.verify_tree_mask_mode.name,
            "is_full_layout": mask == full_layout(tree.tree_mask, prefix),
            "is_qlen_layout": mask == tree.tree_mask.reshape(-1).tolist(),
        }
    # Builder input at the worker boundary: NaN logits and rounding above the lse.
    ids = torch.tensor([[3, 4, 5, 6]])
    logits = torch.tensor([[float("nan"), 2.0, 1.0, 0.5]])
    lse = torch.tensor([1.9])  # below the top logit: log q would be +0.1
    _, lp = W.ddtree_guard_topk(ids, logits - lse.unsqueeze(-1))
    report["boundary_logprobs"] = [float(x) for x in lp.reshape(-1)]
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
