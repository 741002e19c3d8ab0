"""Micro-benchmark of one DDTree round's non-model work on a device.

For each budget B: per-depth top-K of random full-vocab log-probs (K = min(B, V)),
``build_ddtree_tree_from_topk``, the 4-D additive mask, ``sample_target_tokens`` on random logits,
``ddtree_accept``, and ``predicted_accept_length``. Median milliseconds of ``--reps`` timed
repetitions after warm-up, with device synchronization around each stage. Model forwards are
NOT included (see ``sweep`` for those).
"""

from __future__ import annotations

import statistics
import time

import torch

from .core import ddtree_utils
from .engine import tree_attention_mask
from .sampling import positional_gumbel, sample_target_tokens


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bench(
    device="cpu", vocab=32000, depth=15, budgets=(16, 32, 64, 128, 256, 512), reps=20, prefix=1024, temperature=0.0, seed=0
) -> list[dict]:
    """Return one dict per budget with median ms per stage."""
    du = ddtree_utils()
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    logq = torch.log_softmax(torch.randn(depth, vocab, generator=g) * 3, -1).to(dev)
    rows = []
    for B in budgets:
        K = min(B, vocab)
        times = {k: [] for k in ("topk", "build", "mask", "sample", "accept", "predicted")}
        for r in range(reps + 3):
            t = {}
            _sync(dev)
            t0 = time.perf_counter()
            lp, ids = torch.topk(logq, K, dim=-1)
            _sync(dev)
            t["topk"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            tree = du.build_ddtree_tree_from_topk(
                ids[None], lp[None], torch.tensor([1], device=dev), torch.tensor([prefix], device=dev), B
            )
            _sync(dev)
            t["build"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            tree_attention_mask(tree.tree_mask, prefix, torch.bfloat16)
            _sync(dev)
            t["mask"] = time.perf_counter() - t0
            N = tree.draft_tokens.shape[1]
            logits = torch.randn(1, N, vocab, device=dev, dtype=torch.bfloat16)
            _sync(dev)
            t0 = time.perf_counter()
            gum = positional_gumbel(torch.tensor([seed], device=dev), tree.positions, vocab) if temperature > 0 else None
            tt = sample_target_tokens(logits, temperature, gum)
            _sync(dev)
            t["sample"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            du.ddtree_accept(tree, tt)
            _sync(dev)
            t["accept"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            du.predicted_accept_length(tree)
            _sync(dev)
            t["predicted"] = time.perf_counter() - t0
            if r >= 3:
                for k, v in t.items():
                    times[k].append(v)
        row = {"budget": B, "K": K, "num_nodes": int(tree.draft_tokens.shape[1]) - 1}
        row.update({f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()})
        row["total_ms"] = sum(row[f"{k}_ms"] for k in times)
        rows.append(row)
    return rows


def to_markdown(rows: list[dict], header: str) -> str:
    cols = ["budget", "K", "num_nodes", "topk_ms", "build_ms", "mask_ms", "sample_ms", "accept_ms", "predicted_ms", "total_ms"]
    out = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(str(r[c]) if isinstance(r[c], int) else f"{r[c]:.3f}" for c in cols) + " |")
    return "\n".join(out) + "\n"
