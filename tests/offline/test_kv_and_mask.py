"""KV-cache compaction and the tree attention mask."""

from __future__ import annotations

import pytest
import torch
from offline_helpers import make_engine, prompts

from ddtree_offline.engine import STAGES, compact_dynamic_cache, tree_attention_mask


def _prefill(eng, prompt):
    cache = eng.new_cache()
    ids = torch.tensor([prompt])
    logits = eng.target(input_ids=ids, position_ids=torch.arange(len(prompt))[None], past_key_values=cache,
                        use_cache=True).logits
    return cache, int(logits[0, -1].argmax())


def _fresh_cache(eng, tokens):
    cache = eng.new_cache()
    eng.target(input_ids=torch.tensor([tokens]), position_ids=torch.arange(len(tokens))[None],
               past_key_values=cache, use_cache=True)
    return cache


def test_compact_dynamic_cache_unit():
    from transformers import DynamicCache

    cache = DynamicCache()
    k = torch.arange(2 * 3 * 10 * 4, dtype=torch.float32).reshape(2, 3, 10, 4)
    for layer in range(2):
        cache.update(k + 1000 * layer, -(k + 1000 * layer), layer)
    compact_dynamic_cache(cache, 4, torch.tensor([0, 2, 5]))
    for layer, lay in enumerate(cache.layers):
        expect = (k + 1000 * layer)[:, :, [0, 1, 2, 3, 4, 6, 9], :]
        assert torch.equal(lay.keys, expect)
        assert torch.equal(lay.values, -expect)
    assert cache.get_seq_length() == 7


@pytest.mark.parametrize("budget", [4, 32, 128])
def test_kv_compaction_matches_target_only_forward(target64, du, budget):
    eng = make_engine(target64, quality=0.9, block_size=8)
    D = eng.block_size - 1
    total_accepted = 0
    for prompt in prompts(4, target64.config.vocab_size, seed=31):
        eng.drafter.reset()
        cache, root = _prefill(eng, prompt)
        L = len(prompt)
        logq = eng.drafter.propose(prompt + [root], D, 0.0, 0)
        stages = {s: 0.0 for s in STAGES}
        with torch.inference_mode():
            emitted, info = eng._tree_round(du, logq, root, L, cache, budget, None, 0.0, 0, stages, False)
        accepted = [root] + emitted[:-1]  # root + accepted draft tokens now in the cache
        total_accepted += len(emitted) - 1
        ref = _fresh_cache(eng, prompt + accepted)
        assert cache.get_seq_length() == L + len(accepted)
        for got, exp in zip(cache.layers, ref.layers):
            assert got.keys.shape == exp.keys.shape
            torch.testing.assert_close(got.keys, exp.keys, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(got.values, exp.values, rtol=1e-9, atol=1e-9)
        # and decoding continues correctly from the compacted cache
        nxt = eng.target(input_ids=torch.tensor([[emitted[-1]]]), position_ids=torch.tensor([[L + len(accepted)]]),
                         past_key_values=cache, use_cache=True).logits[0, -1]
        full = eng.target(input_ids=torch.tensor([prompt + accepted + [emitted[-1]]])).logits[0, -1]
        torch.testing.assert_close(nxt, full, rtol=1e-9, atol=1e-9)
    assert total_accepted > 0, "test is vacuous: no draft token accepted"


def _tree(eng, du, prompt, root, budget):
    D = eng.block_size - 1
    logq = eng.drafter.propose(prompt + [root], D, 0.0, 0)
    K = min(budget, logq.shape[-1])
    lp, ids = torch.topk(logq, K, dim=-1)
    return du.build_ddtree_tree_from_topk(ids[None], lp[None], torch.tensor([root]), torch.tensor([len(prompt)]), budget)


def _tree_logits(eng, prompt, tokens, tree):
    cache, _ = _prefill(eng, prompt)
    mask = tree_attention_mask(tree.tree_mask, len(prompt), eng.target.dtype)
    return eng.target(input_ids=tokens, position_ids=tree.positions, attention_mask=mask,
                      past_key_values=cache, use_cache=True).logits[0]


def test_tree_mask_layout(target64, du):
    eng = make_engine(target64, quality=0.6, block_size=6)
    prompt = prompts(1, target64.config.vocab_size, seed=3)[0]
    _, root = _prefill(eng, prompt)
    tree = _tree(eng, du, prompt, root, 24)
    L, N = len(prompt), tree.draft_tokens.shape[1]
    m = tree_attention_mask(tree.tree_mask, L, torch.float64)
    assert m.shape == (1, 1, N, L + N)
    assert torch.all(m[0, 0, :, :L] == 0)
    assert torch.equal(m[0, 0, :, L:] == 0, tree.tree_mask[0])
    assert torch.all(m[0, 0, :, L:][~tree.tree_mask[0]] == torch.finfo(torch.float64).min)


def test_tree_attention_is_ancestors_only(target64, du):
    """Changing node j's token changes exactly the outputs of j and its descendants."""
    eng = make_engine(target64, quality=0.6, block_size=6)
    V = target64.config.vocab_size
    prompt = prompts(1, V, seed=8)[0]
    _, root = _prefill(eng, prompt)
    tree = _tree(eng, du, prompt, root, 40)
    N = tree.draft_tokens.shape[1]
    assert int(tree.depths.max()) >= 2 and N > 10
    base = _tree_logits(eng, prompt, tree.draft_tokens, tree)
    for j in sorted({1, 2, 3, N // 2, N - 1}):
        toks = tree.draft_tokens.clone()
        toks[0, j] = (toks[0, j] + 1) % V
        out = _tree_logits(eng, prompt, toks, tree)
        changed = ~torch.isclose(out, base, rtol=0, atol=1e-10).all(-1)
        descendants = tree.tree_mask[0, :, j]  # i such that j is i itself or an ancestor of i
        assert torch.equal(changed, descendants), f"node {j}"


def test_tree_logits_equal_causal_forward_along_each_path(target64, du):
    eng = make_engine(target64, quality=0.6, block_size=6)
    prompt = prompts(1, target64.config.vocab_size, seed=13)[0]
    _, root = _prefill(eng, prompt)
    tree = _tree(eng, du, prompt, root, 30)
    out = _tree_logits(eng, prompt, tree.draft_tokens, tree)
    parents = tree.parents[0].tolist()
    toks = tree.draft_tokens[0].tolist()
    for i in range(0, tree.draft_tokens.shape[1], 3):
        path, j = [], i
        while j != -1:
            path.append(toks[j])
            j = parents[j]
        seq = prompt + path[::-1]
        ref = eng.target(input_ids=torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(out[i], ref, rtol=1e-9, atol=1e-9)
