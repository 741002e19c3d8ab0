"""Fixtures for the DDTree core tests.

Everything under test is loaded THROUGH THE PATCH SERIES (``ddtree_deploy.build.overlay``): the
modules are the files that ``patches/sglang-0.5.23`` creates, never a copy in the repo.
The shared helpers here are deliberately naive, independent re-implementations (Python loops
over host lists) used as references.
"""

from __future__ import annotations

import itertools
import struct
from typing import List, Sequence, Tuple

import pytest
import torch

DDTREE_MODULE = "sglang.srt.speculative.ddtree_utils"


@pytest.fixture(scope="session")
def du():
    """The patched ``sglang.srt.speculative.ddtree_utils``, imported from the series' build."""
    from ddtree_deploy.build.overlay import import_patched

    return import_patched(DDTREE_MODULE)


@pytest.fixture(scope="session")
def overlay_dir():
    """The series' build output: a dir holding a bare ``sglang/`` tree (for ``PYTHONPATH``)."""
    from ddtree_deploy.build.overlay import build_overlay

    return build_overlay()


# ------------------------------------------------------------------------------------------
# Input generation
# ------------------------------------------------------------------------------------------


def make_topk(bs: int, depth: int, k: int, seed: int, vocab: int = 64, quantize: float | None = None):
    """Per-request, per-depth random top-k: (ids [bs,D,K], full-vocab logprobs sorted desc, roots, starts).

    Each request and depth gets its own random temperature, so distributions differ within a
    batch; ``quantize`` rounds log-probs to a grid (exact ties everywhere, rows stay sorted).
    """
    g = torch.Generator().manual_seed(seed)
    temp = torch.rand((bs, depth, 1), generator=g) * 4.0 + 0.25
    logits = torch.randn((bs, depth, vocab), generator=g) * temp
    lp = torch.log_softmax(logits, dim=-1)
    vals, ids = torch.topk(lp, k, dim=-1)
    if quantize is not None:
        vals = torch.round(vals * quantize) / quantize
    roots = torch.randint(0, vocab, (bs,), generator=g)
    starts = torch.randint(0, 10_000, (bs,), generator=g)
    return ids, vals, roots, starts


# ------------------------------------------------------------------------------------------
# Brute-force references
# ------------------------------------------------------------------------------------------


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0] + 0.0


def brute_force_prefixes(lp_rows: Sequence[Sequence[float]], k: int, budget: int) -> List[Tuple[float, Tuple[int, ...]]]:
    """All prefixes of depth 1..D over ranks 0..k-1, ranked by the contract's total order, top ``budget``.

    Score = float32 left-to-right sum of the per-depth log-probs (computed with torch float32
    scalars, independent of the module's struct trick).
    """
    depth = len(lp_rows)
    allp = []
    for d in range(1, depth + 1):
        for path in itertools.product(range(k), repeat=d):
            s = torch.zeros((), dtype=torch.float32)
            for i, r in enumerate(path):
                s = s + torch.tensor(lp_rows[i][r], dtype=torch.float32)
            allp.append((float(s) + 0.0, path))
    allp.sort(key=lambda sp: (-sp[0], len(sp[1]), sp[1]))
    return allp[:budget]


def tree_paths(tree, b: int) -> List[Tuple[int, ...]]:
    """Rank path of every non-root node of request ``b`` (from parents + ranks)."""
    par = tree.parents[b].tolist()
    rk = tree.ranks[b].tolist()
    paths: List[Tuple[int, ...]] = [()]
    for i in range(1, len(par)):
        paths.append(paths[par[i]] + (rk[i],))
    return paths[1:]


def assert_structure(tree, starts) -> None:
    """Independent structural invariants of a DDTreeTree."""
    bs, n = tree.draft_tokens.shape
    for name in tree._fields:
        t = getattr(tree, name)
        assert t.shape[:2] == (bs, n), name
    assert tree.tree_mask.shape == (bs, n, n)
    assert tree.tree_mask.dtype == torch.bool
    for b in range(bs):
        par = tree.parents[b].tolist()
        dep = tree.depths[b].tolist()
        assert par[0] == -1 and dep[0] == 0 and tree.ranks[b, 0] == -1
        assert float(tree.node_logprobs[b, 0]) == 0.0
        for i in range(1, n):
            assert 0 <= par[i] < i, f"parent of {i} is {par[i]}"
            assert dep[i] == dep[par[i]] + 1
            assert tree.node_logprobs[b, i] <= tree.node_logprobs[b, par[i]]
        assert tree.positions[b].tolist() == [int(starts[b]) + x for x in dep]
        assert tree.retrive_index[b].tolist() == [b * n + i for i in range(n)]
        mask = tree.tree_mask[b].tolist()
        for i in range(n):
            anc, j = set(), i
            while j >= 0:
                anc.add(j)
                j = par[j]
            assert {j for j in range(n) if mask[i][j]} == anc, f"mask row {i}"
        # Reconstruct the parent relation from the retrive links (first child, next sibling).
        nt = tree.retrive_next_token[b].tolist()
        ns = tree.retrive_next_sibling[b].tolist()
        rebuilt = [None] * n
        rebuilt[0] = -1
        todo = [0]
        while todo:
            u = todo.pop()
            c, last = nt[u], -1
            while c != -1:
                assert rebuilt[c] is None, "node reached twice"
                assert c > last, "sibling chain not in increasing index order"
                rebuilt[c] = u
                todo.append(c)
                last, c = c, ns[c]
        assert rebuilt == par


def eagle_verify_greedy(candidates, retrive_index, next_token, next_sibling, target_predict, num_speculative_tokens):
    """A line-by-line Python port of SGLang's ``verify_tree_greedy_kernel_triton`` (greedy tree verify).

    Works on flat global indices exactly like the kernel (``retrive_index = b * N + i``).
    Returns ``(accept_index [bs, S] of GLOBAL indices padded -1, accept_token_num [bs], predicts)``.
    """
    bs, n = candidates.shape
    cand = candidates.reshape(-1).tolist()
    ri = retrive_index.reshape(-1).tolist()
    nt = next_token.reshape(-1).tolist()
    ns = next_sibling.reshape(-1).tolist()
    tp = target_predict.reshape(-1).tolist()
    accept_index = [[-1] * num_speculative_tokens for _ in range(bs)]
    accept_num = [0] * bs
    predicts = [0] * (bs * n)
    for bx in range(bs):
        last = ri[bx * n]
        accept_index[bx][0] = last
        num, cur = 0, 0
        for _j in range(1, num_speculative_tokens):
            cur = nt[bx * n + cur]
            target = tp[last]
            found = False
            while cur != -1:
                draft_index = ri[bx * n + cur]
                if cand[bx * n + cur] == target:
                    predicts[last] = target
                    num += 1
                    accept_index[bx][num] = draft_index
                    last = draft_index
                    found = True
                    break
                cur = ns[bx * n + cur]
            if not found:
                break
        accept_num[bx] = num
        predicts[last] = tp[last]
    return accept_index, accept_num, predicts


@pytest.fixture(scope="session")
def ref():
    """The reference helpers above, as a namespace (test modules do not import conftest)."""
    import types

    return types.SimpleNamespace(
        make_topk=make_topk,
        brute_force_prefixes=brute_force_prefixes,
        tree_paths=tree_paths,
        assert_structure=assert_structure,
        eagle_verify_greedy=eagle_verify_greedy,
    )
