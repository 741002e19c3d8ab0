"""``python -m sglang.srt.speculative.ddtree_probe`` from the series' build, in a subprocess.

The probe must fail on a broken builder or walk. The series ships no fault switch for that: each fault
case runs the probe's ``main`` in a subprocess whose builder or walk this test replaces first (FAULTY).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import textwrap

import pytest
import torch

from ddtree_offline.heap_oracle import build_ddtree_tree_heap

PROBE = "sglang.srt.speculative.ddtree_probe"

# The probe's main with a broken builder or walk (argv[1] names the fault).
FAULTY = textwrap.dedent(r"""
    import sys, torch
    from sglang.srt.speculative import ddtree_probe as probe, ddtree_utils as du
    fault, real_build, real_accept = sys.argv[1], du.build_ddtree_tree_from_topk, du.ddtree_accept

    def build(ids, lps, roots, starts, budget):
        if fault == "suboptimal":
            # The best tree for other log-probs (every depth-1 rank scores 0), its scores then summed from
            # the true ones: tokens, ranks, scores and structure agree with the inputs; only the choice of
            # prefixes is wrong.
            fake = lps.clone()
            fake[:, 0, :] = 0.0
            tree = real_build(ids, fake, roots, starts, budget)
            score, rows = tree.node_logprobs.clone(), torch.arange(ids.shape[0])
            for i in range(1, score.shape[1]):
                lp = lps[rows, tree.depths[:, i] - 1, tree.ranks[:, i]].float()
                score[:, i] = score[rows, tree.parents[:, i]] + lp
            return tree._replace(node_logprobs=score)
        tree = real_build(ids, lps, roots, starts, budget)
        n = tree.draft_tokens.shape[1]
        if fault == "tokens":
            tokens = tree.draft_tokens.clone()
            tokens[:, n - 1] += 1
            return tree._replace(draft_tokens=tokens)
        if fault == "parents" and n > 2:
            parents = tree.parents.clone()
            parents[:, n - 1] = 0 if int(parents[0, n - 1]) != 0 else 1
            return tree._replace(parents=parents)
        return tree

    def accept(tree, targets, *args, **kwargs):
        acc = real_accept(tree, targets, *args, **kwargs)
        return acc._replace(accept_length=acc.accept_length - 1) if fault == "accept" else acc

    du.build_ddtree_tree_from_topk, du.ddtree_accept = build, accept
    sys.exit(probe.main(["--device", "cpu", "--budgets", "8,32", "--batch", "2"]))
""")


def _env(overlay_dir):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(overlay_dir)  # a bare sglang/ tree holding only the series' files
    return env


def run_probe(overlay_dir, *args):
    return subprocess.run([sys.executable, "-m", PROBE, *args], capture_output=True, text=True,
                          env=_env(overlay_dir), cwd=str(overlay_dir), timeout=120)


def test_overlay_is_a_bare_sglang_tree(overlay_dir):
    assert (overlay_dir / "sglang/srt/speculative/ddtree_probe.py").is_file()
    assert not (overlay_dir / "sglang/__init__.py").exists()


def test_probe_passes_on_cpu(overlay_dir):
    proc = run_probe(overlay_dir, "--device", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    line = lines[0]
    assert line.startswith("ddtree_probe OK device=cpu budgets=16,64,256 batch=4 ")
    fields = dict(part.split("=", 1) for part in line.split()[2:])
    assert int(fields["checks"]) > 0
    for key in ("build_ms", "walk_ms"):
        assert float(fields[key]) >= 0.0


def test_probe_json(overlay_dir):
    proc = run_probe(overlay_dir, "--device", "cpu", "--budgets", "8,32", "--batch", "2", "--seed", "3", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    assert info["ok"] is True and info["device"] == "cpu" and info["budgets"] == [8, 32] and info["batch"] == 2


@pytest.mark.parametrize("fault", ["tokens", "parents", "accept", "suboptimal"])
def test_probe_fails_on_a_broken_builder_or_walk(overlay_dir, fault):
    proc = subprocess.run([sys.executable, "-c", FAULTY, fault], capture_output=True, text=True,
                          env=_env(overlay_dir), cwd=str(overlay_dir), timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ddtree_probe FAIL"), proc.stdout + proc.stderr
    assert "reason=" in proc.stdout


def test_best_prefix_certificate_rejects_a_well_formed_tree_that_is_not_the_best(overlay_dir):
    """D 2, K 2: the best two prefixes are (0) at -0.1 and (0, 0) at -0.3. The tree of (0) and (1) (the
    oracle's best for a second depth of -5 / -6) is well formed and numbered by its true scores; only a
    prefix outside it, (0, 0), comes before its last node. The oracle's own best tree passes."""
    probe = _import_probe(overlay_dir)
    ids = torch.tensor([[[11, 12], [21, 22]]])
    lps = torch.tensor([[[-0.1, -3.0], [-0.2, -4.0]]])
    roots, starts = torch.tensor([7]), torch.tensor([100])
    probe.check_best_prefixes(build_ddtree_tree_heap(ids, lps, roots, starts, 2), ids, lps, 2)
    wrong = build_ddtree_tree_heap(ids, torch.tensor([[[-0.1, -3.0], [-5.0, -6.0]]]), roots, starts, 2)
    assert wrong.draft_tokens.tolist() == [[7, 11, 12]]
    with pytest.raises(probe.ProbeFailure, match=r"prefix \(0, 0\) is outside the tree but comes before its last node \(1,\)"):
        probe.check_best_prefixes(wrong, ids, lps, 2)
    # with fewer nodes than the budget, the tree must hold every prefix
    with pytest.raises(probe.ProbeFailure, match=r"2 nodes for budget 3, but prefix \(1,\) is outside the tree"):
        probe.check_best_prefixes(build_ddtree_tree_heap(ids, lps, roots, starts, 2), ids, lps, 3)


def _import_probe(overlay_dir):
    from ddtree_deploy.build.overlay import import_patched

    return import_patched(PROBE)


def test_probe_rejects_bad_arguments(overlay_dir):
    proc = run_probe(overlay_dir, "--budgets", "0")
    assert proc.returncode == 2
    assert "FAIL" in proc.stdout
