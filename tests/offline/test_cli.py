"""The ``python -m ddtree_offline`` CLI and the core-module resolution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from offline_helpers import ROOT

RUN_KEYS = {"dataset", "method", "budget", "prompt_index", "output_ids", "acceptance_lengths",
            "accept_length_mean", "verify_ct", "num_output_tokens", "time_per_output_token", "latency_s", "meta_info"}


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tools"), str(ROOT / "deploy"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "ddtree_offline", *args], cwd=ROOT, env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


def _check_plain(obj, path="run"):
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, str), path
            _check_plain(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_plain(v, f"{path}[{i}]")
    else:
        assert obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)), (path, type(obj))


def test_cli_run_writes_jsonl_and_reference_pt(tmp_path, du):
    r = _cli("run", "--out-dir", str(tmp_path), "--num-prompts", "3", "--prompt-len", "12", "--max-new-tokens", "16",
             "--budgets", "4,32", "--block-size", "6", "--quality", "0.8", "--threads", "1", "--dtype", "float64")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["lossless_mismatches"] == 0
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert len(recs) == 3 * 4
    by = {}
    for rec in recs:
        assert set(rec) == RUN_KEYS
        assert rec["num_output_tokens"] == len(rec["output_ids"]) == 16
        by.setdefault(rec["prompt_index"], {})[rec["method"]] = rec
    for i, group in by.items():
        assert set(group) == {"baseline", "dflash", "ddtree_tb4", "ddtree_tb32"}
        assert group["baseline"]["acceptance_lengths"] is None and group["baseline"]["budget"] is None
        assert group["ddtree_tb32"]["budget"] == 32
        assert all(g["output_ids"] == group["baseline"]["output_ids"] for g in group.values())
        assert group["dflash"]["accept_length_mean"] >= 1.0
        assert group["dflash"]["verify_ct"] == len(group["dflash"]["acceptance_lengths"])

    data = torch.load(tmp_path / "run.pt", weights_only=True)
    assert set(data) == {"responses", "block_size", "draft_attn_implementation", "target_attn_implementation", "args"}
    assert data["block_size"] == 6 and len(data["responses"]) == 3
    _check_plain(data)
    for i, resp in enumerate(data["responses"]):
        assert set(resp) == {"baseline", "dflash", "ddtree_tb4", "ddtree_tb32"}
        base = resp["baseline"]
        n_in = base["num_input_tokens"]
        assert base["output_ids"].shape == (1, n_in + 16)
        assert base["output_ids"][0, n_in:].tolist() == by[i]["baseline"]["output_ids"]
        for key in ("dflash", "ddtree_tb4", "ddtree_tb32"):
            assert torch.equal(resp[key]["output_ids"], base["output_ids"])
        assert {"predicted_acceptance", "tree_sizes", "tree_depths"} <= set(resp["ddtree_tb32"])


def test_cli_sweep_writes_markdown_and_png(tmp_path, du):
    r = _cli("sweep", "--out-dir", str(tmp_path), "--num-prompts", "1", "--prompt-len", "8", "--max-new-tokens", "12",
             "--qualities", "0.5,0.9", "--budgets", "16,64", "--block-size", "6", "--threads", "1", "--no-warmup")
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "sweep.md").read_text()
    assert "SYNTHETIC" in md and "device: cpu" in md and "date:" in md and "machine:" in md
    assert md.count("| ddtree_tb") == 4 and "| dflash |" in md and "| baseline |" in md
    png = (tmp_path / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    js = json.loads((tmp_path / "sweep.json").read_text())
    assert all(row["lossless"] for row in js["rows"])


def test_core_loads_from_DDTREE_UTILS_PATH(du, tmp_path):
    """The GPU-machine route: only the core file is present, pointed at by DDTREE_UTILS_PATH."""
    src = Path(du.__file__)
    dst = tmp_path / "ddtree_utils.py"
    dst.write_text(src.read_text())
    code = ("import ddtree_offline.core as c, sys; m = c.ddtree_utils(); "
            "assert m.__file__ == sys.argv[1], m.__file__; print('ok')")
    env = _env(DDTREE_UTILS_PATH=str(dst))
    env["PYTHONPATH"] = str(ROOT / "tools")  # no ddtree_deploy on the path
    r = subprocess.run([sys.executable, "-c", code, str(dst)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_core_missing_path_is_a_clear_error(tmp_path):
    env = _env(DDTREE_UTILS_PATH=str(tmp_path / "nope.py"))
    code = "import ddtree_offline.core as c\ntry:\n    c.ddtree_utils()\nexcept c.CoreUnavailable as e:\n    print('unavailable', e)\n"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("unavailable") and "nope.py" in r.stdout, (r.stdout, r.stderr)


def test_cli_corebench(tmp_path, du):
    out = tmp_path / "core.md"
    r = _cli("corebench", "--vocab", "300", "--depth", "5", "--budgets", "4,32", "--reps", "2", "--threads", "1",
             "--temperature", "1.0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "| budget |" in text and text.count("\n| 4 |") + text.count("\n| 32 |") == 2
