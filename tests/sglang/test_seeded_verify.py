"""What per-request seeds (``sampling_seed``) do to a DDTREE verify at T > 0 (issue 9 item d;
documented in docs/sglang-integration.md, "Sampling at T > 0, and per-request seeds").

The harness (_seeded_verify_harness.py) says what is real (``eagle_sample`` as patched by 0009,
SGLang's seeded coins) and what is stood in (the CUDA kernels, which record their inputs).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps


@pytest.fixture(scope="module")
def rep(patched_site, harness):
    return harness(patched_site, "_seeded_verify_harness.py")


def _kernels(calls):
    return [c["kernel"] for c in calls]


def test_seeded_batch_takes_the_target_only_kernel_not_the_walk(rep):
    (call,) = rep["seeded"]
    assert call["kernel"] == "tree_speculative_sampling_target_only", rep["seeded"]
    assert call["draft_probs_zero"]
    # Fed the target's own distribution: softmax(logits / T), min-p applied, renormalized.
    for got_req, want_req in zip(call["target_probs"], rep["expected_target_probs"]):
        for got, want in zip(got_req, want_req):
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-6
    assert all(0.0 <= c < 1.0 for row in call["coins"] for c in row) and len(call["coins"][0]) == 5


def test_seeded_coins_depend_on_seed_and_committed_length_only(rep):
    seeded = rep["seeded"][0]
    assert rep["seeded_again"][0]["coins"] == seeded["coins"]  # reproducible
    assert rep["seeded_again"][0]["final_coins"] == seeded["final_coins"]
    alone = rep["seeded_alone"][0]  # request 2 of the batch, alone in its batch
    assert alone["coins"] == [seeded["coins"][1]] and alone["final_coins"] == [seeded["final_coins"][1]]
    for case in ("seeded_other_len", "seeded_other_seed"):  # request 1 changed, request 2 not
        other = rep[case][0]
        assert other["coins"][0] != seeded["coins"][0] and other["coins"][1] == seeded["coins"][1], case


def test_unseeded_batch_takes_the_walk(rep):
    assert _kernels(rep["unseeded"]) == ["sample_tree_target_tokens", "verify_tree_greedy"]


def test_cpu_verify_is_the_argmax_walk_at_any_temperature(rep):
    # SGLang's _verify_uses_greedy: is_cpu -> argmax, seeded or not (the CPU engine's T > 0).
    assert _kernels(rep["cpu_seeded"]) == _kernels(rep["cpu_unseeded"]) == ["verify_tree_greedy"]
    assert rep["cpu_seeded"][0]["target_predict"] == rep["cpu_unseeded"][0]["target_predict"]
