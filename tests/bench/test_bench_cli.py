"""The bench's server handling and prompt rendering, against one stand-in server on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from bench_helpers import free_port, run_cli, standin

WORDS = ["[UNK]", "<user>", "<assistant>", "what", "is", "two", "plus", "and", "then", "times", "three", "?"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A tiny local tokenizer with a chat template (built here: nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = (
        "{% for m in messages %}<{{ m.role }}> {{ m.content }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}{% if enable_thinking is defined and enable_thinking %} THINK{% endif %}"
    )
    d = tmp_path_factory.mktemp("tok") / "tiny"
    fast.save_pretrained(str(d))
    return d


def test_chat_rendering_multi_turn_and_decoded_divergence(bench_env, tokenizer_dir, tmp_path):
    from ddtree_deploy.measure.datasets import ChatRenderer

    r = ChatRenderer(str(tokenizer_dir))
    ids = r.encode([{"role": "user", "content": "what is two plus two ?"}])
    # enable_thinking=False reaches the template; generation prompt appended
    assert ids == [1, 3, 4, 5, 6, 5, 11, 2]
    prompts = tmp_path / "chat.jsonl"
    prompts.write_text(json.dumps({"turns": ["what is two plus two ?", "and then times three ?"]}) + "\n"
                       + json.dumps({"prompt": "what is three ?"}) + "\n")
    out = tmp_path / "out"
    with standin(bench_env, "--method", "ddtree", "--budget", "8") as url:
        proc = run_cli(bench_env, "bench", url, "--budgets", "8", "--reference-runs", "", "--dataset", str(prompts),
                       "--tokenizer", str(tokenizer_dir), "--max-new-tokens", "6", "--out", str(out), "--no-progress")
        assert proc.returncode == 0, proc.stderr[-3000:]
        # A restart-style command (exits 0 at once) just waits for health of the running server.
        again = run_cli(bench_env, "bench", url, "--budgets", "8", "--reference-runs", "", "--dataset", str(prompts),
                        "--tokenizer", str(tokenizer_dir), "--max-new-tokens", "6", "--out", str(tmp_path / "again"),
                        "--server-command", "true", "--no-progress")
        assert again.returncode == 0, again.stderr[-3000:]
    recs = [json.loads(l) for l in (out / "runs.jsonl").read_text().splitlines()]
    assert [x["prompt_index"] for x in recs] == [0, 1, 2]  # every turn is a prompt, as in the reference
    assert recs[0]["meta_info"]["prompt_tokens"] == len(ids)
    # turn 2 carries turn 1 and its answer: a longer prompt
    assert recs[1]["meta_info"]["prompt_tokens"] > recs[0]["meta_info"]["prompt_tokens"] + 5
    # compare --tokenizer decodes the context around a divergence
    bad = [dict(x) for x in recs]
    first = 3 if recs[2]["output_ids"][3] != 3 else 4  # `what` (or `is`): surely not the engine's token
    bad[2]["output_ids"] = bad[2]["output_ids"][:3] + [first, 4, 5]
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(x) + "\n" for x in bad))
    cmp = run_cli(bench_env, "compare", str(out / "runs.jsonl"), str(tmp_path / "bad.jsonl"), "--tokenizer", str(tokenizer_dir), "--json")
    assert cmp.returncode == 11, cmp.stderr[-2000:]
    (g,) = json.loads(cmp.stdout)["report"]["groups"]
    (d,) = g["divergences"]
    assert (g["dataset"], g["method"], d["prompt_index"], d["position"]) == ("chat", "ddtree_tb8", 2, 3)
    assert d["decoded"]["run_next"] == ("what is two" if first == 3 else "is is two")


def test_server_that_never_becomes_healthy_is_stopped(bench_env, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1, 2]}) + "\n")
    marker = f"ddtree-bench-test-{os.getpid()}-{time.time_ns()}"
    t0 = time.monotonic()
    proc = run_cli(bench_env, "bench", f"http://127.0.0.1:{free_port()}", "--budgets", "8", "--reference-runs", "",
                   "--dataset", str(prompts), "--out", str(tmp_path / "out"), "--no-progress",
                   "--server-command", f"echo starting {marker}; exec sleep 120 # {marker}", "--health-timeout", "3")
    assert proc.returncode == 1, proc.stderr
    assert "did not answer 200 within 3s" in proc.stderr and marker in proc.stderr  # log tail shown
    assert time.monotonic() - t0 < 60
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout.strip() == "", "the server command's process group was not stopped"


def test_server_command_that_fails_reports_its_log(bench_env, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1, 2]}) + "\n")
    proc = run_cli(bench_env, "bench", f"http://127.0.0.1:{free_port()}", "--budgets", "8", "--reference-runs", "",
                   "--dataset", str(prompts), "--out", str(tmp_path / "out"), "--no-progress",
                   "--server-command", "echo no-gpu-here >&2; exit 3", "--health-timeout", "30")
    assert proc.returncode == 1
    assert "exited with 3" in proc.stderr and "no-gpu-here" in proc.stderr
