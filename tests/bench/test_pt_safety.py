"""Baseline .pt files are data: loading one must never execute code."""

from __future__ import annotations

import pickle
import subprocess
import sys
import types

import pytest
import torch

from bench_helpers import run_cli
from ddtree_deploy.errors import UsageError
from ddtree_deploy.measure.records import load_pt, load_records


class Evil:
    """Unpickling this writes ``marker`` (via exec)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _payload_is_live(path, marker) -> None:
    """Prove the payload would really run under a plain pickle load (in a throwaway process)."""
    code = "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))"
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    assert marker.exists()
    marker.unlink()


def test_malicious_raw_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned.txt"
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"responses": [{"baseline": Evil(str(marker))}]}, protocol=2))
    _payload_is_live(evil, marker)
    with pytest.raises(UsageError, match="refused to load"):
        load_pt(evil)
    with pytest.raises(UsageError):
        load_records(evil)
    assert not marker.exists()


def test_malicious_torch_zip_is_refused_by_the_cli(tmp_path, bench_env):
    marker = tmp_path / "pwned.txt"
    evil = tmp_path / "evil.pt"
    torch.save({"responses": [{"baseline": Evil(str(marker))}], "args": {"dataset": "x"}}, evil)
    good = tmp_path / "run.jsonl"
    good.write_text('{"dataset":"x","method":"baseline","budget":null,"prompt_index":0,"output_ids":[1]}\n')
    proc = run_cli(bench_env, "compare", str(evil), str(good))
    assert proc.returncode == 2, proc.stderr
    assert "refused to load" in proc.stderr and "exec" in proc.stderr
    assert not marker.exists()


def test_reference_layout_loads_and_strips_the_prompt(tmp_path):
    rec = types.SimpleNamespace(
        output_ids=torch.tensor([[9, 9, 9, 1, 2, 3, 4]]), num_input_tokens=3, num_output_tokens=4,
        time_to_first_token=0.1, time_per_output_token=0.01, acceptance_lengths=[2, 2], decode_rounds=2,
        stage_times={"verify": 0.01}, round_timestamps=[0.1, 0.2], round_trees=[],
    )
    p = tmp_path / "gsm8k.pt"
    torch.save({"responses": [{"baseline": rec, "ddtree_tb32": rec}], "block_size": 16,
                "args": {"dataset": "gsm8k", "temperature": 0.0}}, p)
    recs = {r.method: r for r in load_records(p)}
    assert recs["baseline"].output_ids == [1, 2, 3, 4]
    assert recs["ddtree_tb32"].budget == 32 and recs["ddtree_tb32"].dataset == "gsm8k"
    assert recs["ddtree_tb32"].tau == 2.0 and recs["ddtree_tb32"].time_per_output_token == 0.01


def test_other_unsafe_globals_are_refused(tmp_path):
    import fractions  # harmless, but not on the allow-list: refused all the same

    p = tmp_path / "odd.pt"
    torch.save({"responses": [{"baseline": fractions.Fraction(1, 3)}]}, p)
    with pytest.raises(UsageError, match="Fraction"):
        load_pt(p)
