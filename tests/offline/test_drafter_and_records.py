"""Synthetic drafter behaviour, acceptance vs quality, and the record format."""

from __future__ import annotations

import pytest
import torch
from offline_helpers import make_engine, prompts

from ddtree_offline.drafters import SyntheticDrafter, quality_schedule
from ddtree_offline.engine import DDTREE_KEYS, REFERENCE_KEYS, generated_tokens


def _tau(eng, ps, method, budget=0, max_new=32):
    acc = []
    for p in ps:
        rec = eng.generate(p, method, budget=budget, max_new_tokens=max_new)
        acc += rec["acceptance_lengths"][:-1]  # the last round may be truncated by max_new_tokens
    return sum(acc) / len(acc), acc


def test_perfect_drafter_accepts_full_depth(target64):
    eng = make_engine(target64, quality=1.0, block_size=8)
    ps = prompts(2, target64.config.vocab_size, seed=1)
    for method, budget in [("dflash", 0), ("ddtree", 7), ("ddtree", 64)]:
        tau, acc = _tau(eng, ps, method, budget, max_new=33)
        assert all(a == 8 for a in acc), (method, budget, acc)


def test_budget_one_accepts_at_most_one_draft(target64):
    eng = make_engine(target64, quality=1.0, block_size=8)
    rec = eng.generate(prompts(1, target64.config.vocab_size)[0], "ddtree", budget=1, max_new_tokens=20)
    assert set(rec["acceptance_lengths"][:-1]) == {2}
    assert set(rec["tree_sizes"]) == {1}


def test_zero_quality_accepts_almost_nothing(target64):
    eng = make_engine(target64, quality=0.0, block_size=8)
    ps = prompts(4, target64.config.vocab_size, seed=2)
    for method, budget in [("dflash", 0), ("ddtree", 4), ("ddtree", 16)]:
        tau, _ = _tau(eng, ps, method, budget, max_new=20)
        assert tau < 1.15, (method, budget, tau)


def test_acceptance_grows_with_quality_and_budget(target64):
    ps = prompts(5, target64.config.vocab_size, seed=3)
    taus = {}
    for q in (0.3, 0.7, 0.95):
        eng = make_engine(target64, quality=q, block_size=8)
        taus[q] = (_tau(eng, ps, "dflash")[0], _tau(eng, ps, "ddtree", 128)[0])
    assert taus[0.3][0] < taus[0.7][0] < taus[0.95][0]
    assert taus[0.3][1] < taus[0.7][1] < taus[0.95][1]
    for q in (0.3, 0.7):  # a big tree beats the linear draft at imperfect quality
        assert taus[q][1] > taus[q][0], (q, taus[q])


def test_predicted_acceptance_tracks_actual(target64):
    """The calibrated drafter's predicted tau is close to the measured tau on average."""
    eng = make_engine(target64, quality=0.7, block_size=8)
    acc, pred = [], []
    for p in prompts(5, target64.config.vocab_size, seed=17):
        rec = eng.generate(p, "ddtree", budget=32, max_new_tokens=40)
        acc += rec["acceptance_lengths"][:-1]
        pred += rec["predicted_acceptance"][:-1]
    a, b = sum(acc) / len(acc), sum(pred) / len(pred)
    assert abs(a - b) < 0.35 * b, (a, b)


def test_drafter_is_deterministic_by_seed(target64):
    ctx = prompts(1, target64.config.vocab_size, seed=4)[0]
    a = SyntheticDrafter(target64, quality=0.6, seed=5).propose(ctx, 5)
    b = SyntheticDrafter(target64, quality=0.6, seed=5).propose(ctx, 5)
    c = SyntheticDrafter(target64, quality=0.6, seed=6).propose(ctx, 5)
    assert a.shape == (5, target64.config.vocab_size)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    torch.testing.assert_close(a.exp().sum(-1), torch.ones(5), rtol=1e-4, atol=1e-4)
    for mode in ("mass", "calibrated"):
        d = SyntheticDrafter(target64, quality=1.0, seed=5, mode=mode)
        oracle = d.oracle(ctx, 5)
        assert d.propose(ctx, 5).argmax(-1).tolist() == oracle


def test_quality_schedule():
    assert quality_schedule(0.5, 3) == [0.5, 0.5, 0.5]
    assert quality_schedule(1.0, 3, decay=0.5) == [1.0, 0.5, 0.25]
    assert quality_schedule([0.9, 0.4], 4) == [0.9, 0.4, 0.4, 0.4]
    assert quality_schedule([2.0, -1.0], 2) == [1.0, 0.0]


@pytest.mark.parametrize("method", ["target", "dflash", "ddtree"])
def test_record_has_reference_keys(target64, method):
    eng = make_engine(target64, quality=0.8, block_size=8)
    p = prompts(1, target64.config.vocab_size, seed=6)[0]
    rec = eng.generate(p, method, budget=16, max_new_tokens=30)
    expected = set(REFERENCE_KEYS) | (set(DDTREE_KEYS) if method == "ddtree" else set())
    assert set(rec) == expected
    assert isinstance(rec["output_ids"], torch.Tensor) and rec["output_ids"].shape == (1, len(p) + 30)
    assert rec["output_ids"][0, : len(p)].tolist() == p
    assert rec["num_input_tokens"] == len(p) and rec["num_output_tokens"] == 30
    assert len(generated_tokens(rec)) == 30
    assert rec["time_to_first_token"] > 0 and rec["time_per_output_token"] > 0
    acc = rec["acceptance_lengths"]
    assert rec["decode_rounds"] == len(acc) == len(rec["round_timestamps"])
    assert all(isinstance(a, int) and 1 <= a <= 8 for a in acc)
    assert 0 <= sum(acc) - 29 < 8  # first token comes from the prefill; the last round may overshoot
    ts = rec["round_timestamps"]
    assert all(b >= a for a, b in zip(ts, ts[1:]))
    assert set(rec["stage_times"]) == {"draft", "tree_build", "verify", "commit"}
    if method == "ddtree":
        R = rec["decode_rounds"]
        assert len(rec["predicted_acceptance"]) == len(rec["tree_sizes"]) == len(rec["tree_depths"]) == R
        assert len(rec["round_trees"]) == R
        assert all(1 <= s <= 16 for s in rec["tree_sizes"]) and all(1 <= d <= 7 for d in rec["tree_depths"])
        assert all(p >= 1.0 for p in rec["predicted_acceptance"])
        t0 = rec["round_trees"][0]
        assert t0["accepted_indices"][0] == 0 and len(t0["accepted_indices"]) == acc[0]
    else:
        assert rec["round_trees"] == []


def test_stop_tokens_end_generation(target64):
    eng = make_engine(target64, quality=0.9, block_size=8)
    p = prompts(1, target64.config.vocab_size, seed=7)[0]
    full = generated_tokens(eng.generate(p, "target", max_new_tokens=30))
    stop = full[10]
    cut = full[: full.index(stop) + 1]
    for method in ("target", "dflash", "ddtree"):
        rec = eng.generate(p, method, budget=32, max_new_tokens=30, stop_token_ids=[stop])
        assert generated_tokens(rec) == cut, method


def test_bad_arguments(target64):
    from ddtree_offline.engine import OfflineEngine

    eng = make_engine(target64)
    with pytest.raises(ValueError):
        eng.generate([1, 2], "beam")
    with pytest.raises(ValueError):
        OfflineEngine(target64, None).generate([1, 2], "ddtree")
    with pytest.raises(ValueError):
        OfflineEngine(target64, None, block_size=1)
