"""DDTREE at budgets 1, 4, 64 and the largest tree the drafter depth allows (B = 254 = sum of
2**d for d = 1..7 at top-K 2): a batch of 4 ragged prompts == greedy, == the plain engine.
(B = 16 runs in test_02.) One engine per budget, started in turn."""

from __future__ import annotations

import pytest

import re_cases as cases
from re_checks import assert_greedy


@pytest.mark.parametrize("name", ["ddtree1", "ddtree4", "ddtree64", "ddtree254"])
def test_ddtree_budget_batch_equals_greedy(name, engines, hf_greedy):
    plain = engines.plain(cases.PROMPTS, cases.N_NEW)
    eng = engines.get(name)
    try:
        outs = eng.generate(cases.PROMPTS, cases.greedy(cases.N_NEW))
        assert_greedy(outs, cases.PROMPTS, cases.N_NEW, hf_greedy, plain)
        budget = int(eng.server_args["speculative_ddtree_budget"])
        assert int(eng.server_args["speculative_num_draft_tokens"]) == budget + 1
        assert all(o["meta_info"].get("spec_verify_ct", 0) > 0 for o in outs)
    finally:
        engines.stop()
