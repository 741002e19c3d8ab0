"""The soak's request stream and verdict (tools/soak), without an engine: each check must
reject the failure it names, so a soak that passes means what its summary says."""

from __future__ import annotations

import soak_checks as checks
import soak_workload as wl

CTX, NEW, VOCAB = 96, 24, 12


def _work(n=300, seed=0):
    return wl.make_workload(n, vocab=VOCAB, special_ids=(0, 1), context_length=CTX, max_new_tokens=NEW,
                            seed=seed)


def test_workload_is_deterministic_and_mixed():
    a, b = _work(), _work()
    assert [r.to_json() for r in a] == [r.to_json() for r in b]
    assert [r.to_json() for r in a] != [r.to_json() for r in _work(seed=1)]
    kinds = {r.kind for r in a}
    assert kinds == {"normal", "at_limit", "over_limit"}
    for r in a:
        assert not {0, 1} & set(r.input_ids)
        n = r.sampling_params["max_new_tokens"]
        assert 1 <= n <= NEW
        if r.kind == "at_limit":
            assert len(r.input_ids) + n == CTX - 2 or len(r.input_ids) == CTX - 7
        if r.kind == "over_limit":
            assert len(r.input_ids) > CTX and "abort" not in r.tags
        if r.abort_after_tokens is not None:
            assert r.stream and 1 <= r.abort_after_tokens <= n
        if r.abort_after_s is not None:
            assert not r.stream
    assert any(r.greedy for r in a) and any(not r.greedy for r in a)
    assert any("abort" in r.tags for r in a) and any(r.stream for r in a)
    sampled = [r.sampling_params for r in a if not r.greedy]
    for key in ("top_k", "top_p", "min_p"):
        assert any(key in sp for sp in sampled), key


def test_a_short_workload_still_has_every_kind():
    """Below 100 requests the draw may leave a kind out (seed 0 at 20: no prompt past the context);
    the workload gives each missing kind to a plain request, so a CI-sized soak covers them all."""
    for n, seed in ((8, 0), (20, 0), (50, 0), (30, 3)):
        w = _work(n, seed)
        assert {r.kind for r in w} >= {"at_limit", "over_limit"}, (n, seed)
        assert any(r.abort_after_tokens is not None and r.stream for r in w), (n, seed)
        assert any(r.abort_after_s is not None and not r.stream for r in w), (n, seed)
        for r in w:
            if r.kind == "over_limit":
                assert len(r.input_ids) > CTX and "abort" not in r.tags
            if r.kind == "at_limit":
                assert len(r.input_ids) + r.sampling_params["max_new_tokens"] == CTX - 2 or len(r.input_ids) == CTX - 7
    assert not any("covered" in r.tags for r in _work(300)), "a workload with every kind is left as drawn"
    assert [r.to_json() for r in _work(20)] == [r.to_json() for r in _work(20)]


def _req(**sp):
    params = dict(max_new_tokens=4, temperature=0.0, ignore_eos=True, **sp)
    return {"index": 0, "input_ids": [2, 3], "sampling_params": params, "stream": True, "kind": "normal"}


def _rec(ids, ftype="length", abort_sent=False, n=None, **kw):
    return {"final": {"output_ids": ids, "finish_reason": {"type": ftype},
                      "meta": {"completion_tokens": len(ids) if n is None else n}},
            "abort_sent": abort_sent, "error": None, "stream_prefix_ok": True, **kw}


def test_a_good_greedy_request_passes():
    assert checks.check_request(_req(), _rec([5, 6, 7, 8]), [5, 6, 7, 8], VOCAB) == []


def test_each_request_failure_is_named():
    ref = [5, 6, 7, 8]
    cases = [
        (_req(), _rec([5, 6, 9, 8]), "differs from target-only at token 2"),
        (_req(), _rec([5, 6, 7]), "finish 'length' after 3 of 4"),
        (_req(), _rec([5, 6, 7, 8], n=3), "completion_tokens 3 for 4"),
        (_req(), _rec([5, 6, 7, 12]), "outside the vocabulary"),
        (_req(), _rec([5, 6, 7, 8], stream_prefix_ok=False), "did not extend"),
        (_req(), _rec([5, 6], ftype="abort"), "no abort was sent"),
        (_req(), _rec([5, 9], ftype="abort", abort_sent=True), "not a prefix"),
        (_req(), _rec([5, 6, 7], ftype="stop"), "under ignore_eos"),
        (_req(), _rec([5, 6, 7, 8], ftype=None), "finish reason"),
        (_req(), {"error": "RuntimeError: boom", "final": None}, "raised RuntimeError"),
        (_req(), None, "not run"),
        (_req(), _rec([5, 6, 7, 8]), None),  # (no reference given below)
    ]
    for req, rec, want in cases[:-1]:
        got = checks.check_request(req, rec, ref, VOCAB)
        assert any(want in g for g in got), (want, got)
    assert any("no target-only reference" in g for g in checks.check_request(_req(), _rec(ref), None, VOCAB))
    # an aborted greedy request that is a prefix of the reference is fine
    assert checks.check_request(_req(), _rec([5, 6], ftype="abort", abort_sent=True), ref, VOCAB) == []


def test_past_the_context_must_be_refused():
    req = dict(_req(), kind="over_limit", input_ids=[2] * (CTX + 1))
    assert checks.check_request(req, {"error": "ValueError: longer than the context", "final": None}, None, VOCAB) == []
    served = checks.check_request(req, _rec([5, 6, 7, 8]), None, VOCAB)
    assert any("was served" in s for s in served), served


def _soak(used_after_flush=0, rss=None):
    return {"ok": True, "flush_ok": True, "results": [dict(_rec([5, 6, 7, 8]), index=0)],
            "loads": {"idle": {"running": 0, "waiting": 0, "used_tokens": 7},
                      "after_flush": {"running": 0, "waiting": 0, "used_tokens": used_after_flush}},
            "rss_mib": rss or [(i, 1000.0) for i in range(50)]}


def _verdict(soak, log="KV cache pool is full. Retract requests. #retracted_reqs: 2, ..."):
    return checks.verdict([_req()], soak, {0: [5, 6, 7, 8]}, log, vocab=VOCAB, expect_retraction=True,
                          max_rss_growth_mib=100)


def test_the_run_level_checks():
    ok = _verdict(_soak())
    assert ok["ok"] and ok["retracted_reqs"] == 2 and ok["greedy_equal"] == 1, ok
    assert "leaked rows" in " ".join(_verdict(_soak(used_after_flush=5))["run_failures"])
    assert "memory leak detected" in " ".join(_verdict(_soak(), log="x\ntoken_to_kv_pool memory leak detected! y")
                                              ["run_failures"])
    assert "never filled" in " ".join(_verdict(_soak(), log="")["run_failures"])
    growing = [(i, 1000.0 + 10 * i) for i in range(50)]
    assert "resident memory grew" in " ".join(_verdict(_soak(rss=growing))["run_failures"])
    crashed = dict(_soak(), ok=False, error="EOFError")
    assert not _verdict(crashed)["ok"]


def test_bad_arguments_are_refused_where_they_enter(tmp_path, capsys):
    """soak.py's arguments: an --out that is a file, or a count below 1, is a usage error (exit 2)
    naming the flag, not a traceback after the engine started."""
    import pytest
    import soak

    a_file = tmp_path / "f"
    a_file.write_text("keep")
    for argv, flag in ((["--cpu", "--out", str(a_file)], "--out"), (["--cpu", "--out", str(tmp_path / "o"), "--reference-batch", "0"], "--reference-batch")):
        with pytest.raises(SystemExit) as e:
            soak.parse_args(argv)
        assert e.value.code == 2 and flag in capsys.readouterr().err
    assert a_file.read_text() == "keep" and not (tmp_path / "o").exists()
