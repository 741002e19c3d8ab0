#!/usr/bin/env python3
"""Tree quality vs the top-K cap: predicted tau(K) / tau(K = min(B, V)) (issue 11, item 4).

Under DDTree's model the expected number of accepted draft tokens of a tree is the sum of its
nodes' prefix probabilities, so the predicted acceptance length of a step is
``tau = 1 + sum_nodes exp(node_logprob)`` (``predicted_accept_length``). The optimal tree of
budget B uses the top ``min(B, V)`` tokens of every depth; a cap K < B can only lose. This tool
builds both trees with the patch series' own builder (``build_ddtree_tree_from_topk``) on
synthetic drafters and reports the ratio, averaged over requests.

Synthetic drafters (depth D = 15, vocabulary V = 32768, ``--requests`` requests each): Zipf-like
distributions, as next-token distributions are: at depth d = 1..15 the logit of the rank-r token
is ``-a log r + 0.3 z`` with ``a = alpha (1 - 0.03 (d - 1)) u``, u uniform in [0.8, 1.2] per request
and depth, z i.i.d. standard normal (seeded), so sharpness varies between requests and decays a
little with depth as a block-diffusion drafter's does. Three sharpnesses: alpha = 1.2 (weak),
1.8 (medium), 3.0 (sharp); the table states each one's mean top-1 probability and optimal tau
at B = 256.

    python tools/bench/bench_tree_quality.py --out bench/tree_quality.md   # CPU, a few minutes

The result is not a timing: it depends only on the inputs and the builder (bit-identical on
every backend), so it is computed on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

DRAFTERS = (("weak", 1.2), ("medium", 1.8), ("sharp", 3.0))
KS = (4, 8, 16, 32, 64)
BUDGETS = (16, 64, 256, 1024)


def load_du():
    from bench_builder import load_ddtree_utils  # this script's sibling: tools/bench/ is sys.path[0] when it runs

    return load_ddtree_utils(None)[0]


def drafter_topk(du, alpha: float, requests: int, depth: int, vocab: int, kmax: int, seed: int):
    """Zipf-like per-depth distributions: logit of the rank-r token = -a log r + 0.3 N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    decay = 1.0 - 0.03 * torch.arange(depth, dtype=torch.float32)
    a = alpha * decay[None, :, None] * (0.8 + 0.4 * torch.rand((requests, depth, 1), generator=g))
    log_rank = torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    logits = -a * log_rank + 0.3 * torch.randn((requests, depth, vocab), generator=g)
    lp = torch.log_softmax(logits, dim=-1)
    vals, ids = torch.topk(lp, kmax, dim=-1)
    return ids, vals, float(vals[:, :, 0].exp().mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--depth", type=int, default=15)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--default-budget", type=int, default=64)
    ap.add_argument("--max-loss", type=float, default=0.005)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    du = load_du()
    kmax = min(max(BUDGETS), args.vocab)
    rows, meta = [], {}
    for di, (name, sigma) in enumerate(DRAFTERS):
        ids, lps, top1 = drafter_topk(du, sigma, args.requests, args.depth, args.vocab, kmax, args.seed + di)
        roots = torch.zeros(args.requests, dtype=torch.int64)
        starts = torch.zeros(args.requests, dtype=torch.int64)

        def tau(k, b):
            t = du.build_ddtree_tree_from_topk(ids[:, :, :k], lps[:, :, :k], roots, starts, b)
            return 1.0 + du.predicted_accept_length(t).double()  # [requests]

        meta[name] = {"alpha": sigma, "mean_top1_prob": top1}
        for b in BUDGETS:
            ref = tau(min(b, args.vocab), b)
            if b == 256:
                meta[name]["tau_opt_B256"] = float(ref.mean())
            row = {"drafter": name, "budget": b, "tau_opt": float(ref.mean())}
            for k in KS:
                row[f"K{k}"] = float((tau(min(k, b), b) / ref).mean()) if k <= b else 1.0
            rows.append(row)
            print(f"[tree_quality] {name} B={b} " + " ".join(f"K{k}={row[f'K{k}']:.4f}" for k in KS), file=sys.stderr)

    worst = {k: min(r[f"K{k}"] for r in rows if r["budget"] == args.default_budget) for k in KS}
    ok = [k for k in KS if 1.0 - worst[k] <= args.max_loss]
    default_k = ok[0] if ok else None
    out = [
        "# Tree quality vs the top-K cap (predicted tau ratio)",
        "",
        "predicted tau(K) / tau(K = min(B, V)), mean over requests; tau = 1 + sum of the tree's prefix "
        "probabilities (DDTree's expected acceptance length). Built with the series' "
        "`build_ddtree_tree_from_topk` (bit-identical on every backend, so computed on the CPU).",
        "",
        f"Synthetic drafters: D = {args.depth}, V = {args.vocab}, {args.requests} requests each, Zipf-like: "
        "the logit of the rank-r token at depth d is -a log r + 0.3 N(0, 1), a = alpha (1 - 0.03 (d - 1)) u, "
        f"u ~ U[0.8, 1.2] per request and depth (seed {args.seed} + drafter index; "
        "`tools/bench/bench_tree_quality.py`).",
        "",
    ]
    for name, m in meta.items():
        out.append(
            f"- {name}: alpha = {m['alpha']}, mean top-1 probability {m['mean_top1_prob']:.3f}, "
            f"optimal tau at B = 256: {m['tau_opt_B256']:.3f}"
        )
    out += ["", "| drafter | B | tau (K = B) | " + " | ".join(f"K = {k}" for k in KS) + " |", "|---|---|---|" + "---|" * len(KS)]
    for r in rows:
        cells = [r["drafter"], r["budget"], f"{r['tau_opt']:.3f}"]
        cells += [("1 (K >= B)" if k >= r["budget"] else f"{r[f'K{k}']:.4f}") for k in KS]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    out += [
        "",
        f"Worst ratio over the three drafters at the default budget B = {args.default_budget}: "
        + ", ".join(f"K = {k}: {worst[k]:.4f}" for k in KS)
        + ".",
        f"Smallest K with a loss <= {100 * args.max_loss:.1f}% there: **K = {default_k}**.",
    ]
    text = "\n".join(out) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    jp = args.json_out or (str(Path(args.out).with_suffix(".json")) if args.out else None)
    if jp:
        Path(jp).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "drafters": meta,
                    "rows": rows,
                    "worst_at_default_budget": worst,
                    "default_topk_cap": default_k,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
