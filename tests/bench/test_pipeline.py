"""End to end on loopback: bench -> JSONL -> plot -> compare, against the stand-in server.

The stand-in serves the offline DDTree engine (tiny random target, synthetic drafter) behind
SGLang's native /health and /generate. Nothing here needs a GPU or the network beyond 127.0.0.1.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bench_helpers import ENGINE_ARGS, STANDIN, free_port, run_cli, standin

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14]]
BUDGETS = (4, 16)
MAX_NEW = 16


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "toy.jsonl"
    p.write_text("".join(json.dumps({"input_ids": ids}) + "\n" for ids in PROMPTS))
    return p


@pytest.fixture(scope="module")
def sweep(bench_env, prompts_file, tmp_path_factory):
    """One full sweep: baseline + dflash + two budgets, each server started by the command template."""
    out = tmp_path_factory.mktemp("sweep") / "out"
    port = free_port()
    template = f"{sys.executable} {STANDIN} --port {{port}} --method {{kind}} --budget={{budget}} --max-lifetime 300 " + " ".join(ENGINE_ARGS)
    proc = run_cli(
        bench_env, "bench", f"http://127.0.0.1:{port}", "--budgets", ",".join(map(str, BUDGETS)),
        "--dataset", str(prompts_file), "--max-new-tokens", str(MAX_NEW), "--out", str(out),
        "--server-command", template, "--health-timeout", "120", "--request-timeout", "120", "--json",
    )
    return proc, out


def test_bench_writes_contract_jsonl(sweep):
    proc, out = sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["ok"] is True
    lines = [json.loads(l) for l in (out / "runs.jsonl").read_text().splitlines()]
    methods = {l["method"] for l in lines}
    assert methods == {"baseline", "dflash", "ddtree_tb4", "ddtree_tb16"}
    assert len(lines) == 4 * len(PROMPTS)
    keys = {"dataset", "method", "budget", "prompt_index", "output_ids", "acceptance_lengths", "accept_length_mean",
            "verify_ct", "num_output_tokens", "time_per_output_token", "latency_s", "meta_info"}
    for l in lines:
        assert set(l) == keys
        assert l["dataset"] == "toy"
        assert len(l["output_ids"]) == MAX_NEW == l["num_output_tokens"]
        if l["method"].startswith("ddtree"):
            assert l["budget"] == int(l["method"][len("ddtree_tb"):])
            mi = l["meta_info"]
            assert mi["spec_verify_ct"] == l["verify_ct"] == len(l["acceptance_lengths"])
            assert mi["spec_accept_length"] == pytest.approx(MAX_NEW / mi["spec_verify_ct"])
            # 1 token from prefill, the rest from rounds (the last round may overshoot max_new_tokens)
            assert MAX_NEW - 1 <= sum(l["acceptance_lengths"]) < MAX_NEW - 1 + 8
            assert len(mi["ddtree_predicted_accept_length"]) == len(mi["ddtree_tree_size"]) == mi["spec_verify_ct"]
            assert max(mi["ddtree_tree_size"]) <= l["budget"] and max(mi["ddtree_tree_depth"]) <= 7
        elif l["method"] == "baseline":
            assert l["budget"] is None and l["verify_ct"] is None and l["accept_length_mean"] == 1.0
    # Lossless at T=0: every method emits exactly the baseline's tokens.
    by = {(l["method"], l["prompt_index"]): l["output_ids"] for l in lines}
    for m in methods:
        for i in range(len(PROMPTS)):
            assert by[(m, i)] == by[("baseline", i)], (m, i)
    rows = {r["method"]: r for r in summary["rows"]}
    assert rows["ddtree_tb16"]["exact_match_vs_baseline"] == 1.0
    assert rows["ddtree_tb16"]["tau"] > 1.0
    assert (out / "summary.json").exists()
    for m in methods:
        assert (out / f"server-{m}.log").exists()


def test_plot_is_a_png_of_the_expected_size(sweep):
    from ddtree_deploy.measure.plotting import PIXELS

    _, out = sweep
    data = (out / "sweep.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, ctype = struct.unpack(">I4s", data[8:16])
    assert ctype == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == PIXELS == (1200, 500)
    from PIL import Image

    with Image.open(out / "sweep.png") as im:
        im.verify()
    with Image.open(out / "sweep.png") as im:
        assert im.size == PIXELS
        lo, hi = im.convert("L").getextrema()
        assert hi - lo > 100  # something was drawn


def test_compare_passes_on_identical_runs(sweep, bench_env):
    _, out = sweep
    runs = out / "runs.jsonl"
    proc = run_cli(bench_env, "compare", str(runs), str(runs), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert set(doc) == {"ok", "exit_code", "error", "message", "hint", "report"} and doc["error"] is None  # one shape
    report = doc["report"]
    assert report["ok"] and len(report["groups"]) == 4
    assert all(g["exact_match_rate"] == 1.0 and g["tpot_ratio"] == pytest.approx(1.0) for g in report["groups"])
    # One sweep file against itself, every method vs its target-only run: the same-stack lossless check.
    proc = run_cli(bench_env, "compare", str(runs), str(runs), "--against", "baseline", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert set(doc) == {"ok", "exit_code", "error", "message", "hint", "report"} and doc["error"] is None  # one shape
    report = doc["report"]
    assert {g["ref_method"] for g in report["groups"]} == {"baseline"} and len(report["groups"]) == 4
    assert all(g["exact_match_rate"] == 1.0 for g in report["groups"])
    tb16 = next(g for g in report["groups"] if g["method"] == "ddtree_tb16")
    assert tb16["tau_run"] > 1.0 == tb16["tau_ref"] and tb16["tpot_ratio"] is not None


def test_compare_against_offline_reference_pt(sweep, bench_env, tmp_path):
    """The offline engine's records in the reference benchmark.py .pt layout (SimpleNamespace
    records, output_ids = prompt + output) are the baseline; the stand-in's run must match."""
    _, out = sweep
    pt = tmp_path / "toy.pt"
    script = f"""
import types, torch
from ddtree_offline.models import tiny_target, SyntheticDrafter
from ddtree_offline.engine import OfflineEngine
t = tiny_target(seed=0, vocab=512); d = SyntheticDrafter(t, quality=0.8, seed=0)
e = OfflineEngine(t, d, block_size=8)
responses = []
for ids in {PROMPTS!r}:
    r = {{}}
    r["baseline"] = types.SimpleNamespace(**e.generate(ids, method="target", max_new_tokens={MAX_NEW}))
    r["dflash"] = types.SimpleNamespace(**e.generate(ids, method="dflash", max_new_tokens={MAX_NEW}))
    for b in {BUDGETS!r}:
        r[f"ddtree_tb{{b}}"] = types.SimpleNamespace(**e.generate(ids, method="ddtree", budget=b, max_new_tokens={MAX_NEW}))
    responses.append(r)
torch.save({{"responses": responses, "block_size": 8, "draft_attn_implementation": "sdpa",
            "target_attn_implementation": "sdpa", "args": {{"dataset": "toy", "max_new_tokens": {MAX_NEW}}}}}, {str(pt)!r})
"""
    gen = subprocess.run([sys.executable, "-c", script], env=bench_env, capture_output=True, text=True, timeout=180)
    assert gen.returncode == 0, gen.stderr[-3000:]
    proc = run_cli(bench_env, "compare", str(pt), str(out / "runs.jsonl"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert set(doc) == {"ok", "exit_code", "error", "message", "hint", "report"} and doc["error"] is None  # one shape
    report = doc["report"]
    groups = {g["method"]: g for g in report["groups"]}
    assert set(groups) == {"baseline", "dflash", "ddtree_tb4", "ddtree_tb16"}
    for m, g in groups.items():
        assert g["ref_method"] == m and g["n_common"] == len(PROMPTS) and g["exact_match_rate"] == 1.0
    # Same engine, same prompts: the acceptance lengths are identical too.
    for m in ("ddtree_tb4", "ddtree_tb16"):
        assert groups[m]["tau_ratio"] == pytest.approx(1.0)
        assert groups[m]["tau_hist_tv"] == pytest.approx(0.0)


def test_compare_catches_planted_divergence(sweep, bench_env, prompts_file, tmp_path):
    _, out = sweep
    planted = tmp_path / "planted"
    with standin(bench_env, "--method", "ddtree", "--budget", "16", "--plant-divergence",
                 "--plant-first-token", "7", "--plant-position", "5") as url:
        # A server answering for another budget than the run claims is refused.
        wrong = run_cli(bench_env, "bench", url, "--budgets", "8", "--reference-runs", "", "--dataset", str(prompts_file),
                        "--max-new-tokens", "4", "--out", str(tmp_path / "wrong"), "--no-progress", "--use-running-server")
        assert wrong.returncode != 0 and "--speculative-ddtree-budget 16" in wrong.stderr, wrong.stderr[-2000:]
        # Default reference runs: this one DDTREE server cannot serve them; they are skipped, not mislabelled.
        proc = run_cli(bench_env, "bench", url, "--budgets", "16", "--dataset", str(prompts_file), "--concurrency", "3",
                       "--max-new-tokens", str(MAX_NEW), "--out", str(planted), "--no-progress", "--use-running-server")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "skipping the baseline reference run" in proc.stderr and "skipping the dflash reference run" in proc.stderr
    runs = planted / "runs.jsonl"
    human = run_cli(bench_env, "compare", str(out / "runs.jsonl"), str(runs))
    assert human.returncode == 11, human.stderr[-3000:]
    assert "toy/ddtree_tb16" in human.stderr
    assert "prompt 1 at token 5" in human.stderr
    js = run_cli(bench_env, "compare", str(out / "runs.jsonl"), str(runs), "--json")
    assert js.returncode == 11
    doc = json.loads(js.stdout)
    assert set(doc) == {"ok", "exit_code", "error", "message", "hint", "report"}  # the success's shape
    assert doc["ok"] is False and doc["exit_code"] == 11 and doc["error"] == "CompareFailedError"
    (g,) = doc["report"]["groups"]
    assert (g["dataset"], g["method"], g["exact_match"], g["diverged"]) == ("toy", "ddtree_tb16", 2, 1)
    (d,) = g["divergences"]
    assert (d["prompt_index"], d["position"], d["status"]) == (1, 5, "diverged")
    assert d["run"]["at"] != d["ref"]["at"] and d["run"]["before"] == d["ref"]["before"]
    # Against the target-only run of the clean sweep, too.
    vs_ar = run_cli(bench_env, "compare", str(out / "runs.jsonl"), str(runs), "--against", "baseline")
    assert vs_ar.returncode == 11 and "toy/ddtree_tb16 (vs baseline)" in vs_ar.stderr, vs_ar.stderr[-2000:]
    # A relaxed threshold lets the same run pass.
    ok = run_cli(bench_env, "compare", str(out / "runs.jsonl"), str(runs), "--min-exact-match", "0.5")
    assert ok.returncode == 0, ok.stderr[-2000:]
