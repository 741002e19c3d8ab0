"""One real ``sglang.Engine`` in its own process, driven by the tests over two pipes.

``python engine_driver.py CMD_FD RES_FD`` reads the engine kwargs as the first JSON line on
CMD_FD, starts the engine (device cpu, the patched SGLang on PYTHONPATH), answers ``{"ready":
...}`` or ``{"startup_error": ...}`` on RES_FD, then serves one JSON command per line until
``{"op": "shutdown"}`` or EOF (the test process died): the engine is always shut down.
Commands:
  {"op": "generate", "input_ids": [[...]], "sampling_params": [{...}], "kwargs": {...}}
     -> {"outputs": [...]} (kwargs: generate()'s other arguments, e.g. return_logprob)
  {"op": "script", "requests": [{"input_ids", "sampling_params", "start_after": [j, n] | null,
     "abort_after": n | null}]} -> {"outputs": [...]}: requests run concurrently (streaming);
     one with start_after waits until request j has streamed >= n tokens; one with abort_after
     is aborted once it has streamed >= n tokens.
SGLang's logs go to this process's stdout/stderr (a log file the test shows on failure).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback


def _out(o):
    mi = dict(o.get("meta_info") or {})
    fr = mi.get("finish_reason")
    return {"output_ids": list(o.get("output_ids") or []), "meta_info": mi, "text": o.get("text"),
            "finish_reason": fr if isinstance(fr, (dict, str, type(None))) else str(fr)}


async def _script(engine, reqs):
    progress = [0] * len(reqs)
    events = [asyncio.Event() for _ in reqs]
    started_at = [None] * len(reqs)
    results = [None] * len(reqs)

    async def one(i, r):
        after = r.get("start_after")
        if after is not None:
            j, n = after
            while progress[j] < n and results[j] is None:
                await asyncio.sleep(0.01)
            started_at[i] = progress[j]
        rid = f"req-{i}-{os.getpid()}"
        last = None
        aborted = False
        gen = await engine.async_generate(input_ids=r["input_ids"], sampling_params=r["sampling_params"],
                                          stream=True, rid=rid)
        async for chunk in gen:
            last = chunk
            progress[i] = int(chunk["meta_info"].get("completion_tokens", 0))
            n_abort = r.get("abort_after")
            if n_abort is not None and not aborted and progress[i] >= n_abort:
                aborted = True
                engine.tokenizer_manager.abort_request(rid=rid)
        res = _out(last) if last is not None else {"output_ids": [], "meta_info": {}, "finish_reason": None}
        res["started_at_other_tokens"] = started_at[i]
        res["abort_sent"] = aborted
        results[i] = res
        events[i].set()

    await asyncio.wait_for(asyncio.gather(*(one(i, r) for i, r in enumerate(reqs))), timeout=900)
    return results


def _generate_kwargs(kw: dict) -> dict:
    """``generate`` keyword arguments from a command; ``custom_logit_processor`` names one of
    SGLang's own processor classes (``srt/sampling/custom_logit_processor.py``), serialized here,
    where SGLang is importable."""
    kw = dict(kw)
    name = kw.get("custom_logit_processor")
    if name is not None:
        from sglang.srt.sampling import custom_logit_processor as clp

        kw["custom_logit_processor"] = getattr(clp, name).to_str()
    return kw


_REPORTED = ("device", "dtype", "attention_backend", "chunked_prefill_size", "context_length",
             "max_running_requests", "page_size", "disable_cuda_graph", "speculative_algorithm",
             "speculative_ddtree_budget", "speculative_ddtree_topk_cap", "speculative_num_draft_tokens",
             "speculative_num_steps", "speculative_eagle_topk", "speculative_dflash_block_size",
             "disable_overlap_schedule")


def main() -> int:
    cmd = os.fdopen(int(sys.argv[1]), "r")
    res = os.fdopen(int(sys.argv[2]), "w")

    def reply(obj):
        res.write(json.dumps(obj) + "\n")
        res.flush()

    kwargs = json.loads(cmd.readline())
    try:
        import sglang

        engine = sglang.Engine(**kwargs)
    except BaseException as e:  # noqa: BLE001  (reported to the test, which fails with it)
        reply({"startup_error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return 0
    try:
        from sglang.srt.arg_groups.model_override_base import resolving_view

        view = resolving_view(engine.server_args)  # the resolved values (declarations included)
        import psutil

        kids = [c.pid for c in psutil.Process().children(recursive=True)]
        reply({"ready": True, "child_pids": kids,
               "server_args": {k: str(getattr(view, k, None)) for k in _REPORTED}})
        for line in cmd:
            req = json.loads(line)
            op = req.get("op")
            try:
                if op == "shutdown":
                    break
                if op == "generate":
                    outs = engine.generate(input_ids=req["input_ids"], sampling_params=req["sampling_params"],
                                           **_generate_kwargs(req.get("kwargs") or {}))
                    reply({"outputs": [_out(o) for o in outs]})
                elif op == "script":
                    reply({"outputs": engine.loop.run_until_complete(_script(engine, req["requests"]))})
                else:
                    reply({"error": f"unknown op {op!r}"})
            except Exception as e:  # noqa: BLE001
                reply({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
