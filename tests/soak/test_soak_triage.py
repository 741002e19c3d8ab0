"""soak_triage's verdicts (tools/soak/soak_triage.py), without an engine: a divergence is called a
near-tie only when the CPU's own decode says so; anything else stays visible as real or inconclusive."""

from __future__ import annotations

import json

import pytest
import soak_triage as tri

# request 7: both engines agree on 5 tokens, then the speculative one picks 21 where target-only picked 22
D = {"index": 7, "k": 5, "speculative": [3, 4, 5, 6, 7, 21, 9], "reference": [3, 4, 5, 6, 7, 22, 8]}
REF = D["reference"]


def _top2(at_k):
    """Per-position top-2 where only position k matters; the others are wide margins."""
    return [[[t, -0.1], [99, -5.0]] for t in REF[:5]] + [at_k] + [[[8, -0.1], [99, -5.0]]]


def test_near_tie_needs_the_disputed_pair_and_a_small_gap():
    row = tri.classify(D, REF, _top2([[22, -0.500], [21, -0.503]]), tie_gap=0.01)
    assert row["verdict"] == "near-tie" and row["cpu_top2"] == [22, 21]
    assert row["gap"] == pytest.approx(0.003)


def test_a_wide_gap_is_real():
    row = tri.classify(D, REF, _top2([[22, -0.1], [21, -2.4]]), tie_gap=0.01)
    assert row["verdict"] == "real" and "gap" in row["why"]


def test_a_third_token_is_real():
    """The speculative token is not even the CPU's second choice: no rounding explains it."""
    row = tri.classify(D, REF, _top2([[22, -0.500], [30, -0.501]]), tie_gap=0.01)
    assert row["verdict"] == "real" and "disputed pair" in row["why"]


def test_an_earlier_cpu_difference_is_inconclusive():
    cpu = REF[:3] + [40] + REF[4:]
    row = tri.classify(D, cpu, _top2([[22, -0.500], [21, -0.503]]), tie_gap=0.01)
    assert row["verdict"] == "inconclusive"
    short = tri.classify(D, REF, _top2([[22, -0.5], [21, -0.503]])[:5], tie_gap=0.01)
    assert short["verdict"] == "inconclusive"


def _soak_dir(tmp_path, spec_outputs, ref_outputs):
    reqs = [{"index": i, "input_ids": [5, 6], "sampling_params": {"temperature": 0}} for i in range(len(ref_outputs))]
    files = {
        "soak-ddtree-job.json": {"requests": reqs},
        "soak-ddtree-result.json": {"results": [{"index": i, "final": {"output_ids": o}} for i, o in enumerate(spec_outputs)]},
        "reference-plain-job.json": {"requests": reqs},
        "reference-plain-result.json": {"outputs": [{"output_ids": o} for o in ref_outputs]},
    }
    for name, doc in files.items():
        (tmp_path / name).write_text(json.dumps(doc))
    return tmp_path


def test_diverged_lists_token_differences_only(tmp_path):
    d = _soak_dir(
        tmp_path, spec_outputs=[[1, 2, 3], [1, 2], [1, 9, 3], None], ref_outputs=[[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2]]
    )
    got = tri.diverged(d)
    assert [(g["index"], g["k"]) for g in got] == [(2, 1)]  # equal, a prefix and an unfinished one are not listed


def test_diverged_refuses_an_unfinished_soak(tmp_path):
    d = _soak_dir(tmp_path, [[1]], [[1]])
    (d / "reference-plain-result.json").unlink()
    with pytest.raises(SystemExit, match="reference-plain-result.json"):
        tri.diverged(d)
