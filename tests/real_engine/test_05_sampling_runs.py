"""T > 0 on DDTREE is deterministic across two runs: two engines of the same config and
--random-seed, the same requests in the same order, give the same sampled tokens.

(Per-request ``sampling_seed`` only takes effect under --enable-deterministic-inference in
SGLang 0.5.23, `srt/hardware_backend/mlx/sampling.py:77` says so for every backend; unseeded T > 0
batches are the ones the series routes to its tree-walk sampler, so those are what this runs.)
"""

from __future__ import annotations

import re_cases as cases
from re_checks import assert_overlap


def _run(engines):
    eng = engines.get("sampling")
    try:
        assert_overlap(eng)
        out = []
        for p in cases.PROMPTS:  # one at a time: the batch composition is the same in both runs
            o = eng.generate([p], dict(max_new_tokens=cases.N_NEW, temperature=0.9, top_p=0.95,
                                       top_k=10, ignore_eos=True))[0]
            assert o["meta_info"].get("spec_verify_ct", 0) > 0
            out.append(o["output_ids"])
        return out
    finally:
        engines.stop()


def test_sampling_deterministic_across_two_runs(engines, hf_greedy):
    first = _run(engines)
    second = _run(engines)
    assert first == second, f"same --random-seed, same requests, different tokens:\n{first}\n{second}"
    assert first != [hf_greedy(p, cases.N_NEW) for p in cases.PROMPTS]
