"""The reference tree builder: the paper's best-first heap, one request at a time, in plain Python.

A test oracle and a CPU baseline for the served builder (``ddtree_utils.build_ddtree_tree_from_topk``,
torch and the fused Triton kernel): same arguments, same ten fields in the same order, the same nodes
in the same order, bit for bit. Everything here is computed independently of the served code: the
node count falls out of the heap (it stops at ``budget`` nodes or when every prefix is taken), the
scores are float32 sums rounded on the host, and the mask and retrive arrays come from Python loops.

It synchronizes with the host and walks every request in Python, so SGLang never runs it; it lived
in ``ddtree_utils.py`` until the series kept only serving code there (issue 24). Importing it needs
torch only.
"""

from __future__ import annotations

import heapq
import math
import struct
from typing import List, NamedTuple, Sequence, Tuple

import torch

__all__ = ["HeapTree", "build_ddtree_tree_heap"]


class _HeapTreeFields(NamedTuple):
    draft_tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    positions: torch.Tensor
    tree_mask: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    node_logprobs: torch.Tensor
    ranks: torch.Tensor


class HeapTree(_HeapTreeFields):
    """The ten fields of SGLang's ``DDTreeTree`` (same names, order, dtypes and shapes), plus
    ``max_depth`` (the drafter depth D) as an attribute outside the tuple, as ``DDTreeTree`` has it,
    so ``ddtree_accept`` sizes its walk the same way for either."""

    max_depth: int


def _f32(x: float) -> float:
    """Round a Python float to the nearest float32 (as torch does), -0.0 -> +0.0."""
    try:
        y = struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        y = math.copysign(math.inf, x)
    return float(y) + 0.0


def _f32_add(a: float, b: float) -> float:
    # a and b are float32 values; their double sum rounded to float32 is the correctly rounded
    # float32 sum (a double has more than 2 * 24 + 2 bits of precision).
    return _f32(a + b)


def _heap_nodes(lp_rows: Sequence[Sequence[float]], k: int, m: int) -> List[Tuple[float, Tuple[int, ...]]]:
    """``(score, rank_path)`` of the first ``m`` prefixes in the total order (fewer if there are fewer).

    Candidates are keyed ``(-score, depth, rank_path)``: higher score first, then shallower, then the
    lexicographically smaller rank path. Each pop pushes the popped prefix's next sibling and its first
    child.
    """
    depth = len(lp_rows)
    out: List[Tuple[float, Tuple[int, ...]]] = []
    if m <= 0 or depth == 0 or k == 0:
        return out
    # (-score, depth, rank_path, parent_score); rank paths are unique, so the comparison never reaches
    # parent_score.
    heap = [(-_f32_add(0.0, lp_rows[0][0]), 1, (0,), 0.0)]
    while heap and len(out) < m:
        neg, d, path, parent_score = heapq.heappop(heap)
        score = -neg + 0.0
        out.append((score, path))
        if path[-1] + 1 < k:
            sibling = path[:-1] + (path[-1] + 1,)
            heapq.heappush(heap, (-_f32_add(parent_score, lp_rows[d - 1][path[-1] + 1]), d, sibling, parent_score))
        if d < depth:
            heapq.heappush(heap, (-_f32_add(score, lp_rows[d][0]), d + 1, path + (0,), score))
    return out


def build_ddtree_tree_heap(
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    root_tokens: torch.Tensor,
    start_positions: torch.Tensor,
    budget: int,
) -> HeapTree:
    """The tree of the ``budget`` most probable prefixes, by the paper's max-heap (see the module)."""
    if topk_ids.dim() != 3 or tuple(topk_logprobs.shape) != tuple(topk_ids.shape):
        raise ValueError(
            f"topk_ids and topk_logprobs must both be [bs, D, K]; got {tuple(topk_ids.shape)} and {tuple(topk_logprobs.shape)}"
        )
    bs, depth, k = topk_ids.shape
    if tuple(root_tokens.shape) != (bs,) or tuple(start_positions.shape) != (bs,):
        raise ValueError(f"root_tokens and start_positions must be [bs]={bs}")
    if int(budget) < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    device = topk_ids.device
    ids_all = topk_ids.to(torch.int64).cpu().tolist()
    lps_all = topk_logprobs.to(torch.float32).cpu().tolist()
    roots = root_tokens.to(torch.int64).cpu().tolist()
    starts = start_positions.to(torch.int64).cpu().tolist()

    cols: dict = {name: [] for name in HeapTree._fields}
    # Nodes per request: the heap's own count (budget, or every prefix when there are fewer); it depends
    # on (D, K, budget) only, so a run over zero log-probs gives it even for an empty batch.
    n = len(_heap_nodes([[0.0] * k] * depth, k, int(budget))) + 1
    for b in range(bs):
        nodes = _heap_nodes(lps_all[b], k, int(budget))
        assert len(nodes) + 1 == n
        index_of = {(): 0}
        toks, pars, deps, lps, rks = [roots[b]], [-1], [0], [0.0], [-1]
        for i, (score, path) in enumerate(nodes, start=1):
            index_of[path] = i
            toks.append(ids_all[b][len(path) - 1][path[-1]])
            pars.append(index_of[path[:-1]])
            deps.append(len(path))
            lps.append(score)
            rks.append(path[-1])
        mask = [[False] * n for _ in range(n)]
        for i in range(n):
            j = i
            while j >= 0:
                mask[i][j] = True
                j = pars[j]
        nxt_tok, nxt_sib = [-1] * n, [-1] * n
        last_child: dict = {}
        for i in range(1, n):
            p = pars[i]
            if p in last_child:
                nxt_sib[last_child[p]] = i
            else:
                nxt_tok[p] = i
            last_child[p] = i
        cols["draft_tokens"].append(toks)
        cols["parents"].append(pars)
        cols["depths"].append(deps)
        cols["positions"].append([starts[b] + x for x in deps])
        cols["tree_mask"].append(mask)
        cols["retrive_index"].append([b * n + i for i in range(n)])
        cols["retrive_next_token"].append(nxt_tok)
        cols["retrive_next_sibling"].append(nxt_sib)
        cols["node_logprobs"].append(lps)
        cols["ranks"].append(rks)

    def t(name: str, dtype: torch.dtype, shape: Tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(cols[name], dtype=dtype).reshape(shape).to(device)

    long = torch.int64
    tree = HeapTree(
        t("draft_tokens", long, (bs, n)),
        t("parents", long, (bs, n)),
        t("depths", long, (bs, n)),
        t("positions", long, (bs, n)),
        t("tree_mask", torch.bool, (bs, n, n)),
        t("retrive_index", long, (bs, n)),
        t("retrive_next_token", long, (bs, n)),
        t("retrive_next_sibling", long, (bs, n)),
        t("node_logprobs", torch.float32, (bs, n)),
        t("ranks", long, (bs, n)),
    )
    tree.max_depth = depth
    return tree
