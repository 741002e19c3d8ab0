"""DDTREE's spec_accept_rate = accepted draft tokens / (verify steps x tree depth limit), the
depth limit being block_size - 1: the same denominator as DFLASH's rate (patch ddtree-debug-metrics), so the
two are comparable; SGLang's generic denominator (speculative_num_draft_tokens - 1 = B) would
make a DDTREE step that accepts every draft it can read 15/64. Harness:
_accept_rate_harness.py (what is real, what is stood in)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps


@pytest.fixture(scope="module")
def report(patched_site, harness):
    return harness(patched_site, "_accept_rate_harness.py")


def test_rate_is_accepted_over_steps_times_depth_limit(report):
    for case in report["cases"]:
        steps, depth = case["steps"], case["block_size"] - 1
        meta = case["meta"]
        assert meta["spec_verify_ct"] == len(steps)
        assert meta["spec_num_correct_drafts"] == sum(steps)
        assert meta["spec_num_proposed_drafts"] == len(steps) * depth, case
        assert meta["spec_accept_rate"] == pytest.approx(sum(steps) / (len(steps) * depth))
        assert meta["spec_accept_length"] == pytest.approx(1 + sum(steps) / len(steps))


def test_full_acceptance_reads_one(report):
    full = [c for c in report["cases"] if c["algo"] == "DDTREE" and c["block_size"] == 8]
    assert full and full[0]["meta"]["spec_accept_rate"] == pytest.approx(1.0)


def test_ddtree_and_dflash_share_the_denominator(report):
    by = {(c["algo"], c["block_size"]): c["meta"] for c in report["cases"]}
    dd, df = by[("DDTREE", 16)], by[("DFLASH", 16)]
    assert dd["spec_num_proposed_drafts"] / dd["spec_verify_ct"] == (
        df["spec_num_proposed_drafts"] / df["spec_verify_ct"])
