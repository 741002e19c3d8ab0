"""The auto budget (issue 20, patch ddtree-auto-budget): one tree of the largest budget serves every smaller one.

``ddtree_subtree(tree, B)`` must be exactly the tree the builder makes for budget B (checked
against the paper's heap oracle, ties included, every field), and ``predicted_accept_curve`` the
expected acceptance of those subtrees; ``DDTreeAutoBudget`` (the per-step choice) is checked as
the policy it documents, with hand-computed numbers.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_offline.heap_oracle import build_ddtree_tree_heap

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


@SETTINGS
@given(bs=st.integers(1, 3), depth=st.integers(1, 7), k=st.integers(1, 6), big=st.integers(2, 120),
       seed=st.integers(0, 10**6), quantize=st.sampled_from([None, None, 4.0, 1.0]))
def test_subtree_is_the_tree_of_the_smaller_budget(du, ref, bs, depth, k, big, seed, quantize):
    ids, lps, roots, starts = ref.make_topk(bs, depth, k, seed, quantize=quantize)
    full = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, big)
    for small in sorted({1, 2, max(1, big // 3), big - 1, big}):
        got = du.ddtree_subtree(full, small)
        want = build_ddtree_tree_heap(ids, lps, roots, starts, small)
        for name in want._fields:
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and torch.equal(a, b), (small, name)
        ref.assert_structure(got, starts)
        # the curve of the big tree, at `small`, is the small tree's predicted acceptance
        curve = du.predicted_accept_curve(full, [min(small, full.num_nodes)])
        assert torch.allclose(curve[:, 0], du.predicted_accept_length(want), rtol=1e-6, atol=1e-6)


def test_auto_budgets_are_the_widths_b_2b_4b_8b(du):
    assert du.ddtree_auto_budgets(16) == [15, 31, 63, 127]
    assert du.ddtree_auto_budgets(8) == [7, 15, 31, 63]
    assert du.ddtree_auto_budgets(16, max_budget=63) == [15, 31, 63]


@pytest.fixture(scope="module")
def auto_mod():
    from ddtree_deploy.build.overlay import import_patched

    return import_patched("sglang.srt.speculative.ddtree_auto_budget")


def _step(ctl, bs, budget, ms, drafts, curve):
    """Feed one finished step the way the worker does (CPU: known at once), at a fixed cost."""
    ctl._consume(ms, [drafts] + list(curve), bs, budget)


def test_cold_start_runs_every_budget_in_turn_smallest_first(auto_mod):
    ctl = auto_mod.DDTreeAutoBudget([15, 31, 63], device="cpu", log_enabled=False, warm_runs=2)
    picks = [ctl.choose(8) for _ in range(6)]
    assert picks == [15, 31, 63, 15, 31, 63]
    # nothing measured yet (the measurements arrive later): the smallest tree
    assert ctl.choose(8) == 15
    # another batch size bucket has its own cold start
    assert ctl.choose(20) == 15 and ctl.choose(32) == 31


def _warm(ctl, bs):
    for _ in range(ctl.warm_runs * len(ctl.budgets)):
        ctl.choose(bs)


def test_picks_the_most_tokens_per_millisecond(auto_mod):
    ctl = auto_mod.DDTreeAutoBudget([15, 31, 63], device="cpu", log_enabled=False)
    _warm(ctl, 1)
    # predicted accepted drafts 3 / 5 / 6 (calibrated: realized == predicted), costs 10 / 11 / 16 ms
    for b, ms in ((15, 10.0), (31, 11.0), (63, 16.0)):
        _step(ctl, 1, b, ms, {15: 3.0, 31: 5.0, 63: 6.0}[b], [3.0, 5.0, 6.0])
    # (1 + 3) / 10 = 0.40, (1 + 5) / 11 = 0.545, (1 + 6) / 16 = 0.4375
    assert ctl.choose(1) == 31
    # a drafter that predicts nothing: the smallest tree (the fallback)
    ctl2 = auto_mod.DDTreeAutoBudget([15, 31, 63], device="cpu", log_enabled=False)
    _warm(ctl2, 1)
    for b, ms in ((15, 10.0), (31, 10.5), (63, 12.0)):
        _step(ctl2, 1, b, ms, 0.0, [0.02, 0.03, 0.03])
    assert ctl2.choose(1) == 15


def test_an_overconfident_drafter_is_calibrated_down(auto_mod):
    ctl = auto_mod.DDTreeAutoBudget([15, 31], device="cpu", log_enabled=False, alpha=1.0, window=1)
    _warm(ctl, 1)
    # it predicts 4 / 8 accepted drafts, but only a quarter of that is accepted
    _step(ctl, 1, 15, 10.0, 1.0, [4.0, 8.0])
    _step(ctl, 1, 31, 14.0, 2.0, [4.0, 8.0])
    # calibration c = realized / predicted at the budget run = 2 / 8 (alpha 1: the last step)
    assert ctl.calibration() == pytest.approx(0.25)
    # (1 + c * 8) / 14 = 0.214 > (1 + c * 4) / 10 = 0.2
    assert ctl.choose(1) == 31
    # the wide verify got slower: (1 + c * 8) / 20 = 0.15 < 0.2
    _step(ctl, 1, 31, 20.0, 2.0, [4.0, 8.0])
    assert ctl.choose(1) == 15
    # equal costs: only the calibration decides; nothing realized -> the smaller tree
    ctl.real_run.value, ctl.pred_run.value = 0.0, 8.0
    ctl.cost[(1, 31)].append(10.0)
    ctl.cost[(1, 15)].append(10.0)
    assert ctl.calibration() == 0.0
    assert ctl.choose(1) == 15  # ties in score go to the smaller tree


def test_the_oldest_estimate_is_measured_again(auto_mod):
    ctl = auto_mod.DDTreeAutoBudget([15, 31, 63], device="cpu", log_enabled=False, explore_every=10, warm_runs=1)
    _warm(ctl, 4)
    for b, ms in ((15, 10.0), (31, 30.0), (63, 60.0)):
        _step(ctl, 4, b, ms, 0.0, [0.0, 0.0, 0.0])
    picks = [ctl.choose(4) for _ in range(17)]  # choices 4..20 of this bucket
    assert picks.count(15) == 15, picks
    # choice 10 re-measures 31 (run at choice 2), choice 20 then 63 (run at choice 3)
    assert picks[10 - 4] == 31 and picks[20 - 4] == 63, picks


def test_a_slow_first_replay_does_not_decide(auto_mod):
    """The H200 run that found this: each budget's first step at a batch size (a graph's first
    replay) was measured once, a budget whose first step happened to be slow lost for good."""
    ctl = auto_mod.DDTreeAutoBudget([15, 63], device="cpu", log_enabled=False)
    _warm(ctl, 8)
    for ms15, ms63 in ((40.0, 14.0), (10.0, 14.0), (10.5, 14.5)):  # 15's first step: 40 ms
        _step(ctl, 8, 15, ms15, 0.0, [0.0, 0.0])
        _step(ctl, 8, 63, ms63, 0.0, [0.0, 0.0])
    assert ctl.step_ms(8, 15) == 10.5 and ctl.choose(8) == 15


def test_buckets_are_powers_of_two(auto_mod):
    assert [auto_mod.batch_bucket(x) for x in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]


# ---------------------------------------------------------------- the chain (issue 38)
@SETTINGS
@given(bs=st.integers(1, 3), depth=st.integers(1, 7), k=st.integers(1, 5), seed=st.integers(0, 10**6))
def test_chain_prediction_is_the_top1_path_of_the_tree(du, ref, bs, depth, k, seed):
    """The chain candidate's predicted acceptance is the expected acceptance of the tree made of
    each depth's top-1 only (the heap oracle's tree at K = 1, budget = depth: linear DFlash's
    greedy chain), whatever the other K - 1 candidates are."""
    ids, lps, roots, starts = ref.make_topk(bs, depth, k, seed)
    chain_tree = build_ddtree_tree_heap(ids[:, :, :1], lps[:, :, :1], roots, starts, depth)
    want = du.predicted_accept_length(chain_tree)
    got = du.chain_accept_prediction(lps)
    assert got.shape == (bs, 1) and got.dtype == torch.float32
    assert torch.allclose(got[:, 0], want.to(torch.float32), rtol=1e-6, atol=1e-6)
    # never more than the best-first tree of the same number of nodes (it holds the best prefixes)
    tree = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, depth)
    assert bool((got[:, 0] <= du.predicted_accept_curve(tree, [depth])[:, 0] + 1e-6).all())


def test_chain_prediction_by_hand(du):
    lps = torch.log(torch.tensor([[[0.5, 0.3], [0.5, 0.2], [0.5, 0.1]]]))
    assert du.chain_accept_prediction(lps).item() == pytest.approx(0.5 + 0.25 + 0.125)


def test_the_chain_is_the_floor_where_no_tree_pays(auto_mod):
    chain = auto_mod.CHAIN
    ctl = auto_mod.DDTreeAutoBudget([chain, 15, 31], device="cpu", log_enabled=False, warm_runs=1)
    # cold start: the chain first (the smallest candidate), then the trees
    assert [ctl.choose(8) for _ in range(3)] == [chain, 15, 31]
    # the chain predicts 2.0 accepted drafts, the trees 2.3 / 2.5 (calibrated); costs 10 / 13 / 15 ms:
    # (1 + 2) / 10 = 0.30 > (1 + 2.3) / 13 = 0.254 > (1 + 2.5) / 15 = 0.233
    curve = [2.0, 2.3, 2.5]
    for b, ms, real in ((chain, 10.0, 2.0), (15, 13.0, 2.3), (31, 15.0, 2.5)):
        _step(ctl, 8, b, ms, real, curve)
    assert ctl.choose(8) == chain
    # the trees got cheaper (a lighter load): 15 now pays, (1 + 2.3) / 10.5 = 0.314
    for _ in range(ctl.window):
        _step(ctl, 8, 15, 10.5, 2.3, curve)
    assert ctl.choose(8) == 15
    assert auto_mod.candidate_name(chain) == "chain" and auto_mod.candidate_name(15) == "B=15"
    assert ctl.summary()["chain"] == chain


def test_a_step_the_chain_cannot_verify_gets_a_tree(auto_mod):
    chain = auto_mod.CHAIN
    ctl = auto_mod.DDTreeAutoBudget([chain, 15, 31], device="cpu", log_enabled=False, warm_runs=1)
    # cold start without the chain: the trees in turn
    assert [ctl.choose(4, chain_ok=False) for _ in range(2)] == [15, 31]
    for b, ms in ((15, 10.0), (31, 30.0)):
        _step(ctl, 4, b, ms, 0.0, [0.0, 0.0, 0.0])
    assert ctl.choose(4, chain_ok=False) == 15
    # the chain, allowed again, is run (cold start) and then wins at equal predictions, cheaper
    assert ctl.choose(4) == chain
    _step(ctl, 4, chain, 5.0, 0.0, [0.0, 0.0, 0.0])
    assert ctl.choose(4) == chain
    assert all(ctl.choose(4, chain_ok=False) != chain for _ in range(50))
