"""DDTREE at budgets 1, 4, 64 and the largest tree the drafter depth allows (B = 254 = sum of
2**d for d = 1..7 at top-K 2): a batch of 4 ragged prompts == greedy, == the plain engine.
(B = 16 runs in test_02.) One engine per budget, started in turn, each under SGLang's overlap
scheduler; and B = 16 once more with ``--disable-overlap-schedule`` (the synchronous loop)."""

from __future__ import annotations

import pytest

import re_cases as cases
from re_checks import assert_greedy, assert_overlap

# the auto budget's chain candidate (sglang.srt.speculative.ddtree_auto_budget.CHAIN)
CHAIN = 0
# The switching test: 8 requests (a batch-size bucket the test before it left cold), max_new_tokens
# per request; the short ones end during the cold start, so the batch shrinks mid-run.
SWITCH_PROMPTS = cases.PROMPTS * 2
SWITCH_LENS = [24, 7, 9, 24, 5, 11, 3, 24]


@pytest.mark.parametrize("name", ["ddtree1", "ddtree4", "ddtree64", "ddtree254", "ddtree16-sync"])
def test_ddtree_budget_batch_equals_greedy(name, engines, hf_greedy):
    plain = engines.plain(cases.PROMPTS, cases.N_NEW)
    eng = engines.get(name)
    try:
        assert_overlap(eng, on=not name.endswith("-sync"))
        outs = eng.generate(cases.PROMPTS, cases.greedy(cases.N_NEW))
        assert_greedy(outs, cases.PROMPTS, cases.N_NEW, hf_greedy, plain)
        budget = int(eng.server_args["speculative_ddtree_budget"])
        assert int(eng.server_args["speculative_num_draft_tokens"]) == budget + 1
        assert all(o["meta_info"].get("spec_verify_ct", 0) > 0 for o in outs)
    finally:
        engines.stop()


def test_auto_budget_equals_greedy_and_runs_every_budget(engines, hf_greedy):
    """``--speculative-ddtree-budget auto`` (issues 20 and 38): the engine sizes everything for the
    largest budget (8b - 1 = 31 at block 4) and each step runs the candidate its controller picks:
    linear DFlash's own step (the chain, meta_info budget 0) or the subtree of a budget; a new batch
    size runs every candidate three times (cold start, the chain first) before choosing. Tokens
    stay greedy's whatever is picked; the debug metrics show the candidates actually run (tree size
    0 on a chain step). The engine stays up for the next test."""
    plain = engines.plain(cases.PROMPTS, cases.N_NEW)
    eng = engines.get("ddtree-auto")
    assert_overlap(eng)
    assert eng.server_args["speculative_ddtree_budget"] == "auto"
    assert int(eng.server_args["speculative_num_draft_tokens"]) == 32
    outs = eng.generate(cases.PROMPTS, cases.greedy(cases.N_NEW))
    assert_greedy(outs, cases.PROMPTS, cases.N_NEW, hf_greedy, plain)
    # meta_info "ddtree_budget": the candidate of every step (host ints, no debug flag needed);
    # the debug metrics' tree size (from the verified tree itself) agrees step by step.
    budgets = [b for o in outs for b in o["meta_info"]["ddtree_budget"]]
    sizes = [s for o in outs for s in o["meta_info"]["ddtree_tree_size"]]
    assert budgets == sizes and set(budgets) == {CHAIN, 3, 7, 15, 31}, (budgets, sizes)
    # the cold start runs the candidates in turn, smallest (the chain) first
    assert outs[0]["meta_info"]["ddtree_budget"][:5] == [CHAIN, 3, 7, 15, 31], budgets


def _runs(seq):
    """[0, 3, 7, 0, 0, 15] -> ["chain", "tree", "chain", "tree"]: chain / tree phases, in order."""
    kinds = ["chain" if b == CHAIN else "tree" for b in seq]
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]


def test_auto_switches_between_chain_and_tree_mid_request(engines, hf_greedy):
    """Issue 38: a batch of 8 (a batch-size bucket the test before left cold) starts with the cold
    start, which runs the candidates in turn (chain, 3, 7, 15, 31, chain, ...): one request goes
    chain -> tree -> chain -> tree, and short requests end (max_new_tokens) on a step that switched
    candidates, shrinking the batch. Every
    request's tokens are target-only greedy's (a prefix of the 24-token reference)."""
    plain = engines.plain(cases.PROMPTS, cases.N_NEW)
    eng = engines.get("ddtree-auto")
    try:
        lens = SWITCH_LENS
        outs = eng.generate(SWITCH_PROMPTS, [cases.greedy(n) for n in lens])
        got = [o["output_ids"] for o in outs]
        assert got == [ref[:n] for ref, n in zip(plain * 2, lens)]
        assert got == [hf_greedy(p, n) for p, n in zip(SWITCH_PROMPTS, lens)]
        seqs = [o["meta_info"]["ddtree_budget"] for o in outs]
        sizes = [o["meta_info"]["ddtree_tree_size"] for o in outs]
        assert seqs == sizes, (seqs, sizes)
        runs = [_runs(s) for s in seqs]
        # chain -> tree -> chain -> tree inside one request
        assert any(r[:4] == ["chain", "tree", "chain", "tree"] for r in runs), seqs
        # a request whose last step switched candidates (it ends at the switch)
        assert any(len(s) >= 2 and s[-1] != s[-2] for s in seqs), seqs
    finally:
        engines.stop()
