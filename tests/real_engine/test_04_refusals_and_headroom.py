"""A hybrid target is refused with its message; the KV-row headroom at the context limit."""

from __future__ import annotations

import re_cases as cases
from re_checks import assert_greedy, assert_overlap


def test_hybrid_target_refused(engines, re_models):
    kw = cases.engine_kwargs("ddtree16", re_models)
    kw["model_path"] = str(re_models["hybrid"])
    # The CPU platform has no Mamba state snapshots (arg_groups/mamba_hook.py:120 refuses the
    # extra_buffer strategy first); no_buffer lets resolution reach the DDTREE hook.
    kw["mamba_radix_cache_strategy"] = "no_buffer"
    kw["disable_overlap_schedule"] = True  # what no_buffer requires (its own assertion)
    msg = engines.refusal("hybrid", kw)
    assert "DDTREE: the target model is hybrid (Mamba/linear attention)" in msg, msg
    assert "--speculative-ddtree-allow-hybrid-unsafe" in msg, msg


def test_kv_rows_at_the_context_limit(engines, hf_greedy):
    """Four requests decode up to ``--context-length`` at once: long prompts that reach the
    limit early next to short ones that keep decoding. A request's decode reservation must stay
    inside its own ``req_to_token`` row; if it spills into the next row, that request's KV slot
    map is overwritten and its tokens stop being greedy's (or an index runs off the pool)."""
    prompts = cases.HEADROOM_PROMPTS
    ns = [cases.headroom_max_new(p) for p in prompts]
    plain = [engines.plain([p], n)[0] for p, n in zip(prompts, ns)]
    eng = engines.get("headroom")
    try:
        assert int(eng.server_args["context_length"]) == cases.HEADROOM_CONTEXT
        assert_overlap(eng)
        outs = eng.generate(prompts, [cases.greedy(n) for n in ns])
        for p, n, o, pl in zip(prompts, ns, outs, plain):
            assert len(p) + n == cases.HEADROOM_CONTEXT - 2
            assert_greedy([o], [p], n, hf_greedy, [pl])
    finally:
        engines.stop()


def test_default_topk_cap_lowered_to_the_vocabulary(engines, re_models, hf_greedy):
    """Budget 23 with no cap: the default cap min(23, 32) = 23 exceeds the 12-token vocabulary.
    Before the top-K cap check (patch ddtree-server-args) the engine started and its scheduler died at the first decode step
    (``torch.topk``: selected index k out of range); now the cap is lowered to 12 at start-up,
    and the engine decodes greedy's tokens."""
    kw = cases.engine_kwargs("ddtree16", re_models)
    kw.pop("speculative_ddtree_topk_cap")
    kw["speculative_ddtree_budget"] = 23
    n = 12
    plain = engines.plain(cases.PROMPTS, n)
    eng = engines.try_start("ddtree23-default-cap", kw)
    try:
        assert eng.server_args["speculative_eagle_topk"] == "12", eng.server_args
        outs = eng.generate(cases.PROMPTS, cases.greedy(n))
        assert_greedy(outs, cases.PROMPTS, n, hf_greedy, plain)
    finally:
        eng.stop()


def test_topk_cap_above_the_vocabulary_refused(engines, re_models):
    """A cap the user gave above the vocabulary is refused at start-up with the number to give."""
    kw = cases.engine_kwargs("ddtree16", re_models)
    kw["speculative_ddtree_budget"] = 23
    kw["speculative_ddtree_topk_cap"] = 23
    msg = engines.refusal("ddtree23-cap23", kw)
    assert "--speculative-ddtree-topk-cap (23) exceeds the target vocabulary (12 tokens)" in msg, msg
    assert "give a cap <= 12" in msg, msg
