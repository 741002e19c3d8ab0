"""The soak's verdict: pure functions of the workload, the soak and reference runs and the log.

A request fails the soak when:
- it raised, unless it was past the context limit (then an error is the right answer);
- a past-the-limit request was served as if it fitted;
- its final message is malformed: no finish reason of type length / stop / abort, a
  ``completion_tokens`` other than the number of output ids, an id outside the vocabulary, a
  streamed chunk that does not extend the previous one, more tokens than ``max_new_tokens``, a
  ``length`` finish short of ``max_new_tokens``, a ``stop`` finish under ``ignore_eos``, or an
  ``abort`` finish without an abort sent;
- it is greedy (T = 0) and its output differs from target-only's on the same prompt and
  parameters (an aborted one must be a prefix of it).

The run fails when requests were left unrun (time limit), when the engine did not come back
to idle with no KV tokens in use after ``flush_cache``, when SGLang's log reports a leak, a
double free or a traceback, when no request was ever retracted though the run expected it,
or when the engine's resident memory grew by more than the allowed amount over the run.
"""

from __future__ import annotations

import re
import statistics

LEAK_PATTERNS = ("memory leak detected", "KV double free", "use-after-free", "Traceback (most recent call last)")
RETRACT_RE = re.compile(r"(?:Retract requests|Testing retraction)\. #retracted_reqs: (\d+)")


def retractions(log_text: str) -> int:
    return sum(int(m) for m in RETRACT_RE.findall(log_text))


def first_divergence(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_request(req: dict, rec: dict | None, ref_ids: list[int] | None, vocab: int) -> list[str]:
    """Failures of one request (``req``: a workload request dict; ``rec``: its soak record)."""
    if rec is None:
        return ["not run (the soak's time limit)"]
    sp = req["sampling_params"]
    if req["kind"] == "over_limit":
        fin = rec.get("final") or {}
        ftype = (fin.get("finish_reason") or {}).get("type") if isinstance(fin.get("finish_reason"), dict) else None
        if rec.get("error") is None and ftype != "abort":
            return [
                f"a prompt of {len(req['input_ids'])} tokens, past the context, was served (finish {fin.get('finish_reason')!r})"
            ]
        return []
    if rec.get("error") is not None:
        return [f"raised {rec['error']}"]
    fin = rec.get("final") or {}
    fr = fin.get("finish_reason")
    ids = fin.get("output_ids") or []
    out = []
    ftype = fr.get("type") if isinstance(fr, dict) else None
    if ftype not in ("length", "stop", "abort"):
        out.append(f"finish reason {fr!r}")
    got_n = (fin.get("meta") or {}).get("completion_tokens")
    if got_n != len(ids):
        out.append(f"completion_tokens {got_n} for {len(ids)} output ids")
    if any(not (0 <= t < vocab) for t in ids):
        out.append("an output id outside the vocabulary")
    if not rec.get("stream_prefix_ok", True):
        out.append("a streamed chunk did not extend the previous one")
    if len(ids) > sp["max_new_tokens"]:
        out.append(f"{len(ids)} tokens for max_new_tokens {sp['max_new_tokens']}")
    if ftype == "length" and len(ids) != sp["max_new_tokens"]:
        out.append(f"finish 'length' after {len(ids)} of {sp['max_new_tokens']} tokens")
    if ftype == "stop" and sp.get("ignore_eos"):
        out.append("finish 'stop' under ignore_eos")
    if ftype == "abort" and not rec.get("abort_sent"):
        out.append(f"aborted though no abort was sent: {fr!r}")
    if float(sp.get("temperature", 1.0)) == 0.0:
        if ref_ids is None:
            out.append("no target-only reference")
        elif ftype == "abort":
            if ids != ref_ids[: len(ids)]:
                out.append(f"aborted output is not a prefix of target-only's (token {first_divergence(ids, ref_ids)})")
        elif ids != ref_ids:
            out.append(
                f"differs from target-only at token {first_divergence(ids, ref_ids)} ({len(ids)} vs {len(ref_ids)} tokens)"
            )
    return out


def rss_growth_mib(samples: list) -> float | None:
    """Median resident memory of the last fifth of the run minus that of its second fifth
    (the first fifth is warm-up: allocator pools, compiled kernels)."""
    vals = [m for _, m in samples]
    if len(vals) < 10:
        return None
    k = len(vals) // 5
    return statistics.median(vals[-k:]) - statistics.median(vals[k : 2 * k])


def verdict(
    workload: list[dict],
    soak: dict,
    reference: dict[int, list[int]],
    log_text: str,
    *,
    vocab: int,
    expect_retraction: bool,
    max_rss_growth_mib: float,
) -> dict:
    """The soak's summary: counts, per-request failures and run-level failures."""
    recs = {r["index"]: r for r in soak.get("results", [])}
    failures: dict[int, list[str]] = {}
    kinds = {"greedy_equal": 0, "aborted": 0, "errors_expected": 0, "finished": 0}
    for req in workload:
        rec = recs.get(req["index"])
        bad = check_request(req, rec, reference.get(req["index"]), vocab)
        if bad:
            failures[req["index"]] = bad
            continue
        fin = (rec or {}).get("final") or {}
        ftype = fin.get("finish_reason", {}).get("type") if isinstance(fin.get("finish_reason"), dict) else None
        if req["kind"] == "over_limit":
            kinds["errors_expected"] += 1
        elif ftype == "abort":
            kinds["aborted"] += 1
        else:
            kinds["finished"] += 1
            if float(req["sampling_params"].get("temperature", 1.0)) == 0.0:
                kinds["greedy_equal"] += 1
    run_failures = []
    if not soak.get("ok"):
        run_failures.append(f"the engine run failed: {soak.get('error')}")
    loads = soak.get("loads") or {}
    idle, flushed = loads.get("idle") or {}, loads.get("after_flush") or {}
    if soak.get("ok"):
        if idle.get("running") or idle.get("waiting"):
            run_failures.append(f"not idle after the load: {idle}")
        if flushed.get("used_tokens"):
            run_failures.append(
                f"{flushed['used_tokens']} KV tokens still in use after flush_cache "
                f"(idle: {idle.get('used_tokens')}); leaked rows"
            )
        if not soak.get("flush_ok"):
            run_failures.append("flush_cache did not succeed (requests still held?)")
    leaks = [p for p in LEAK_PATTERNS if p in log_text]
    if leaks:
        run_failures.append(f"SGLang's log reports: {', '.join(leaks)}")
    n_retract = retractions(log_text)
    if expect_retraction and n_retract == 0:
        run_failures.append("no request was retracted: the KV pool never filled (lower --max-total-tokens)")
    growth = rss_growth_mib(soak.get("rss_mib") or [])
    if growth is not None and growth > max_rss_growth_mib:
        run_failures.append(f"resident memory grew {growth:.0f} MiB (> {max_rss_growth_mib:.0f})")
    return {
        "ok": not failures and not run_failures,
        "requests": len(workload),
        "run": len(recs),
        **kinds,
        "greedy_requests": sum(1 for r in workload if float(r["sampling_params"].get("temperature", 1)) == 0.0),
        "abort_sent": sum(1 for r in recs.values() if r.get("abort_sent")),
        "retracted_reqs": n_retract,
        "rss_growth_mib": None if growth is None else round(growth, 1),
        "loads": loads,
        "soak_s": soak.get("soak_s"),
        "failures": {str(k): v for k, v in sorted(failures.items())},
        "run_failures": run_failures,
    }
