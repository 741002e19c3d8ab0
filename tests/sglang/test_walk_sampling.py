"""DDTree's T > 0 walk sampler draws each node from the target's own filtered distribution
(temperature, top-k, top-p and min-p), as SGLang's normal sampler does (patch ddtree-verify-input-and-walk).

The harness (_walk_sampling_harness.py) says what is real and what is stood in. Guards the
min-p fix: without min-p in ``sample_tree_target_tokens`` the walk draws tokens that min-p
excludes (zero_hits > 0) and the chi-square explodes.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps


@pytest.fixture(scope="module")
def report(patched_site, harness):
    return harness(patched_site, "_walk_sampling_harness.py")


def _rows(report, name):
    rows = [r for r in report["results"] if r["sampler"] == name]
    assert rows, name
    return rows


def test_exact_targets_are_filtered():
    """Sanity of the test itself: every request's min-p removes tokens beyond top-k/top-p."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "wsh", Path(__file__).with_name("_walk_sampling_harness.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import random

    rng = random.Random(3)
    row = [rng.gauss(0, 2) for _ in range(mod.V)]
    with_mp = mod.exact(row, 1.0, 1 << 30, 1.0, 0.3)
    without = mod.exact(row, 1.0, 1 << 30, 1.0, 0.0)
    assert sum(1 for v in with_mp if v > 0) < sum(1 for v in without if v > 0)


@pytest.mark.parametrize("sampler", ["sglang_sampler", "walk_cpu", "walk_kernel_branch"])
def test_per_node_distribution_matches_target(report, sampler):
    for r in _rows(report, sampler):
        target = report["targets"][r["req"]]
        assert sum(1 for p in target if p == 0.0) > 0, "min-p/top-k/top-p must cut tokens"
        assert r["zero_hits"] == 0, r
        assert r["chi2"] < report["chi2_limit"], r


def test_walk_matches_sglang_sampler_counts(report):
    """Walk (CPU branch) vs SGLang's own sampler, draw for draw counts close (two-sample)."""
    own = {r["req"]: r["counts"] for r in _rows(report, "sglang_sampler")}
    for r in _rows(report, "walk_cpu"):
        a, b = r["counts"], own[r["req"]]
        stat = sum((x - y) ** 2 / (x + y) for x, y in zip(a, b) if x + y > 0)
        assert stat < report["chi2_limit"], (r["req"], a, b)
