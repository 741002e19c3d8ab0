"""ddtree_accept vs a port of SGLang's greedy tree verify; predicted_accept_length."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings, strategies as st

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True)


def random_path_targets(tree, gen, vocab, follow_prob=1.0):
    """Random target tokens, except along the root->node path of a random node (deepest-biased)."""
    bs, n = tree.draft_tokens.shape
    target = torch.randint(0, vocab, (bs, n), generator=gen)
    for b in range(bs):
        if float(torch.rand((), generator=gen)) > follow_prob:
            continue
        # Bias toward deep nodes: take the deepest of a few random picks.
        picks = torch.randint(0, n, (3,), generator=gen).tolist()
        i = max(picks, key=lambda j: (int(tree.depths[b, j]), j))
        while i > 0:
            p = int(tree.parents[b, i])
            target[b, p] = tree.draft_tokens[b, i]
            i = p
    return target


def compare_with_eagle(du, ref, tree, target, depth):
    acc = du.ddtree_accept(tree, target)
    bs, n = tree.draft_tokens.shape
    assert acc.accepted_nodes.shape == (bs, depth + 1)
    assert acc.accept_length.shape == acc.bonus_tokens.shape == (bs,)
    idx, num, _ = ref.eagle_verify_greedy(tree.draft_tokens, tree.retrive_index, tree.retrive_next_token,
                                          tree.retrive_next_sibling, target, depth + 1)
    for b in range(bs):
        local = [x - b * n if x >= 0 else -1 for x in idx[b]]
        assert acc.accepted_nodes[b].tolist() == local, f"request {b}"
        assert int(acc.accept_length[b]) == num[b]
        last = local[num[b]]
        assert int(acc.bonus_tokens[b]) == int(target[b, last])
        # The accepted path is a root-to-node chain whose tokens are what the target proposed.
        for j in range(1, num[b] + 1):
            node, prev = local[j], local[j - 1]
            assert int(tree.parents[b, node]) == prev
            assert int(tree.draft_tokens[b, node]) == int(target[b, prev])
    return acc


@SETTINGS
@given(bs=st.integers(1, 4), depth=st.integers(1, 15), k=st.integers(1, 6), budget=st.integers(1, 200),
       seed=st.integers(0, 10**6), follow=st.sampled_from([0.0, 0.5, 1.0]), vocab=st.sampled_from([4, 64]))
def test_accept_matches_eagle_greedy_verify(du, ref, bs, depth, k, budget, seed, follow, vocab):
    k = min(k, vocab)
    ids, lps, roots, starts = ref.make_topk(bs, depth, k, seed, vocab=vocab)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, budget)
    gen = torch.Generator().manual_seed(seed + 1)
    target = random_path_targets(tree, gen, vocab, follow)
    compare_with_eagle(du, ref, tree, target, depth)


def test_accept_follows_deepest_path_completely(du, ref):
    ids, lps, roots, starts = ref.make_topk(3, 15, 4, seed=3, vocab=100)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 128)
    deepest = tree.depths.argmax(dim=1)
    target = torch.full_like(tree.draft_tokens, 99_999)  # never a draft token
    for b in range(3):
        i = int(deepest[b])
        while i > 0:
            p = int(tree.parents[b, i])
            target[b, p] = tree.draft_tokens[b, i]
            i = p
    acc = compare_with_eagle(du, ref, tree, target, 15)
    assert torch.equal(acc.accept_length, tree.depths.max(dim=1).values)
    assert torch.equal(acc.accepted_nodes[torch.arange(3), acc.accept_length], deepest)
    assert torch.all(acc.bonus_tokens == 99_999)


def test_accept_nothing(du, ref):
    ids, lps, roots, starts = ref.make_topk(2, 5, 3, seed=4, vocab=30)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 20)
    target = torch.full_like(tree.draft_tokens, 777)
    target[:, 0] = 555
    acc = du.ddtree_accept(tree, target)
    assert acc.accept_length.tolist() == [0, 0]
    assert acc.bonus_tokens.tolist() == [555, 555]
    assert acc.accepted_nodes.tolist() == [[0] + [-1] * 5] * 2


def eagle_links(parents):
    """retrive_next_token / next_sibling exactly as EAGLE's build kernel links them (reverse loop)."""
    n = len(parents)
    nt, ns = [-1] * n, [-1] * n
    for i in range(n - 1, 0, -1):
        p = parents[i]
        if nt[p] != -1:
            ns[i] = nt[p]
        nt[p] = i
    return nt, ns


@SETTINGS
@given(n=st.integers(1, 40), seed=st.integers(0, 10**6), vocab=st.integers(1, 4), depth_cap=st.integers(1, 12))
def test_accept_on_arbitrary_trees_with_duplicate_siblings(du, ref, n, seed, vocab, depth_cap):
    """Generic trees (random parents, repeated sibling tokens): the first matching sibling wins."""
    g = torch.Generator().manual_seed(seed)
    bs = 2
    parents = torch.full((bs, n), -1, dtype=torch.long)
    depths = torch.zeros((bs, n), dtype=torch.long)
    for b in range(bs):
        for i in range(1, n):
            p = int(torch.randint(0, i, (1,), generator=g))
            parents[b, i], depths[b, i] = p, depths[b, p] + 1
    tokens = torch.randint(0, vocab, (bs, n), generator=g)
    target = torch.randint(0, vocab, (bs, n), generator=g)
    nts, nss = zip(*(eagle_links(parents[b].tolist()) for b in range(bs)))
    zeros = torch.zeros((bs, n), dtype=torch.long)
    retrive_index = torch.arange(bs)[:, None] * n + torch.arange(n)[None, :]
    tree = du.DDTreeTree(tokens, parents, depths, depths, torch.zeros((bs, n, n), dtype=torch.bool),
                         retrive_index, torch.tensor(nts), torch.tensor(nss), zeros.float(), zeros - 1)
    d = min(depth_cap, n - 1) if n > 1 else 1
    acc = du.ddtree_accept(tree, target, max_depth=d)
    idx, num, _ = ref.eagle_verify_greedy(tokens, retrive_index, tree.retrive_next_token, tree.retrive_next_sibling,
                                          target, d + 1)
    for b in range(bs):
        assert acc.accepted_nodes[b].tolist() == [x - b * n if x >= 0 else -1 for x in idx[b]]
        assert int(acc.accept_length[b]) == num[b]


def test_accept_default_depth_without_metadata(du, ref):
    """A tree built by hand (no max_depth metadata) walks up to N-1 steps."""
    ids, lps, roots, starts = ref.make_topk(1, 3, 1, seed=0)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, 8)
    plain = du.DDTreeTree(*tuple(tree))
    assert plain.max_depth is None
    target = torch.cat([tree.draft_tokens[:, 1:], torch.tensor([[5]])], dim=1)
    acc = du.ddtree_accept(plain, target)
    assert acc.accepted_nodes.tolist() == [[0, 1, 2, 3]]
    assert acc.accept_length.tolist() == [3]


@SETTINGS
@given(bs=st.integers(1, 3), depth=st.integers(1, 10), k=st.integers(1, 6), budget=st.integers(1, 150),
       seed=st.integers(0, 10**6))
def test_predicted_accept_length_is_sum_of_prefix_probs(du, ref, bs, depth, k, budget, seed):
    ids, lps, roots, starts = ref.make_topk(bs, depth, k, seed)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, budget)
    pal = du.predicted_accept_length(tree)
    assert pal.shape == (bs,) and pal.dtype == torch.float32
    for b in range(bs):
        want = sum(math.exp(x) for x in tree.node_logprobs[b, 1:].tolist())
        assert math.isclose(float(pal[b]), want, rel_tol=1e-5, abs_tol=1e-6)
        # Under the drafter's model a bigger tree never predicts less.
        if budget > 1:
            smaller = du.build_ddtree_tree_from_topk(ids[b:b + 1], lps[b:b + 1], roots[b:b + 1], starts[b:b + 1],
                                                     budget - 1)
            assert float(du.predicted_accept_length(smaller)[0]) <= float(pal[b]) + 1e-6
