"""``python -m sglang.srt.speculative.ddtree_probe`` from the series' build, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = "sglang.srt.speculative.ddtree_probe"


def run_probe(overlay_dir, *args, fault=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDTREE_PROBE_INJECT_FAULT")}
    env["PYTHONPATH"] = str(overlay_dir)  # a bare sglang/ tree holding only the series' files
    if fault is not None:
        env["DDTREE_PROBE_INJECT_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", PROBE, *args], capture_output=True, text=True, env=env,
                          cwd=str(overlay_dir), timeout=120)


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
    for key in ("build_ms", "walk_ms", "heap_ms"):
        assert float(fields[key]) >= 0.0


def test_probe_json(overlay_dir):
    proc = run_probe(overlay_dir, "--device", "cpu", "--budgets", "8,32", "--batch", "2", "--seed", "3", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    assert info["ok"] is True and info["device"] == "cpu" and info["budgets"] == [8, 32] and info["batch"] == 2


@pytest.mark.parametrize("fault", ["1", "parents", "accept"])
def test_probe_fails_with_injected_fault(overlay_dir, fault):
    proc = run_probe(overlay_dir, "--device", "cpu", "--budgets", "8,32", "--batch", "2", fault=fault)
    assert proc.returncode != 0, proc.stdout
    assert proc.stdout.startswith("ddtree_probe FAIL"), proc.stdout + proc.stderr
    assert "reason=" in proc.stdout


def test_probe_rejects_bad_arguments(overlay_dir):
    proc = run_probe(overlay_dir, "--budgets", "0")
    assert proc.returncode == 2
    assert "FAIL" in proc.stdout
