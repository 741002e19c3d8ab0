"""Request features under DDTREE: each gives what target-only decoding gives on the same engine
settings, or is refused with a message naming it.

One plain engine (with ``--enable-custom-logit-processor``) and one DDTREE engine (B 16) get the
same requests; the plain engine's answers are the reference. Greedy (T = 0) requests, so every
token is determined: ``return_logprob`` (with top log-probs), ``n > 1``, stop strings and stop
token ids, and regex-constrained decoding (xgrammar) give what target-only gives.

Refused instead: custom logit processors (DDTREE's tree verify does not run them, patch ddtree-server-args:
the launch flag is refused, so SGLang refuses every request that carries one) and LoRA adapters
(SGLang's own LoRA x speculative check does not list DDTREE). JSON-schema decoding is the same
grammar path as regex (a vocabulary mask per verify row); it needs a vocabulary that can spell JSON, so
it runs on the trained pair (test_07_trained_pair.py).
"""

from __future__ import annotations

import pytest

import re_cases as cases
from re_engine_proc import EngineError

N = 16
P = cases.PROMPTS

# name -> (prompts, sampling params, generate() kwargs)
FEATURES = {
    "logprobs": (P, cases.greedy(N), dict(return_logprob=True, top_logprobs_num=3, logprob_start_len=-1)),
    "n2": (P[:2], dict(cases.greedy(N), n=2), {}),
    "stop_str": (P, dict(max_new_tokens=N, temperature=0.0, stop=["w7"]), {}),
    "stop_ids": (P, dict(max_new_tokens=N, temperature=0.0, stop_token_ids=[5, 9]), {}),
    # xgrammar sees the tiny WordLevel vocabulary as raw strings (w2 ... w11): the regex admits
    # only w3 / w5 / w7 repeated, so every step's mask cuts the vocabulary to 3 tokens.
    "regex": (P, dict(max_new_tokens=N, temperature=0.0, regex="(w3|w5|w7)+"), {}),
}
DISALLOW = (cases.greedy(N, custom_params={"token_ids": [2, 3, 4]}),
            dict(custom_logit_processor="DisallowedTokensLogitsProcessor"))


def _run(eng) -> dict:
    return {name: eng.generate(prompts, params, **kw) for name, (prompts, params, kw) in FEATURES.items()}


@pytest.fixture(scope="module")
def answers(engines):
    try:
        eng = engines.get("features-plain")
        plain = _run(eng)
        plain["custom_logit_processor"] = eng.generate(P, DISALLOW[0], **DISALLOW[1])
        eng = engines.get("features")
        ddtree = _run(eng)
        try:
            eng.generate(P[:1], DISALLOW[0], **DISALLOW[1])
            ddtree["custom_logit_processor"] = "not refused"
        except EngineError as e:
            ddtree["custom_logit_processor"] = str(e)
    finally:
        engines.stop()
    return plain, ddtree


def _ids(outs):
    return [o["output_ids"] for o in outs]


def _finish(outs):
    return [o["finish_reason"] for o in outs]


@pytest.mark.parametrize("name", [n for n in FEATURES if n != "logprobs"])
def test_feature_equals_target_only(answers, name):
    plain, ddtree = answers
    assert _ids(ddtree[name]) == _ids(plain[name]), name
    assert _finish(ddtree[name]) == _finish(plain[name]), name


def test_the_features_constrain_the_output(answers):
    """The reference itself shows each feature acting (else equality would prove nothing)."""
    plain, _ = answers
    assert len(plain["n2"]) == 2 * len(P[:2])
    assert all(set(ids) <= {3, 5, 7, 1} for ids in _ids(plain["regex"])), _ids(plain["regex"])
    assert all(not {2, 3, 4} & set(ids) for ids in _ids(plain["custom_logit_processor"]))
    assert any(len(ids) < N for ids in _ids(plain["stop_ids"]))
    assert any(len(ids) < N for ids in _ids(plain["stop_str"]))


def test_logprobs_equal_target_only(answers):
    plain, ddtree = answers
    assert _ids(ddtree["logprobs"]) == _ids(plain["logprobs"])
    for a, b in zip(ddtree["logprobs"], plain["logprobs"]):
        la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
        assert len(la) == len(lb) == len(a["output_ids"])
        for (va, ia, *_), (vb, ib, *_) in zip(la, lb):
            assert ia == ib and va == pytest.approx(vb, abs=1e-4), (la, lb)
        ta, tb = a["meta_info"]["output_top_logprobs"], b["meta_info"]["output_top_logprobs"]
        assert len(ta) == len(tb)
        for ra, rb in zip(ta, tb):
            assert [x[1] for x in ra] == [x[1] for x in rb]
            assert [x[0] for x in ra] == pytest.approx([x[0] for x in rb], abs=1e-4)


def test_custom_logit_processor_request_refused(answers):
    """The DDTREE server was launched without the flag (it refuses it), so SGLang's request check
    refuses a request that carries a processor, naming the flag; no tokens come back."""
    _, ddtree = answers
    msg = ddtree["custom_logit_processor"]
    assert "not configured to enable custom logit processor" in msg, msg


def test_custom_logit_processor_launch_refused(engines, re_models):
    kw = cases.engine_kwargs("features", re_models)
    kw["enable_custom_logit_processor"] = True
    msg = engines.refusal("ddtree-custom-logits", kw)
    assert "DDTREE: does not support --enable-custom-logit-processor" in msg, msg
    assert "the tree verify does not run custom logit processors" in msg, msg


def test_lora_launch_refused(engines, re_models):
    kw = cases.engine_kwargs("features", re_models)
    kw.update(enable_lora=True, max_lora_rank=8, lora_target_modules=["q_proj"])
    msg = engines.refusal("ddtree-lora", kw)
    assert "LoRA is only compatible with" in msg and "not DDTREE" in msg, msg
