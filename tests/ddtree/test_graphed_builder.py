"""``GraphedTreeBuilder``: the builder replayed from CUDA graphs, equal to the eager builder.

On this CPU machine the class must fall back to the eager builder (checked here, bit for bit);
its CUDA path (capture, replay, a new shape, LRU eviction) needs a GPU and is checked by
``tools/gpu_suite.py`` on an H200 (result committed in ``bench/gpu_suite-h200.log``) and by the
CUDA test below wherever one is present.
"""

from __future__ import annotations

import pytest
import torch

FIELDS = ("draft_tokens", "parents", "depths", "positions", "tree_mask", "retrive_index",
          "retrive_next_token", "retrive_next_sibling", "node_logprobs", "ranks")


def _inputs(du, bs, depth, k, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, depth, 50, generator=g) * 3
    ids, lps = du.topk_logprobs_from_logits(logits, k)
    root = torch.randint(0, 50, (bs,), generator=g)
    start = torch.randint(0, 100, (bs,), generator=g)
    return tuple(x.to(device) for x in (ids, lps, root, start))


def _same(a, b):
    return all(torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu()) for f in FIELDS) and a.max_depth == b.max_depth


@pytest.mark.parametrize("bs,depth,k,budget", [(1, 15, 8, 64), (3, 6, 4, 32), (2, 3, 2, 100)])
def test_cpu_falls_back_to_the_eager_builder(du, bs, depth, k, budget):
    builder = du.GraphedTreeBuilder(budget)
    for seed in range(3):
        x = _inputs(du, bs, depth, k, seed)
        assert _same(builder(*x), du.build_ddtree_tree_from_topk(*x, budget))
    assert builder.num_graphs == 0 and builder.failed is None


def test_disabled_by_environment(du, monkeypatch):
    monkeypatch.setenv(du.GRAPH_BUILDER_ENV, "0")
    assert du.GraphedTreeBuilder(16).enabled is False
    monkeypatch.setenv(du.GRAPH_BUILDER_ENV, "1")
    assert du.GraphedTreeBuilder(16).enabled is True
    assert du.GraphedTreeBuilder(16, enabled=False).enabled is False


def test_bad_inputs_are_refused_like_the_builder(du):
    builder = du.GraphedTreeBuilder(8)
    ids, lps, root, start = _inputs(du, 2, 4, 3, 0)
    with pytest.raises(ValueError):
        builder(ids, lps[:, :, :2], root, start)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run by tools/gpu_suite.py on an H200)")
def test_cuda_replay_equals_eager_across_shapes_and_eviction(du):
    builder = du.GraphedTreeBuilder(64, max_graphs=2)
    shapes = [(1, 15, 8), (4, 15, 8), (1, 15, 8), (2, 5, 3), (4, 15, 8)]
    for i, (bs, depth, k) in enumerate(shapes):
        x = _inputs(du, bs, depth, k, 100 + i, "cuda")
        assert _same(builder(*x), du.build_ddtree_tree_from_topk(*x, 64))
    assert builder.failed is None and builder.num_graphs == 2
