"""build_ddtree_tree_from_topk vs brute force and vs the heap oracle; structure invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_offline.heap_oracle import build_ddtree_tree_heap

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True)


def assert_same_tree(a, b) -> None:
    assert a._fields == b._fields
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        assert x.shape == y.shape, name
        assert torch.equal(x, y), f"field {name} differs"


def check_against_brute_force(du, ref, ids, lps, roots, starts, budget):
    bs, depth, k = ids.shape
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, budget)
    n_possible = sum(k ** d for d in range(1, depth + 1))
    assert tree.draft_tokens.shape == (bs, min(budget, n_possible) + 1)
    for b in range(bs):
        want = ref.brute_force_prefixes(lps[b].tolist(), k, budget)
        got_paths = ref.tree_paths(tree, b)
        assert got_paths == [p for _, p in want], f"request {b}: node set/order differs"
        assert tree.node_logprobs[b, 1:].tolist() == [s for s, _ in want]
        assert tree.draft_tokens[b, 0] == roots[b]
        for i, path in enumerate(got_paths, start=1):
            assert tree.draft_tokens[b, i] == ids[b, len(path) - 1, path[-1]]
            assert tree.depths[b, i] == len(path)
    return tree


# Small enough that every prefix can be enumerated.
small_shapes = st.sampled_from([(1, 1), (1, 5), (2, 1), (2, 3), (2, 5), (3, 2), (3, 4), (4, 2), (4, 3), (5, 2), (6, 1)])


@SETTINGS
@given(shape=small_shapes, bs=st.integers(1, 3), budget=st.integers(1, 160), seed=st.integers(0, 10**6),
       quantize=st.sampled_from([None, None, 4.0, 1.0, 0.25]))
def test_builder_matches_brute_force(du, ref, shape, bs, budget, seed, quantize):
    depth, k = shape
    ids, lps, roots, starts = ref.make_topk(bs, depth, k, seed, quantize=quantize)
    tree = check_against_brute_force(du, ref, ids, lps, roots, starts, budget)
    ref.assert_structure(tree, starts)


@SETTINGS
@given(bs=st.integers(1, 4), depth=st.integers(1, 8), k=st.integers(1, 8), budget=st.integers(1, 300),
       seed=st.integers(0, 10**6), quantize=st.sampled_from([None, None, 8.0, 2.0, 0.5]))
def test_builder_matches_heap_oracle(du, ref, bs, depth, k, budget, seed, quantize):
    ids, lps, roots, starts = ref.make_topk(bs, depth, k, seed, quantize=quantize)
    fast = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, budget)
    oracle = build_ddtree_tree_heap(ids, lps, roots, starts, budget)
    assert_same_tree(fast, oracle)
    ref.assert_structure(fast, starts)
    assert fast.max_depth == depth == oracle.max_depth


def test_per_request_distributions_differ_in_one_batch(du, ref):
    """Each row of the batch is its own tree: equal to building it alone."""
    ids, lps, roots, starts = ref.make_topk(4, 4, 3, seed=7)
    lps[1] = torch.round(lps[1] * 2) / 2  # one request full of ties
    lps[2, :, :] = lps[2, :, :1] - torch.arange(3).float() * 1e-3  # a flat, near-uniform one
    batch = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 40)
    shapes = set()
    for b in range(4):
        alone = du.build_ddtree_tree_from_topk(ids[b:b + 1], lps[b:b + 1], roots[b:b + 1], starts[b:b + 1], 40)
        for name in batch._fields:
            if name == "retrive_index":
                assert torch.equal(getattr(batch, name)[b] - b * 41, getattr(alone, name)[0])
            else:
                assert torch.equal(getattr(batch, name)[b], getattr(alone, name)[0]), name
        shapes.add(tuple(batch.depths[b].tolist()))
    assert len(shapes) > 1, "the requests should have produced different tree shapes"
    check_against_brute_force(du, ref, ids, lps, roots, starts, 40)


def test_all_ties_breaks_by_depth_then_rank_path(du, ref):
    """All log-probs 0: every prefix ties, so the order is shallower first, then lexicographic."""
    ids = torch.stack([torch.randperm(20, generator=torch.Generator().manual_seed(d))[:3] for d in range(3)]).unsqueeze(0)
    lps = torch.zeros(1, 3, 3)
    tree = du.build_ddtree_tree_from_topk(ids, lps, torch.tensor([5]), torch.tensor([0]), 8)
    assert ref.tree_paths(tree, 0) == [(0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert_same_tree(tree, build_ddtree_tree_heap(ids, lps, torch.tensor([5]), torch.tensor([0]), 8))


def test_budget_larger_than_all_prefixes(du, ref):
    ids, lps, roots, starts = ref.make_topk(2, 3, 2, seed=3)
    tree = check_against_brute_force(du, ref, ids, lps, roots, starts, 1000)
    assert tree.draft_tokens.shape == (2, 2 + 4 + 8 + 1)  # every prefix
    ref.assert_structure(tree, starts)
    assert_same_tree(tree, build_ddtree_tree_heap(ids, lps, roots, starts, 1000))


def test_k1_is_a_chain(du, ref):
    ids, lps, roots, starts = ref.make_topk(3, 15, 1, seed=11)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 64)
    assert tree.draft_tokens.shape == (3, 16)
    assert torch.equal(tree.parents, torch.arange(-1, 15).expand(3, 16))
    assert torch.equal(tree.depths, torch.arange(16).expand(3, 16))
    assert torch.equal(tree.draft_tokens[:, 1:], ids[:, :, 0])
    assert torch.equal(tree.tree_mask, torch.tril(torch.ones(16, 16, dtype=torch.bool)).expand(3, 16, 16))
    assert_same_tree(tree, build_ddtree_tree_heap(ids, lps, roots, starts, 64))


def test_budget_one(du, ref):
    ids, lps, roots, starts = ref.make_topk(3, 5, 4, seed=5)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 1)
    assert tree.draft_tokens.shape == (3, 2)
    assert torch.equal(tree.draft_tokens[:, 1], ids[:, 0, 0])
    assert torch.equal(tree.parents, torch.tensor([[-1, 0]] * 3))
    assert torch.equal(tree.node_logprobs[:, 1], lps[:, 0, 0])
    assert_same_tree(tree, build_ddtree_tree_heap(ids, lps, roots, starts, 1))


def test_depth_one(du, ref):
    ids, lps, roots, starts = ref.make_topk(2, 1, 6, seed=9)
    tree = check_against_brute_force(du, ref, ids, lps, roots, starts, 4)
    assert torch.equal(tree.draft_tokens[:, 1:], ids[:, 0, :4])
    assert torch.equal(tree.ranks[:, 1:], torch.arange(4).expand(2, 4))
    assert torch.equal(tree.retrive_next_token[:, 0], torch.tensor([1, 1]))
    assert torch.equal(tree.retrive_next_sibling, torch.tensor([[-1, 2, 3, 4, -1]] * 2))


def test_topk_wider_than_budget(du, ref):
    """K > B: only the top B ranks can appear; still equal to brute force and the heap."""
    ids, lps, roots, starts = ref.make_topk(2, 2, 12, seed=13, vocab=40)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 5)
    oracle = build_ddtree_tree_heap(ids, lps, roots, starts, 5)
    assert_same_tree(tree, oracle)
    for b in range(2):
        assert ref.tree_paths(tree, b) == [p for _, p in ref.brute_force_prefixes(lps[b].tolist(), 12, 5)]


def test_reference_scale_matches_heap(du, ref):
    """D=15 (b16 drafters), K=8, B up to 512: the serving shapes."""
    for budget, seed in ((16, 0), (128, 1), (512, 2)):
        ids, lps, roots, starts = ref.make_topk(2, 15, 8, seed=seed, vocab=300)
        tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, budget)
        assert_same_tree(tree, build_ddtree_tree_heap(ids, lps, roots, starts, budget))
        assert tree.draft_tokens.shape == (2, budget + 1)


def test_out_buffers_are_filled(du, ref):
    ids, lps, roots, starts = ref.make_topk(2, 4, 3, seed=21)
    want = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 20)
    out = du.DDTreeTree(*[torch.empty_like(t) for t in want])
    got = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 20, out=out)
    assert all(g.data_ptr() == o.data_ptr() for g, o in zip(got, out))
    assert_same_tree(got, want)
    assert got.max_depth == 4


def test_num_nodes_and_contract_fields(du, ref):
    assert du.ddtree_num_nodes(15, 8, 512) == 512
    assert du.ddtree_num_nodes(3, 2, 1000) == 14
    assert du.ddtree_num_nodes(15, 1, 64) == 15
    assert du.DDTreeTree._fields == (
        "draft_tokens", "parents", "depths", "positions", "tree_mask", "retrive_index",
        "retrive_next_token", "retrive_next_sibling", "node_logprobs", "ranks")
    ids, lps, roots, starts = ref.make_topk(1, 2, 2, seed=1)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 3)
    assert len(tree) == 10 and len(tuple(tree)) == 10
    assert tree._replace(ranks=tree.ranks).max_depth == 2
    assert tree.node_logprobs.dtype == torch.float32
    assert all(getattr(tree, f).dtype == torch.int64 for f in tree._fields if f not in ("tree_mask", "node_logprobs"))


def test_rejects_bad_shapes(du, ref):
    ids, lps, roots, starts = ref.make_topk(2, 3, 2, seed=1)
    with pytest.raises(ValueError):
        du.build_ddtree_tree_from_topk(ids, lps[:, :2], roots, starts, 4)
    with pytest.raises(ValueError):
        du.build_ddtree_tree_from_topk(ids, lps, roots[:1], starts, 4)


def test_topk_logprobs_from_logits(du, ref):
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(0))
    ids, lps = du.topk_logprobs_from_logits(logits, 5)
    full = torch.log_softmax(logits, dim=-1)
    assert ids.shape == lps.shape == (2, 3, 5)
    assert torch.allclose(lps, full.gather(-1, ids))
    assert torch.all(lps[..., :-1] >= lps[..., 1:])
    assert torch.equal(ids[..., 0], logits.argmax(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_builder_no_host_sync_and_matches_cpu(du, ref):
    ids, lps, roots, starts = ref.make_topk(4, 15, 8, seed=4, vocab=300)
    cpu = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 256)
    args = [t.cuda() for t in (ids, lps, roots, starts)]
    du.build_ddtree_tree_from_topk(*args, 256)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu = du.build_ddtree_tree_from_topk(*args, 256)
        acc = du.ddtree_accept(gpu, gpu.draft_tokens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same_tree(du.DDTreeTree(*[t.cpu() for t in gpu]), cpu)
    assert acc.accepted_nodes.is_cuda


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_of_builder_and_walk(du, ref):
    ids, lps, roots, starts = [t.cuda() for t in ref.make_topk(2, 15, 8, seed=6, vocab=300)]
    targets = torch.zeros((2, 65), dtype=torch.long, device="cuda")

    def step():
        tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 64)
        return tree, du.ddtree_accept(tree, targets)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_tree, static_acc = step()
    # New inputs in the same buffers: the replay must follow them.
    new = ref.make_topk(2, 15, 8, seed=7, vocab=300)
    for dst, src in zip((ids, lps, roots, starts), new):
        dst.copy_(src)
    targets.copy_(torch.randint(0, 300, (2, 65)))
    graph.replay()
    torch.cuda.synchronize()
    want_tree, want_acc = step()
    assert_same_tree(du.DDTreeTree(*static_tree), du.DDTreeTree(*want_tree))
    for a, b in zip(static_acc, want_acc):
        assert torch.equal(a, b)
    assert_same_tree(du.DDTreeTree(*[t.cpu() for t in static_tree]), build_ddtree_tree_heap(*new, 64))
