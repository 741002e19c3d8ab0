"""Plain decoding and linear DFLASH on the real engine == transformers' greedy generate()."""

from __future__ import annotations

import re_cases as cases
from re_checks import assert_greedy, assert_tokens


def test_plain_engine_equals_transformers_greedy(engines, hf_greedy):
    eng = engines.get("plain")
    prompts = cases.PROMPTS + [cases.LONG_PROMPT]
    outs = eng.generate(prompts, cases.greedy(cases.N_NEW))
    got = [o["output_ids"] for o in outs]
    assert_tokens("transformers greedy generate()", got, [hf_greedy(p, cases.N_NEW) for p in prompts],
                  prompts)
    assert "spec_verify_ct" not in outs[0]["meta_info"]  # really not speculative


def test_dflash_batch_equals_greedy(engines, hf_greedy):
    plain = engines.plain(cases.PROMPTS, cases.N_NEW)
    eng = engines.get("dflash")
    outs = eng.generate(cases.PROMPTS, cases.greedy(cases.N_NEW))
    assert_greedy(outs, cases.PROMPTS, cases.N_NEW, hf_greedy, plain)
    assert all(o["meta_info"].get("spec_verify_ct", 0) > 0 for o in outs), "DFLASH did not verify"
