"""DDTREE (B=16, --speculative-ddtree-debug-metrics, --chunked-prefill-size 16) on the real engine,
under SGLang's overlap scheduler (step i + 1 is scheduled before step i's results are processed).

Every greedy case is compared token for token with transformers' greedy generate() and with the
plain engine's output for the same prompt.
"""

from __future__ import annotations

import pytest

import re_cases as cases
from re_checks import assert_greedy, assert_overlap, assert_tokens

ENGINE = "ddtree16"


@pytest.fixture(scope="module")
def eng(engines):
    engines.plain(list(cases.PROMPTS) + [cases.LONG_PROMPT], cases.N_NEW)  # references first
    e = engines.get(ENGINE)
    assert_overlap(e)  # every case of this module runs under the overlap scheduler
    yield e
    engines.stop()


def _steps(meta) -> list[int]:
    steps = meta.get("ddtree_accept_length")
    assert isinstance(steps, list) and steps, f"no ddtree_accept_length in meta_info: {sorted(meta)}"
    return steps


def test_single_request_equals_greedy(eng, engines, hf_greedy):
    p = cases.PROMPTS[0]
    outs = eng.generate([p], cases.greedy(cases.N_NEW))
    assert_greedy(outs, [p], cases.N_NEW, hf_greedy, engines.plain([p], cases.N_NEW))


def test_batch_of_4_ragged_prompts_equals_greedy(eng, engines, hf_greedy):
    outs = eng.generate(cases.PROMPTS, cases.greedy(cases.N_NEW))
    assert_greedy(outs, cases.PROMPTS, cases.N_NEW, hf_greedy, engines.plain(cases.PROMPTS, cases.N_NEW))
    # The case must exercise multi-token acceptance (else it tests plain decoding again).
    assert max(max(_steps(o["meta_info"])) for o in outs) >= 2, [o["meta_info"] for o in outs]


def test_requests_joining_mid_decode_equal_greedy(eng, engines, hf_greedy):
    p = cases.PROMPTS
    reqs = [dict(input_ids=p[0], sampling_params=cases.greedy(cases.N_NEW)),
            dict(input_ids=p[3], sampling_params=cases.greedy(cases.N_NEW), start_after=[0, 5]),
            dict(input_ids=p[1], sampling_params=cases.greedy(cases.N_NEW), start_after=[0, 12]),
            dict(input_ids=p[2], sampling_params=cases.greedy(cases.N_NEW), start_after=[1, 6])]
    outs = eng.script(reqs)
    prompts = [r["input_ids"] for r in reqs]
    assert_greedy(outs, prompts, cases.N_NEW, hf_greedy, engines.plain(prompts, cases.N_NEW))
    for i, (r, o) in enumerate(zip(reqs[1:], outs[1:]), 1):
        j, n = r["start_after"]
        # It joined while request j was decoding (not before it started, not after it ended).
        assert n <= o["started_at_other_tokens"] < cases.N_NEW, (i, o["started_at_other_tokens"])


def test_chunked_prefill_equals_greedy(eng, engines, hf_greedy):
    assert int(eng.server_args["chunked_prefill_size"]) == cases.CHUNK
    assert len(cases.LONG_PROMPT) > 2 * cases.CHUNK  # prefilled in >= 3 chunks
    p = [cases.LONG_PROMPT, cases.PROMPTS[1]]
    outs = eng.generate(p, cases.greedy(cases.N_NEW))
    assert_greedy(outs, p, cases.N_NEW, hf_greedy, engines.plain(p, cases.N_NEW))


def test_request_aborted_mid_decode(eng, engines, hf_greedy):
    p = cases.PROMPTS
    reqs = [dict(input_ids=p[2], sampling_params=cases.greedy(cases.N_NEW)),
            dict(input_ids=p[0], sampling_params=cases.greedy(200), abort_after=6),
            dict(input_ids=p[3], sampling_params=cases.greedy(cases.N_NEW))]
    outs = eng.script(reqs)
    victim = outs[1]
    assert victim["abort_sent"]
    fr = victim["finish_reason"]
    assert isinstance(fr, dict) and fr.get("type") == "abort", fr
    assert 6 <= len(victim["output_ids"]) < 200
    # The victim's tokens up to the abort are still greedy's.
    assert_tokens("transformers greedy generate()", [victim["output_ids"]],
                  [hf_greedy(p[0], len(victim["output_ids"]))], [p[0]])
    survivors = [outs[0], outs[2]]
    sp = [p[2], p[3]]
    assert_greedy(survivors, sp, cases.N_NEW, hf_greedy, engines.plain(sp, cases.N_NEW))
    # The engine still serves correctly after the abort (freed rows/slots reused).
    again = eng.generate([p[0], p[1]], cases.greedy(cases.N_NEW))
    assert_greedy(again, [p[0], p[1]], cases.N_NEW, hf_greedy, engines.plain([p[0], p[1]], cases.N_NEW))


def test_debug_metrics_match_sglang_histogram(eng):
    outs = eng.generate(cases.PROMPTS, cases.greedy(cases.N_NEW))
    for o in outs:
        m = o["meta_info"]
        steps = _steps(m)
        for key in ("ddtree_tree_depth", "ddtree_predicted_accept_length", "ddtree_tree_size"):
            assert len(m[key]) == len(steps), (key, m)
        assert m["spec_verify_ct"] == len(steps), m
        hist = m["spec_correct_drafts_histogram"]
        ours = [0] * (max(steps))
        for t in steps:
            ours[t - 1] += 1
        trimmed = list(hist)
        while trimmed and trimmed[-1] == 0:
            trimmed.pop()
        assert trimmed == ours, f"SGLang histogram {hist} != DDTREE accept lengths {steps}"
        assert m["spec_num_correct_drafts"] == sum(t - 1 for t in steps), m
        # One token from the prefill, then every step emits its accepted path (bonus included);
        # the last step may be cut by max_new_tokens.
        assert sum(steps[:-1]) + 1 < len(o["output_ids"]) <= sum(steps) + 1, (steps, len(o["output_ids"]))
        assert all(1 <= t <= 8 for t in steps) and all(0 <= d <= 7 for d in m["ddtree_tree_depth"])
        assert all(s == 16 for s in m["ddtree_tree_size"]), m["ddtree_tree_size"]


def _paths(prompt, eng):
    """Token index ranges [start, end) of each decode step's accepted path for ``prompt``."""
    o = eng.generate([prompt], cases.greedy(cases.N_NEW))[0]
    spans, pos = [], 1  # token 0 comes from the prefill
    for t in _steps(o["meta_info"]):
        spans.append((pos, pos + t))
        pos += t
    return o["output_ids"], spans


def test_max_new_tokens_inside_an_accepted_path(eng, hf_greedy):
    p = cases.PROMPTS[3]
    full, spans = _paths(p, eng)
    inner = [(s, e) for s, e in spans if e - s >= 2 and e <= cases.N_NEW]
    assert inner, f"no decode step accepted >= 2 tokens for this prompt: {spans}"
    s, e = inner[0]
    n = s + 1  # stop after the first token of a multi-token path: the rest must be cut
    o = eng.generate([p], cases.greedy(n))[0]
    assert o["output_ids"] == hf_greedy(p, n), (o["output_ids"], hf_greedy(p, n))
    assert o["meta_info"]["completion_tokens"] == n
    fr = o["finish_reason"]
    assert isinstance(fr, dict) and fr.get("type") == "length", fr


def test_eos_inside_an_accepted_path(eng, hf_greedy):
    p = cases.PROMPTS[3]
    full, spans = _paths(p, eng)
    ref = hf_greedy(p, cases.N_NEW)
    assert full == ref
    pick = None
    for s, e in spans:
        for k in range(s, min(e, len(ref)) - 1):  # not the last token of its path
            if ref[k] not in ref[:k]:
                pick = k
                break
        if pick is not None:
            break
    assert pick is not None, f"no token first appears inside a multi-token path: {ref} {spans}"
    stop = ref[pick]
    o = eng.generate([p], dict(max_new_tokens=cases.N_NEW, temperature=0.0, stop_token_ids=[stop]))[0]
    assert o["output_ids"][: pick + 1] == ref[: pick + 1], (o["output_ids"], ref, pick)
    # Nothing after the stop token (SGLang may or may not echo the stop token itself).
    assert len(o["output_ids"]) in (pick, pick + 1), (o["output_ids"], pick)
    fr = o["finish_reason"]
    assert isinstance(fr, dict) and fr.get("type") == "stop" and fr.get("matched") == stop, fr


def test_sampling_at_positive_temperature_runs(eng, hf_greedy):
    """T > 0 through DDTREE's target-sampled tree walk: valid tokens, really sampled."""
    params = dict(max_new_tokens=cases.N_NEW, temperature=0.9, top_p=0.95, top_k=10, ignore_eos=True)
    outs = eng.generate(cases.PROMPTS, params)
    toks = [o["output_ids"] for o in outs]
    for t in toks:
        assert len(t) == cases.N_NEW and all(0 <= x < 12 for x in t), t
    assert toks != [hf_greedy(p, cases.N_NEW) for p in cases.PROMPTS], "T > 0 gave greedy's tokens"
    assert all(o["meta_info"].get("spec_verify_ct", 0) > 0 for o in outs)
