"""One real ``sglang.Engine`` under the soak's load: the process ``soak.py`` starts.

Runs with ``sglang`` importable (the patched site on ``PYTHONPATH``; on the CPU also the
real-engine suite's launch shims). ``python soak_engine.py JOB.json OUT.json``; JOB holds
``mode`` ("soak", "reference" or "margins"), ``engine`` (``sglang.Engine`` kwargs) and:

- soak: ``requests`` (soak_workload.SoakRequest dicts), ``clients``, ``time_limit_s``,
  ``request_timeout_s``. Client loops take requests from one queue and send them with
  ``async_generate`` (streaming or not), aborting some (``abort_request``) mid-stream or after a
  delay. Each request's record: the final message (output ids, finish reason, meta info), the
  number of streamed chunks and whether every chunk extended the previous one, the error if the
  call raised. Then, the load gone: the scheduler's load snapshot (running / waiting requests,
  KV tokens in use) before and after ``flush_cache``; and, every ``rss_every_s`` throughout, the
  resident memory of the engine's processes (this one, scheduler, detokenizer).
- reference: ``requests`` (input_ids + sampling_params): one batched ``generate``; the outputs.
- margins: the same, with each output position's two most likely tokens and their logprobs
  (``top2``: ``[[token, logprob], [token, logprob]]`` per position), for ``soak_triage.py``.

OUT gets ``{"ok": true, ...}`` or ``{"ok": false, "error", "traceback"}``; the engine is always
shut down. SGLang's own log goes to this process's stderr (``soak.py`` keeps it in a file and
reads the retractions and leak reports from it).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import traceback


def _final(o) -> dict:
    mi = dict((o or {}).get("meta_info") or {})
    fr = mi.get("finish_reason")
    if not isinstance(fr, (dict, str, type(None))):
        fr = str(fr)
    keep = {k: mi.get(k) for k in ("prompt_tokens", "completion_tokens", "spec_verify_ct", "spec_accept_length") if k in mi}
    return {"output_ids": list((o or {}).get("output_ids") or []), "finish_reason": fr, "meta": keep}


class RssSampler(threading.Thread):
    """Resident memory (MiB) of this process and its children, every ``every_s``."""

    def __init__(self, every_s: float):
        super().__init__(daemon=True)
        self.every_s, self.samples, self._halt = every_s, [], threading.Event()

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        t0 = time.monotonic()
        while not self._halt.wait(self.every_s):
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.samples.append((round(time.monotonic() - t0, 2), round(total / 2**20, 1)))

    def stop(self) -> list:
        self._halt.set()
        self.join(timeout=5)
        return self.samples


async def _one(engine, req: dict, timeout_s: float) -> dict:
    rid = f"soak-{req['index']}-{os.getpid()}"
    rec = {"index": req["index"], "chunks": 0, "stream_prefix_ok": True, "abort_sent": False, "error": None, "final": None}
    t0 = time.monotonic()
    try:
        if req["stream"]:

            async def consume():
                last, prev = None, []
                gen = await engine.async_generate(
                    input_ids=req["input_ids"], sampling_params=req["sampling_params"], stream=True, rid=rid
                )
                async for chunk in gen:
                    last = chunk
                    rec["chunks"] += 1
                    ids = list(chunk.get("output_ids") or [])
                    if ids[: len(prev)] != prev:  # each chunk carries the whole output so far
                        rec["stream_prefix_ok"] = False
                    prev = ids
                    n_abort = req.get("abort_after_tokens")
                    if n_abort is not None and not rec["abort_sent"] and len(ids) >= n_abort:
                        rec["abort_sent"] = True
                        engine.tokenizer_manager.abort_request(rid=rid)
                return last

            rec["final"] = _final(await asyncio.wait_for(consume(), timeout_s))
        else:
            task = asyncio.ensure_future(
                engine.async_generate(input_ids=req["input_ids"], sampling_params=req["sampling_params"], stream=False, rid=rid)
            )
            delay = req.get("abort_after_s")
            if delay is not None:
                done, _ = await asyncio.wait([task], timeout=delay)
                if not done:
                    rec["abort_sent"] = True
                    engine.tokenizer_manager.abort_request(rid=rid)
            rec["final"] = _final(await asyncio.wait_for(task, timeout_s))
    except Exception as e:  # noqa: BLE001  (recorded; the checks decide whether it was expected)
        rec["error"] = f"{type(e).__name__}: {e}"[:500]
    rec["wall_s"] = round(time.monotonic() - t0, 3)
    return rec


async def _soak(engine, job: dict) -> list:
    queue: asyncio.Queue = asyncio.Queue()
    for r in job["requests"]:
        queue.put_nowait(r)
    results: list = []
    deadline = time.monotonic() + float(job["time_limit_s"])

    async def client():
        while not queue.empty() and time.monotonic() < deadline:
            req = queue.get_nowait()
            results.append(await _one(engine, req, float(job["request_timeout_s"])))

    await asyncio.gather(*(client() for _ in range(int(job["clients"]))))
    return sorted(results, key=lambda r: r["index"])


async def _loads(engine) -> dict:
    snaps = await engine.tokenizer_manager.get_loads()
    s = snaps[0]
    mem = getattr(s, "memory", None)
    return {
        "running": int(s.num_running_reqs),
        "waiting": int(s.num_waiting_reqs),
        "used_tokens": int(s.num_used_tokens),
        "token_capacity": int(mem.token_capacity) if mem is not None else None,
    }


async def _until_idle(engine, limit_s: float = 60.0) -> dict:
    deadline = time.monotonic() + limit_s
    while True:
        ld = await _loads(engine)
        if (ld["running"] == 0 and ld["waiting"] == 0) or time.monotonic() > deadline:
            return ld
        await asyncio.sleep(0.2)


def run(job: dict) -> dict:
    import sglang

    t0 = time.monotonic()
    engine = sglang.Engine(**job["engine"])
    started_s = time.monotonic() - t0
    try:
        if job["mode"] == "margins":  # soak_triage.py: greedy again, with each position's top-2 logprobs
            outs = engine.generate(
                input_ids=[r["input_ids"] for r in job["requests"]],
                sampling_params=[r["sampling_params"] for r in job["requests"]],
                return_logprob=True,
                top_logprobs_num=2,
            )
            return {
                "ok": True,
                "start_s": started_s,
                "outputs": [
                    dict(
                        _final(o),
                        top2=[[[t[1], t[0]] for t in (pos or [])[:2]] for pos in o["meta_info"].get("output_top_logprobs") or []],
                    )
                    for o in outs
                ],
            }
        if job["mode"] == "reference":
            reqs = job["requests"]
            try:
                outs = [
                    _final(o)
                    for o in engine.generate(
                        input_ids=[r["input_ids"] for r in reqs], sampling_params=[r["sampling_params"] for r in reqs]
                    )
                ]
            except ValueError:  # one request refused (e.g. too long): ask one by one, keep the rest
                outs = []
                for r in reqs:
                    try:
                        outs.append(_final(engine.generate(input_ids=r["input_ids"], sampling_params=r["sampling_params"])))
                    except ValueError as e:
                        outs.append({"output_ids": None, "error": f"{type(e).__name__}: {e}"[:500]})
            return {"ok": True, "start_s": started_s, "outputs": outs}
        sampler = RssSampler(float(job.get("rss_every_s", 0.5)))
        sampler.start()
        loop = engine.loop
        before = loop.run_until_complete(_loads(engine))
        t1 = time.monotonic()
        results = loop.run_until_complete(_soak(engine, job))
        soak_s = time.monotonic() - t1
        idle = loop.run_until_complete(_until_idle(engine))
        flushed = engine.flush_cache()
        after_flush = loop.run_until_complete(_loads(engine))
        rss = sampler.stop()
        return {
            "ok": True,
            "start_s": started_s,
            "soak_s": soak_s,
            "results": results,
            "loads": {"before": before, "idle": idle, "after_flush": after_flush},
            "flush_ok": bool(getattr(flushed, "success", False)),
            "rss_mib": rss,
        }
    finally:
        engine.shutdown()


def main() -> int:
    job = json.loads(open(sys.argv[1]).read())
    try:
        res = run(job)
    except BaseException as e:  # noqa: BLE001  (written for soak.py, which fails with it)
        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    with open(sys.argv[2], "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
