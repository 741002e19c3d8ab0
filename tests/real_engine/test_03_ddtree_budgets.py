"""DDTREE at budgets 1, 4, 64 and the largest tree the drafter depth allows (B = 254 = sum of
2**d for d = 1..7 at top-K 2): a batch of 4 ragged prompts == greedy, == the plain engine.
(B = 16 runs in test_02.) One engine per budget, started in turn, each under SGLang's overlap
scheduler; and B = 16 once more with ``--disable-overlap-schedule`` (the synchronous loop)."""

from __future__ import annotations

import pytest

import re_cases as cases
from re_checks import assert_greedy, assert_overlap


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
    """``--speculative-ddtree-budget auto`` (issue 20): the engine sizes everything for the largest
    budget (8b - 1 = 31 at block 4) and each step verifies the subtree of the budget its
    controller picks; a new batch size runs every budget three times (cold start) before choosing.
    Tokens stay greedy's whatever is picked; the debug metrics show the budgets actually run."""
    plain = engines.plain(cases.PROMPTS, cases.N_NEW)
    eng = engines.get("ddtree-auto")
    try:
        assert_overlap(eng)
        assert eng.server_args["speculative_ddtree_budget"] == "auto"
        assert int(eng.server_args["speculative_num_draft_tokens"]) == 32
        outs = eng.generate(cases.PROMPTS, cases.greedy(cases.N_NEW))
        assert_greedy(outs, cases.PROMPTS, cases.N_NEW, hf_greedy, plain)
        # meta_info "ddtree_budget": the budget of every step (host ints, no debug flag needed);
        # the debug metrics' tree size (from the verified tree itself) agrees step by step.
        budgets = [b for o in outs for b in o["meta_info"]["ddtree_budget"]]
        sizes = [s for o in outs for s in o["meta_info"]["ddtree_tree_size"]]
        assert budgets == sizes and set(budgets) == {3, 7, 15, 31}, (budgets, sizes)
    finally:
        engines.stop()
