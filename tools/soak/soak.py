"""Soak a real SGLang engine running DDTREE: many concurrent requests, aborts, a KV pool small
enough to force retraction, prompts at and past the context limit; then check every answer.

What it does (bounded in requests and time; the engine listens on nothing: it is driven in
process, through ``sglang.Engine.async_generate``):

1. makes a deterministic request stream (``soak_workload.py``: random prompt lengths, greedy and
   sampled requests with top-k / top-p / min-p, streaming or not, a share aborted mid-stream or
   after a delay, a share at the context limit and a few past it);
2. runs it against a DDTREE engine (``soak_engine.py``, its own process) from ``--clients``
   concurrent client loops, sampling the engine processes' resident memory, then waits for
   idle, flushes the cache and reads the scheduler's load snapshot; SGLang's own idle-time
   memory checker runs in strict mode (``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1``: a
   leaked KV row or request slot raises in the scheduler);
3. runs every greedy request again on a target-only engine with the same model, dtype, backend
   and context (one batched call) for the reference tokens; its pool and running-request cap
   hold ``--reference-batch`` requests at once (its job is the tokens, not the pressure);
4. checks (``soak_checks.py``) and writes ``OUT/summary.json`` (the verdict), ``OUT/results.json``
   (every request, its record and its failures) and the two engines' logs; a table on stderr.
   Exit 0: zero failures; 1: failures (listed); 2: bad arguments.

``--cpu`` runs the real engine on this CPU the way the real-engine suite does
(``tests/real_engine``: the patched pinned wheel, its launch shims and ``sgl_kernel`` CPU ops,
Triton interpreted) on the suite's tiny random models unless ``--model`` / ``--draft`` are
given. Without ``--cpu`` the environment is the caller's (e.g. the H200 harness's).

Examples::

    .venv/bin/python tools/soak/soak.py --cpu --requests 200 --out out/soak     # make soak
    python3 tools/soak/soak.py --model M --draft D --device cuda --dtype bfloat16 \\
        --requests 5000 --clients 64 --max-running-requests 64 --cuda-graphs --out $OUT/soak
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import soak_checks as checks  # siblings: the script's directory is on sys.path when it runs
import soak_workload as wl

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CPU_SUITE = REPO / "tests" / "real_engine"


def _load(path: Path):
    """A module of the real-engine suite by file (its CPU launch environment and tiny models
    are defined once, there)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _model_facts(model: Path) -> tuple[int, tuple[int, ...]]:
    cfg = json.loads((model / "config.json").read_text())
    vocab = int(cfg["vocab_size"])
    special = {i for i in (cfg.get("eos_token_id"), cfg.get("bos_token_id"), cfg.get("pad_token_id")) if isinstance(i, int)}
    return vocab, tuple(sorted(special))


def engine_kwargs(args, *, ddtree: bool) -> dict:
    kw = dict(
        model_path=str(args.model),
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        context_length=args.context_length,
        random_seed=0,
        log_level="warning",
        skip_server_warmup=True,
        disable_cuda_graph=not args.cuda_graphs,
    )
    if ddtree:
        kw.update(
            speculative_algorithm=args.algorithm,
            speculative_draft_model_path=str(args.draft),
            speculative_draft_attention_backend=args.attention_backend,
        )
        if args.algorithm == "DDTREE":
            kw["speculative_ddtree_budget"] = args.budget
            if args.topk_cap is not None:
                kw["speculative_ddtree_topk_cap"] = args.topk_cap
    for item in args.engine_arg:
        k, v = item.split("=", 1)
        kw[k.replace("-", "_")] = json.loads(v) if v[:1] in '0123456789[{tf"-' else v
    return kw


def run_engine(job: dict, out: Path, name: str, env: dict, timeout_s: float) -> tuple[dict, str]:
    job_path, res_path, log_path = out / f"{name}-job.json", out / f"{name}-result.json", out / f"{name}.log"
    job_path.write_text(json.dumps(job))
    res_path.unlink(missing_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "soak_engine.py"), str(job_path), str(res_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
    try:
        os.killpg(proc.pid, 9)  # whatever the engine left behind (scheduler, detokenizer)
    except ProcessLookupError:
        pass
    text = log_path.read_text(errors="replace")
    if not res_path.is_file():
        return {
            "ok": False,
            "error": f"{name} engine process ended (rc {proc.returncode}) without a result; log {log_path}",
        }, text
    return json.loads(res_path.read_text()), text


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--out", type=Path, required=True, help="output directory (created)")
    ap.add_argument("--cpu", action="store_true", help="the real-engine suite's CPU environment and tiny models")
    ap.add_argument("--model", type=Path, help="target checkpoint dir (default with --cpu: the tiny target)")
    ap.add_argument("--draft", type=Path, help="DFlash drafter dir (default with --cpu: the tiny drafter)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8, help="concurrent client loops")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--algorithm",
        choices=("DDTREE", "DFLASH"),
        default="DDTREE",
        help="the speculative algorithm soaked (DFLASH: the same soak of linear DFlash, to tell "
        "a DDTREE finding from one SGLang's DFlash shares)",
    )
    ap.add_argument("--budget", default="16", help="--speculative-ddtree-budget (a number or auto)")
    ap.add_argument("--topk-cap", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=24, help="each request draws 1..this")
    ap.add_argument("--context-length", type=int, default=96)
    ap.add_argument("--max-total-tokens", type=int, default=300, help="KV pool size in tokens (small: forces retraction)")
    ap.add_argument("--max-running-requests", type=int, default=8)
    ap.add_argument("--abort-share", type=float, default=0.15)
    ap.add_argument("--greedy-share", type=float, default=0.5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--cuda-graphs", action="store_true", help="leave CUDA graphs on (GPU)")
    ap.add_argument(
        "--reference-eager",
        action="store_true",
        help="run the target-only reference without CUDA graphs (starts in seconds instead of "
        "minutes of capture; greedy tokens are the same kernels' output)",
    )
    ap.add_argument(
        "--reference-batch",
        type=int,
        default=64,
        help="the target-only reference runs up to this many greedy requests at once, with a KV pool "
        "sized for them (at least the soaked engine's): a 300-token pool would retract it too",
    )
    ap.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra sglang.Engine kwarg for both engines (repeatable)",
    )
    ap.add_argument("--time-limit-s", type=float, default=900, help="the load phase's limit")
    ap.add_argument("--request-timeout-s", type=float, default=300)
    ap.add_argument(
        "--expect-retraction",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fail when no request was retracted (default on)",
    )
    ap.add_argument("--max-rss-growth-mib", type=float, default=256)
    args = ap.parse_args(argv)
    if not args.cpu and (args.model is None or args.draft is None):
        ap.error("--model and --draft are required without --cpu")
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is not a directory (the soak writes its summary, results and logs into one)")
    if args.requests < 1 or args.clients < 1 or args.reference_batch < 1:
        ap.error("--requests, --clients and --reference-batch must be >= 1")
    for item in args.engine_arg:
        if "=" not in item:
            ap.error(f"--engine-arg wants KEY=VALUE (got {item!r})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.cpu:
        from ddtree_deploy.build import overlay

        env = _load(CPU_SUITE / "re_engine_proc.py").engine_env(overlay.patched_site())
        if args.model is None or args.draft is None:
            models = _load(CPU_SUITE / "tiny_models.py").make_all(Path(tempfile.mkdtemp(prefix="soak-models-")))
            args.model, args.draft = args.model or models["target"], args.draft or models["draft"]
    env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] = "1"
    vocab, special = _model_facts(args.model)
    mask = json.loads((args.draft / "config.json").read_text()).get("dflash_config", {}).get("mask_token_id")
    special = tuple(sorted(set(special) | ({mask} if isinstance(mask, int) else set())))
    mix = wl.Mix(greedy=args.greedy_share, abort=args.abort_share)
    reqs = wl.make_workload(
        args.requests,
        vocab=vocab,
        special_ids=special,
        context_length=args.context_length,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        mix=mix,
    )
    work = [r.to_json() for r in reqs]
    limit = args.time_limit_s + 600  # engine start-up, idle wait and shutdown on top of the load
    t0 = time.monotonic()
    what = f"DDTREE budget {args.budget}" if args.algorithm == "DDTREE" else args.algorithm
    sys.stderr.write(
        f"soak: {len(work)} requests, {args.clients} clients, {what}, "
        f"pool {args.max_total_tokens} tokens, context {args.context_length}\n"
    )
    soak, soak_log = run_engine(
        {
            "mode": "soak",
            "engine": engine_kwargs(args, ddtree=True),
            "requests": work,
            "clients": args.clients,
            "time_limit_s": args.time_limit_s,
            "request_timeout_s": args.request_timeout_s,
        },
        out,
        "soak-ddtree",
        env,
        limit,
    )
    greedy = [r for r in work if r["kind"] != "over_limit" and r["sampling_params"]["temperature"] == 0.0]
    reference: dict[int, list[int]] = {}
    ref_log = ""
    if greedy:
        sys.stderr.write(f"soak: target-only reference for {len(greedy)} greedy requests\n")
        ref_kw = engine_kwargs(args, ddtree=False)
        running = max(args.max_running_requests, min(len(greedy), args.reference_batch))
        ref_kw.update(
            max_running_requests=running,
            max_total_tokens=max(args.max_total_tokens, running * args.context_length),
        )
        if args.reference_eager:  # the legacy boolean alone leaves the decode graph on (issue 9)
            ref_kw.update(disable_cuda_graph=True, cuda_graph_backend_decode="disabled", cuda_graph_backend_prefill="disabled")
        ref, ref_log = run_engine({"mode": "reference", "engine": ref_kw, "requests": greedy}, out, "reference-plain", env, limit)
        if ref.get("ok"):
            reference = {r["index"]: o["output_ids"] for r, o in zip(greedy, ref["outputs"]) if o.get("output_ids") is not None}
        else:
            soak.setdefault("reference_error", ref.get("error"))
    summary = checks.verdict(
        work,
        soak,
        reference,
        soak_log,
        vocab=vocab,
        expect_retraction=args.expect_retraction,
        max_rss_growth_mib=args.max_rss_growth_mib,
    )
    if greedy and not reference:
        summary["ok"] = False
        summary["run_failures"].append(f"the target-only reference failed: {soak.get('reference_error')}")
    summary.update(
        wall_s=round(time.monotonic() - t0, 1), engine=engine_kwargs(args, ddtree=True), clients=args.clients, seed=args.seed
    )
    recs = {r["index"]: r for r in soak.get("results", [])}
    (out / "results.json").write_text(
        json.dumps(
            [
                {
                    "request": r,
                    "record": recs.get(r["index"]),
                    "reference": reference.get(r["index"]),
                    "failures": summary["failures"].get(str(r["index"]), []),
                }
                for r in work
            ]
        )
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    _print(summary, out)
    return 0 if summary["ok"] else 1


def _print(s: dict, out: Path) -> None:
    w = sys.stderr.write
    w(
        f"soak: {'PASS' if s['ok'] else 'FAIL'} in {s['wall_s']} s: {s['run']}/{s['requests']} run, "
        f"{s['finished']} finished ({s['greedy_equal']} greedy, all equal to target-only), "
        f"{s['aborted']} aborted, {s['errors_expected']} past the context refused, "
        f"{s['retracted_reqs']} retractions, RSS growth {s['rss_growth_mib']} MiB\n"
    )
    for k, v in list(s["failures"].items())[:20]:
        w(f"  request {k}: {'; '.join(v)}\n")
    for f in s["run_failures"]:
        w(f"  run: {f}\n")
    w(f"soak: {out / 'summary.json'}\n")


if __name__ == "__main__":
    sys.exit(main())
