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
                       "--tokenizer", str(tokenizer_dir), "--max-new-tokens", "6", "--out", str(out), "--no-progress",
                       "--use-running-server")
        assert proc.returncode == 0, proc.stderr[-3000:]
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


def test_bench_never_starts_or_measures_a_server_on_a_port_that_already_answers(bench_env, tmp_path):
    """Issue 23: a server already answering on the run's port (production, say) is neither restarted
    by a server command nor measured, and without a server command bench measures nothing unless told to."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1, 2]}) + "\n")
    marker = tmp_path / "ran"
    common = ["--budgets", "8", "--reference-runs", "", "--dataset", str(prompts), "--max-new-tokens", "4", "--no-progress"]
    with standin(bench_env, "--method", "ddtree", "--budget", "8") as url:
        # a command that would (re)start the service on that port: refused before it runs
        again = run_cli(bench_env, "bench", url, *common, "--out", str(tmp_path / "a"), "--server-command", f"touch {marker}")
        assert again.returncode == 6, again.stderr[-2000:]
        assert "already answers" in again.stderr and "fix:" in again.stderr
        assert not marker.exists() and not (tmp_path / "a").exists()
        # no server command: nothing is measured unless --use-running-server
        bare = run_cli(bench_env, "bench", url, *common, "--out", str(tmp_path / "b"))
        assert bare.returncode == 2 and "--use-running-server" in bare.stderr and not (tmp_path / "b").exists()
        # a URL without a port has no default (30000 is usually production's)
        noport = run_cli(bench_env, "bench", "http://127.0.0.1", *common, "--out", str(tmp_path / "c"),
                         "--server-command", "serve --port {port}")
        assert noport.returncode == 2 and "names no port" in noport.stderr
        # --dry-run shows the plan and flags the busy port, starting and writing nothing
        dry = run_cli(bench_env, "bench", url, *common, "--out", str(tmp_path / "d"), "--server-command",
                      f"touch {marker} --port {{port}}", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr[-2000:]
        assert json.loads(dry.stdout)["runs"][0]["port_in_use"] is True and "PORT IN USE" in dry.stderr
        assert not marker.exists() and not (tmp_path / "d").exists()


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
