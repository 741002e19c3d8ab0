"""Unit tests of the comparison metrics, the run-record format and the bench's plumbing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_deploy.measure import bench, compare
from ddtree_deploy.measure.datasets import REFERENCE_DATASETS, load_jsonl_prompts, load_prompts
from ddtree_deploy.errors import CompareFailedError, UsageError
from ddtree_deploy.measure.records import RunRecord, method_budget, read_jsonl, record_from_json, write_jsonl

ids = st.lists(st.integers(0, 50), max_size=40)


@given(ids, ids)
def test_first_divergence_is_the_first_differing_index(a, b):
    pos = compare.first_divergence(a, b)
    if a == b:
        assert pos is None
    else:
        assert pos is not None and a[:pos] == b[:pos]
        assert pos == min(len(a), len(b)) or a[pos] != b[pos]
    assert compare.first_divergence(b, a) == pos


@given(ids, st.integers(0, 39), st.integers(1, 5))
def test_a_single_corrupted_token_is_found_exactly(a, k, delta):
    if not a:
        return
    k %= len(a)
    b = list(a)
    b[k] = a[k] + delta
    assert compare.match_status(b, a) == ("diverged", k)


@given(ids, st.integers(0, 40))
def test_truncation_is_a_prefix_not_a_divergence(a, n):
    if n >= len(a):
        return
    assert compare.match_status(a[:n], a) == ("prefix", n)


hists = st.dictionaries(st.integers(1, 16), st.integers(0, 50), min_size=1, max_size=8)


@given(hists, hists)
def test_histogram_tv_is_a_distance(a, b):
    tv = compare.histogram_tv(a, b)
    if sum(a.values()) == 0 or sum(b.values()) == 0:
        assert tv is None
        return
    assert 0.0 <= tv <= 1.0 + 1e-12
    assert tv == pytest.approx(compare.histogram_tv(b, a))
    assert compare.histogram_tv(a, a) == pytest.approx(0.0)
    scaled = {k: 3 * v for k, v in a.items()}
    assert compare.histogram_tv(a, scaled) == pytest.approx(0.0)


def _rec(method="ddtree_tb8", pi=0, out=(1, 2, 3), al=None, tpot=0.01, ds="toy", mi=None):
    return RunRecord(dataset=ds, method=method, budget=method_budget(method), prompt_index=pi, output_ids=list(out),
                     acceptance_lengths=al, accept_length_mean=None, verify_ct=None if al is None else len(al),
                     num_output_tokens=len(out), time_per_output_token=tpot, latency_s=None, meta_info=mi or {})


@given(st.lists(st.lists(st.integers(1, 8), min_size=1, max_size=10), min_size=1, max_size=6))
def test_tau_is_the_mean_of_per_request_means_and_the_histogram_pools_rounds(als):
    recs = [_rec(pi=i, al=a) for i, a in enumerate(als)]
    assert compare.group_tau(recs) == pytest.approx(sum(sum(a) / len(a) for a in als) / len(als))
    h = compare.tau_histogram(recs)
    assert sum(h.values()) == sum(len(a) for a in als)
    for v, c in h.items():
        assert c == sum(a.count(v) for a in als)


def test_histogram_falls_back_to_sglang_correct_drafts_histogram():
    r = _rec(al=None, mi={"spec_correct_drafts_histogram": [2, 0, 5]})  # index = accepted drafts
    assert compare.tau_histogram([r]) == {1: 2, 3: 5}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=20), min_size=1, max_size=6), st.data())
def test_compare_records_counts_exact_matches(outputs, data):
    base = [_rec("baseline", i, o) for i, o in enumerate(outputs)]
    flips = data.draw(st.sets(st.integers(0, len(outputs) - 1)))
    run = []
    for i, o in enumerate(outputs):
        o2 = list(o)
        if i in flips:
            o2[-1] += 1
        run.append(_rec("ddtree_tb8", i, o2))
    rep = compare.compare_records(base, run)
    (g,) = rep["groups"]
    assert g["ref_method"] == "baseline"  # no ddtree_tb8 in the baseline: compare to target-only
    assert g["exact_match"] == len(outputs) - len(flips) and g["diverged"] == len(flips)
    assert g["exact_match_rate"] == pytest.approx((len(outputs) - len(flips)) / len(outputs))
    assert rep["ok"] == (not flips)
    assert {d["prompt_index"] for d in g["divergences"]} == flips
    for d in g["divergences"]:
        assert d["position"] == len(outputs[d["prompt_index"]]) - 1
    if flips:
        with pytest.raises(CompareFailedError) as ei:
            compare.check(rep)
        assert ei.value.exit_code == 11
        assert "toy/ddtree_tb8" in ei.value.message
    else:
        compare.check(rep)


def test_thresholds_tpot_tau_prefix_and_decoding():
    base = [_rec("ddtree_tb8", 0, [1, 2, 3, 4], al=[4], tpot=0.010)]
    run = [_rec("ddtree_tb8", 0, [1, 2, 3], al=[2, 1], tpot=0.015)]
    rep = compare.compare_records(base, run, thresholds=compare.Thresholds(min_exact_match=1.0, max_tpot_ratio=1.2, min_tau_ratio=0.9))
    (g,) = rep["groups"]
    assert g["ref_method"] == "ddtree_tb8" and g["prefix_match"] == 1
    assert g["tpot_ratio"] == pytest.approx(1.5) and g["tau_ratio"] == pytest.approx(1.5 / 4)
    assert len(g["failures"]) == 3 and not rep["ok"]
    rep2 = compare.compare_records(base, run, thresholds=compare.Thresholds(min_exact_match=1.0, prefix_ok=True),
                                   decode=lambda xs: "".join(chr(96 + x) for x in xs))
    assert rep2["ok"]
    d = rep2["groups"][0]["divergences"][0]
    assert d["decoded"]["common_prefix"] == "abc" and d["decoded"]["ref_next"] == "d" and d["decoded"]["run_next"] == ""


def test_no_overlap_fails_and_dataset_names_are_normalised():
    base = [_rec("baseline", 0, [1], ds="MT-Bench")]
    assert compare.compare_records(base, [_rec("baseline", 0, [1], ds="mt_bench")])["ok"]
    rep = compare.compare_records(base, [_rec("baseline", 0, [1], ds="gsm8k")])
    assert not rep["ok"] and rep["unmatched"] == ["gsm8k/baseline"]


def test_jsonl_roundtrip_and_validation(tmp_path):
    recs = [_rec("ddtree_tb64", i, [i, i + 1], al=[2], mi={"spec_verify_ct": 1}) for i in range(3)]
    p = tmp_path / "r.jsonl"
    write_jsonl(p, recs)
    back = read_jsonl(p)
    assert [r.to_json() for r in back] == [r.to_json() for r in recs]
    assert back[0].budget == 64
    with pytest.raises(UsageError, match="lacks"):
        record_from_json({"dataset": "x", "method": "baseline"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(UsageError, match="bad.jsonl:1"):
        read_jsonl(bad)


# --- bench plumbing -----------------------------------------------------------------------------


def test_templates_fill_placeholders_and_refuse_unknown_ones():
    t = bench.BenchTarget(name="h", base_url="http://127.0.0.1:30000",
                          commands={"": "serve --speculative-algorithm {algorithm} --speculative-ddtree-budget {budget} --port {port}"})
    spec = bench.RunSpec.for_budget(128)
    url = bench.run_url(t, spec)
    assert bench.run_command(t, spec, url) == "serve --speculative-algorithm DDTREE --speculative-ddtree-budget 128 --port 30000"
    # the generic template has {algorithm}, so it can serve the baseline run too
    assert "--speculative-algorithm  " in bench.run_command(t, bench.RunSpec.reference("baseline"), url)
    t.commands[""] = "serve --speculative-ddtree-budget {budget}"
    with pytest.raises(UsageError, match="cannot start a baseline server"):
        bench.run_command(t, bench.RunSpec.reference("baseline"), url)
    t.commands["baseline"] = "serve-plain --port {port}"
    assert bench.run_command(t, bench.RunSpec.reference("baseline"), url) == "serve-plain --port 30000"
    t.commands[""] = "serve {bogus}"
    with pytest.raises(UsageError, match="bogus"):
        bench.run_command(t, spec, url)


def test_per_run_urls():
    t = bench.BenchTarget(name="h", base_url="http://127.0.0.1:300{budget}", urls={"baseline": "http://127.0.0.1:29999/", "16": "http://127.0.0.1:31016"})
    assert bench.run_url(t, bench.RunSpec.reference("baseline")) == "http://127.0.0.1:29999"
    assert bench.run_url(t, bench.RunSpec.for_budget(16)) == "http://127.0.0.1:31016"
    assert bench.run_url(t, bench.RunSpec.for_budget(64)) == "http://127.0.0.1:30064"


def test_inventory_bench_table(tmp_path):
    inv = tmp_path / "hosts.toml"
    inv.write_text(
        '[hosts.ct129]\ntarget = "ct129"\npython = "/opt/sglang/.venv/bin/python"\n'
        '[hosts.ct129.bench]\nbase_url = "http://127.0.0.1:30000"\n'
        'server_command = "python -m sglang.launch_server --speculative-ddtree-budget {budget} --port {port}"\n'
        'server_command_baseline = "python -m sglang.launch_server --port {port}"\n'
    )
    t = bench.resolve_target("ct129", str(inv))
    assert t.base_url == "http://127.0.0.1:30000"
    assert "{budget}" in t.commands[""] and "baseline" in t.commands
    with pytest.raises(UsageError, match="unknown host"):
        bench.resolve_target("nope", str(inv))
    assert bench.resolve_target("http://127.0.0.1:1234/", None).base_url == "http://127.0.0.1:1234"


@pytest.mark.parametrize("debug", [
    {"ddtree_accept_length": [2, 1], "ddtree_predicted_accept_length": [2.5, 1.5], "ddtree_tree_size": [32, 32]},  # the patch
    {"ddtree": {"acceptance_lengths": [2, 1], "predicted_acceptance": [2.5, 1.5]}},  # nested form
])
def test_record_from_sglang_response(debug):
    resp = {"text": "x", "output_ids": [5, 6, 7, 8],
            "meta_info": {"completion_tokens": 4, "spec_verify_ct": 2, "spec_accept_length": 2.0, **debug}}
    r = bench.record_from_response(resp, dataset="d", spec=bench.RunSpec.for_budget(32), prompt_index=3, latency_s=0.4)
    assert (r.method, r.budget, r.prompt_index, r.verify_ct, r.accept_length_mean) == ("ddtree_tb32", 32, 3, 2, 2.0)
    assert r.acceptance_lengths == [2, 1] and r.tau == 1.5 and r.time_per_output_token == pytest.approx(0.1)
    assert bench._predicted_tau(r) == pytest.approx(2.0)
    with pytest.raises(bench.BenchServerError, match="output_ids"):
        bench.record_from_response({"text": "x"}, dataset="d", spec=bench.RunSpec.for_budget(1), prompt_index=0, latency_s=1)


def test_summary_speedup_and_losslessness():
    recs = [_rec("baseline", 0, [1, 2], tpot=0.02), _rec("ddtree_tb8", 0, [1, 2], al=[2], tpot=0.01),
            _rec("dflash", 0, [1, 3], al=[1, 1], tpot=0.04)]
    rows = {r["method"]: r for r in bench.summarize(recs, {("toy", "baseline"): 1.0, ("toy", "ddtree_tb8"): 0.5})}
    assert [r for r in rows] == ["baseline", "dflash", "ddtree_tb8"]
    assert rows["ddtree_tb8"]["speedup_vs_baseline"] == pytest.approx(2.0)
    assert rows["ddtree_tb8"]["exact_match_vs_baseline"] == 1.0 and rows["dflash"]["exact_match_vs_baseline"] == 0.0
    assert rows["ddtree_tb8"]["tokens_per_s"] == pytest.approx(4.0) and rows["dflash"]["tokens_per_s"] is None


def test_jsonl_prompts(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_text(json.dumps({"turns": ["a", "b"]}) + "\n\n" + json.dumps({"prompt": "c"}) + "\n" + json.dumps({"input_ids": [1, 2]}) + "\n")
    insts = load_jsonl_prompts(p, None)
    assert [i.first_prompt_index for i in insts] == [0, 2, 3]  # each turn is a prompt, as in the reference
    assert insts[0].dataset == "mine" and insts[2].input_ids == [1, 2]
    assert len(load_prompts(f"other={p}", 1)) == 1 and load_prompts(f"other={p}", 1)[0].dataset == "other"
    (tmp_path / "bad.jsonl").write_text(json.dumps({"nothing": 1}) + "\n")
    with pytest.raises(UsageError, match="needs one of"):
        load_prompts(str(tmp_path / "bad.jsonl"), None)


def test_reference_prompt_formats():
    fmt = REFERENCE_DATASETS["gsm8k"][3]
    assert fmt({"question": "Q?"}) == ["Q?\nPlease reason step by step, and put your final answer within \\boxed{}."]
    assert REFERENCE_DATASETS["alpaca"][3]({"instruction": "I", "input": ""}) == ["I"]
    assert REFERENCE_DATASETS["alpaca"][3]({"instruction": "I", "input": "x"}) == ["I\n\nInput:\nx"]
    assert REFERENCE_DATASETS["mt-bench"][3]({"prompt": ["t1", "t2"]}) == ["t1", "t2"]
    assert REFERENCE_DATASETS["humaneval"][3]({"prompt": "def f():"})[0].endswith("```python\ndef f():\n```")


def test_reference_dataset_names_never_download(monkeypatch, tmp_path):
    """A reference dataset that is not in the local HF cache (or no `datasets` package) is a usage
    error with a hint, never a download."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-hf-home" / "datasets"))
    with pytest.raises(UsageError) as ei:
        load_prompts("gsm8k", 4)
    assert "local" in ei.value.message and ei.value.hint and ".jsonl" in ei.value.hint
    with pytest.raises(UsageError, match="unknown dataset"):
        load_prompts("no-such-set", 4)


def test_generate_payloads(monkeypatch, tmp_path):
    from ddtree_deploy.measure.datasets import Instance

    sent = []

    def fake_post(url, payload, timeout):
        sent.append((url, payload))
        return {"text": "ok", "output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 3}}

    monkeypatch.setattr(bench, "http_post_json", fake_post)
    spec = bench.RunSpec.for_budget(16)
    cfg = bench.BenchConfig(budgets=[16], datasets=[], out_dir=tmp_path, max_new_tokens=7, temperature=0.0)
    recs = bench.run_instance("http://127.0.0.1:1", Instance("d", 4, [], [9, 9]), spec, cfg, None)
    assert sent[-1] == ("http://127.0.0.1:1/generate", {"input_ids": [9, 9], "sampling_params": {"max_new_tokens": 7, "temperature": 0.0}})
    assert recs[0].prompt_index == 4 and recs[0].output_ids == [1, 2, 3]
    # text without a tokenizer: raw text, first turn only
    cfg.temperature = 1.0
    recs = bench.run_instance("http://127.0.0.1:1", Instance("d", 0, ["t1", "t2"], None), spec, cfg, None)
    assert len(recs) == 1 and sent[-1][1]["text"] == "t1" and "sampling_seed" not in sent[-1][1]["sampling_params"]
    cfg.seed = 100
    bench.run_instance("http://127.0.0.1:1", Instance("d", 6, ["t1"], None), spec, cfg, None)
    assert sent[-1][1]["sampling_params"] == {"max_new_tokens": 7, "temperature": 1.0, "sampling_seed": 106}


@pytest.mark.parametrize("answer", [b'"busy"', b"[]", b"[1, 2]", b"null"])
def test_a_generate_answer_that_is_not_one_json_object_is_a_server_error(answer):
    """A real HTTP server on loopback answers /generate with JSON that is not an object: the
    bench says so where the answer enters (BenchServerError), not later as an AttributeError."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/generate"
        with pytest.raises(bench.BenchServerError, match="not a JSON object"):
            bench.http_post_json(url, {"text": "hi"}, timeout=10)
    finally:
        server.shutdown()
        server.server_close()


def test_allow_target_divergence_excuses_only_what_both_targets_explain():
    """A CPU reference and a GPU engine whose targets part at a near-tie (prompt 0, token 2): each
    side's DDTREE equals its own target-only, so with --allow-target-divergence the divergence is the
    targets' ('target'), not the tree's. Prompt 1's run DDTREE leaves its own target-only: still a failure."""
    ref = [_rec("baseline", 0, [5, 6, 7, 8]), _rec("ddtree_tb8", 0, [5, 6, 7, 8]),
           _rec("baseline", 1, [1, 2, 3]), _rec("ddtree_tb8", 1, [1, 2, 3])]
    run = [_rec("baseline", 0, [5, 6, 9, 9]), _rec("ddtree_tb8", 0, [5, 6, 9, 9]),
           _rec("baseline", 1, [1, 2, 3]), _rec("ddtree_tb8", 1, [1, 2, 3])]
    strict = compare.compare_records(ref, run)
    assert not strict["ok"] and all(g["diverged"] == 1 for g in strict["groups"])
    allowed = compare.compare_records(ref, run, thresholds=compare.Thresholds(allow_target_divergence=True))
    assert allowed["ok"], allowed["failures"]
    assert [(g["method"], g["target_divergence"], g["diverged"]) for g in allowed["groups"]] == [
        ("baseline", 1, 0), ("ddtree_tb8", 1, 0)]
    run[3] = _rec("ddtree_tb8", 1, [1, 4, 3])  # the tree leaves its own target's path
    bad = compare.compare_records(ref, run, thresholds=compare.Thresholds(allow_target_divergence=True))
    (g,) = [g for g in bad["groups"] if g["method"] == "ddtree_tb8"]
    assert not bad["ok"] and g["diverged"] == 1 and g["target_divergence"] == 1
    run[1] = _rec("ddtree_tb8", 0, [5, 6, 7, 8])  # equals the reference, not its own target-only: a match
    assert compare.compare_records(ref, run[:2], thresholds=compare.Thresholds(allow_target_divergence=True))["groups"][1][
        "exact_match"] == 1


def test_allow_target_divergence_needs_the_reference_tree_on_its_own_target_too():
    """The reference's DDTREE left its own target-only path (a broken reference): not excused."""
    ref = [_rec("baseline", 0, [5, 6, 7, 8]), _rec("ddtree_tb8", 0, [5, 6, 7, 1])]
    run = [_rec("baseline", 0, [5, 6, 9, 9]), _rec("ddtree_tb8", 0, [5, 6, 9, 9])]
    rep = compare.compare_records(ref, run, thresholds=compare.Thresholds(allow_target_divergence=True))
    (g,) = [g for g in rep["groups"] if g["method"] == "ddtree_tb8"]
    assert not rep["ok"] and g["diverged"] == 1 and g["target_divergence"] == 0


def test_compare_cli_on_the_committed_reference_and_engine_runs():
    """The real check of issue 21, end to end through the CLI on committed data: the DDTree reference's
    decode loop (CPU) against the GPU engine's records. Strict: exit 11 (prompt 7 parts at a target
    near-tie, target-only included); --allow-target-divergence: exit 0, 1 target divergence per method."""
    import json as _json

    from testkit import REPO, run_cli

    pt = REPO / "bench/real-pair/reference-cpu/heldout__model_target__model_draft__temp0.0__sdpa.pt"
    runs = REPO / "bench/real-pair/engine-records/engine-b32-temp0.jsonl"
    strict = run_cli("compare", str(pt), str(runs), "--json")
    assert strict.returncode == 11, strict.stderr[-2000:]
    ok = run_cli("compare", str(pt), str(runs), "--allow-target-divergence", "--min-tau-ratio", "0.95", "--json")
    assert ok.returncode == 0, ok.stderr[-2000:]
    groups = _json.loads(ok.stdout)["report"]["groups"]
    assert {g["method"]: (g["exact_match"], g["target_divergence"], g["diverged"]) for g in groups} == {
        m: (31, 1, 0) for m in ("baseline", "dflash", "ddtree_tb16", "ddtree_tb64")}
