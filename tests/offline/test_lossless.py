"""Losslessness: every method emits exactly the target-only tokens (T = 0 and seeded T > 0)."""

from __future__ import annotations

import pytest
from offline_helpers import make_engine, prompts

from ddtree_offline.engine import generated_tokens

BUDGETS = [1, 2, 4, 16, 64, 256]
N_PROMPTS = 10
MAX_NEW = 32


@pytest.fixture(scope="module")
def greedy_refs(target64):
    eng = make_engine(target64)
    ps = prompts(N_PROMPTS, target64.config.vocab_size, seed=11)
    return eng, ps, [generated_tokens(eng.generate(p, "target", max_new_tokens=MAX_NEW)) for p in ps]


@pytest.mark.parametrize("budget", BUDGETS)
def test_ddtree_greedy_equals_target(greedy_refs, budget):
    eng, ps, refs = greedy_refs
    for i, (p, ref) in enumerate(zip(ps, refs)):
        rec = eng.generate(p, "ddtree", budget=budget, max_new_tokens=MAX_NEW)
        assert generated_tokens(rec) == ref, f"prompt {i}, budget {budget}"
        assert len(ref) == MAX_NEW


def test_dflash_greedy_equals_target(greedy_refs):
    eng, ps, refs = greedy_refs
    for i, (p, ref) in enumerate(zip(ps, refs)):
        assert generated_tokens(eng.generate(p, "dflash", max_new_tokens=MAX_NEW)) == ref, f"prompt {i}"


@pytest.mark.parametrize("quality", [0.0, 0.5, 1.0])
def test_lossless_across_drafter_quality_and_topk_cap(target64, quality):
    eng = make_engine(target64, quality=quality, block_size=6)
    for p in prompts(3, target64.config.vocab_size, seed=5):
        ref = generated_tokens(eng.generate(p, "target", max_new_tokens=20))
        assert generated_tokens(eng.generate(p, "dflash", max_new_tokens=20)) == ref
        for b, cap in [(8, None), (32, 2), (64, 8)]:
            rec = eng.generate(p, "ddtree", budget=b, topk_cap=cap, max_new_tokens=20)
            assert generated_tokens(rec) == ref, (quality, b, cap)


def test_qwen3_architecture_lossless(target64_qwen3):
    eng = make_engine(target64_qwen3, quality=0.8, block_size=8)
    for p in prompts(3, target64_qwen3.config.vocab_size, seed=2):
        ref = generated_tokens(eng.generate(p, "target", max_new_tokens=24))
        assert generated_tokens(eng.generate(p, "dflash", max_new_tokens=24)) == ref
        for b in (4, 64):
            assert generated_tokens(eng.generate(p, "ddtree", budget=b, max_new_tokens=24)) == ref


def test_float32_default_dtype_lossless(du):
    """The default float32 tiny model (what the CLI uses) is lossless too on these prompts."""
    import torch

    from ddtree_offline.models import tiny_target

    m = tiny_target(seed=7, vocab=256, dtype=torch.float32)
    eng = make_engine(m, quality=0.85, block_size=8)
    for p in prompts(3, 256, seed=9):
        ref = generated_tokens(eng.generate(p, "target", max_new_tokens=24))
        for b in (16, 128):
            assert generated_tokens(eng.generate(p, "ddtree", budget=b, max_new_tokens=24)) == ref


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_lossless_with_same_seed(target64, temperature):
    eng = make_engine(target64, quality=0.85, block_size=8)
    for i, p in enumerate(prompts(3, target64.config.vocab_size, seed=21)):
        seed = 100 + i
        ref = generated_tokens(eng.generate(p, "target", max_new_tokens=24, temperature=temperature, seed=seed))
        assert generated_tokens(eng.generate(p, "dflash", max_new_tokens=24, temperature=temperature, seed=seed)) == ref
        for b in (1, 4, 64):
            rec = eng.generate(p, "ddtree", budget=b, max_new_tokens=24, temperature=temperature, seed=seed)
            assert generated_tokens(rec) == ref, (temperature, b, i)


def test_sampling_seeds_differ_and_differ_from_greedy(target64):
    eng = make_engine(target64, quality=0.85, block_size=8)
    p = prompts(1, target64.config.vocab_size, seed=4)[0]
    a = generated_tokens(eng.generate(p, "ddtree", budget=16, max_new_tokens=24, temperature=1.0, seed=1))
    a2 = generated_tokens(eng.generate(p, "ddtree", budget=16, max_new_tokens=24, temperature=1.0, seed=1))
    b = generated_tokens(eng.generate(p, "ddtree", budget=16, max_new_tokens=24, temperature=1.0, seed=2))
    g = generated_tokens(eng.generate(p, "ddtree", budget=16, max_new_tokens=24, temperature=0.0))
    assert a == a2
    assert a != b
    assert a != g
    tb = generated_tokens(eng.generate(p, "target", max_new_tokens=24, temperature=1.0, seed=2))
    assert tb == b


def test_eager_attention_lossless(du):
    """The 4-D additive tree mask works with the eager attention implementation too."""
    import torch

    from ddtree_offline.models import tiny_target

    m = tiny_target(seed=5, vocab=256, dtype=torch.float64, attn_implementation="eager")
    eng = make_engine(m, quality=0.8, block_size=8)
    for p in prompts(2, 256, seed=12):
        ref = generated_tokens(eng.generate(p, "target", max_new_tokens=24))
        for b in (4, 64):
            assert generated_tokens(eng.generate(p, "ddtree", budget=b, max_new_tokens=24)) == ref
