"""CLI: ``bench`` (a tree-budget sweep against SGLang servers) and ``compare`` (run vs baseline)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from ddtree_deploy.cli.console import env_of
from ddtree_deploy.cli.conventions import Command
from ddtree_deploy.errors import UsageError

JsonOpt = typer.Option(False, "--json", help="Machine-readable result on stdout.")


def _int_list(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise UsageError(f"{what}: empty list")
    return vals


def bench(
    ctx: typer.Context,
    host: str = typer.Argument(
        ..., metavar="HOST", help="An inventory host (reads \\[hosts.HOST.bench]) or a literal URL like http://127.0.0.1:30100."
    ),
    budgets: str = typer.Option(
        "16,32,64,128,256,512", "--budgets", metavar="BUDGETS", help="Comma-separated DDTree budgets B (tree nodes)."
    ),
    dataset: List[str] = typer.Option(
        [],
        "--dataset",
        "-d",
        metavar="DATASET",
        help="Repeatable. A local .jsonl file ([NAME=]PATH) or a reference dataset in the local HF cache: "
        "gsm8k, math500, humaneval, mbpp, mt-bench, alpaca.",
    ),
    concurrency: int = typer.Option(
        1, "--concurrency", "-c", metavar="N", help="Requests in flight (1 = the paper's batch-1 setting)."
    ),
    num_prompts: Optional[int] = typer.Option(16, "--num-prompts", metavar="N", help="Prompts per dataset (reference: 128)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", metavar="N", help="Per request (reference: 2048)."),
    temperature: float = typer.Option(
        0.0, "--temperature", metavar="T", help="0 = greedy (lossless: outputs must equal the baseline)."
    ),
    seed: Optional[int] = typer.Option(
        None,
        "--seed",
        metavar="N",
        help="T>0 only: send sampling_seed = seed + prompt_index"
        " (DDTREE then uses EAGLE's seeded tree kernel, not the target-sample walk).",
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", metavar="DIR", help="Output directory (default: bench-out/<host>-<UTC time>)."
    ),
    base_url: List[str] = typer.Option(
        [],
        "--base-url",
        metavar="URL",
        help="Repeatable. URL (every run; may contain {budget} {method} {kind})"
        " or KEY=URL with KEY a method (ddtree_tb64, baseline, dflash), a budget (64) or a kind.",
    ),
    server_command: Optional[str] = typer.Option(
        None,
        "--server-command",
        metavar="TEMPLATE",
        help="Shell template that brings up a server: {budget} {port} {method} {kind} {algorithm}.",
    ),
    server_command_baseline: Optional[str] = typer.Option(
        None, "--server-command-baseline", metavar="TEMPLATE", help="Template for the autoregressive server."
    ),
    server_command_dflash: Optional[str] = typer.Option(
        None, "--server-command-dflash", metavar="TEMPLATE", help="Template for the linear DFlash server."
    ),
    reference_runs: str = typer.Option(
        "baseline,dflash", "--reference-runs", metavar="RUNS", help="Reference runs drawn as horizontal lines ('' for none)."
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", metavar="PATH", help="Local tokenizer dir: render prompts with its chat template like the reference."
    ),
    health_timeout: float = typer.Option(
        900.0, "--health-timeout", metavar="SECONDS", help="Seconds to wait for /health per server."
    ),
    request_timeout: float = typer.Option(600.0, "--request-timeout", metavar="SECONDS", help="Seconds per /generate request."),
    inventory: Optional[str] = typer.Option(
        None, "--inventory", "-i", metavar="FILE", help="Inventory file (default: $DDTREE_DEPLOY_INVENTORY or deploy/hosts.toml)."
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars."),
    use_running_server: bool = typer.Option(
        False,
        "--use-running-server",
        help="Measure the server(s) already answering at the run URLs, as they are (no server command). "
        "Without it bench measures only servers it starts, on ports where nothing answers yet.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", "-n", help="Check the inputs and show each run's URL and server command; start and write nothing."
    ),
    json_: bool = JsonOpt,
) -> None:
    """Sweep DDTree budgets on a host: JSONL run records, a table (stderr) and a PNG plot.

    Bench starts each run's server itself (a server command with {port} from the run's URL, which must
    name a free port; there is no default port) and refuses when that port already answers; it
    measures a server it did not start only with --use-running-server.
    """
    env = env_of(ctx)
    from ddtree_deploy.measure.bench import BenchConfig, resolve_target, run_bench

    target = resolve_target(host, inventory)
    for item in base_url:
        key, sep, url = item.partition("=")
        if sep and not key.startswith(("http:", "https:")) and "://" in url:
            target.urls[key] = url
        else:
            target.base_url = item
    if server_command:
        target.commands[""] = server_command
    if server_command_baseline:
        target.commands["baseline"] = server_command_baseline
    if server_command_dflash:
        target.commands["dflash"] = server_command_dflash
    safe_host = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in target.name)[:60]
    out_dir = out or Path("bench-out") / f"{safe_host}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    cfg = BenchConfig(
        budgets=_int_list(budgets, "--budgets"),
        datasets=list(dataset),
        out_dir=out_dir,
        concurrency=concurrency,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        reference_runs=[r for r in reference_runs.replace(" ", "").split(",") if r],
        tokenizer=tokenizer,
        health_timeout_s=health_timeout,
        request_timeout_s=request_timeout,
        use_running_server=use_running_server,
    )
    if dry_run:
        plan = run_bench(target, cfg, env.err, progress=False, dry_run=True)
        for r in plan["runs"]:
            busy = " (PORT IN USE: would be refused)" if r["port_in_use"] else ""
            env.err.print(f"  {r['method']}: {r['url']}{busy}  {r['command'] or '(running server, as it is)'}", markup=False)
        message = f"dry run: {len(plan['runs'])} run(s) into {plan['out_dir']}; started and wrote nothing"
        env.err.print(message, markup=False)
        if json_:
            env.out_result({**plan, "dry_run": True}, message=message)
        return
    summary = run_bench(target, cfg, env.err, progress=not no_progress and not env.quiet)
    message = f"wrote {summary['files']['runs']}, {summary['files']['plot']}, {summary['files']['summary']}"
    env.err.print(message, soft_wrap=True, markup=False)
    if json_:
        env.out_result(summary, message=message)
    else:
        env.out_line(summary["files"]["runs"])


def compare(
    ctx: typer.Context,
    baseline: Path = typer.Argument(
        ..., metavar="BASELINE", help="Baseline: reference benchmark.py .pt, our .jsonl, or a directory of them."
    ),
    run: Path = typer.Argument(..., metavar="RUN", help="Run to check: .jsonl (ddtree-deploy bench), .pt, or a directory."),
    min_exact_match: Optional[float] = typer.Option(
        1.0,
        "--min-exact-match",
        metavar="RATE",
        help="Fail below this exact-match rate per dataset/method (T=0 is lossless: 1.0). Negative: off.",
    ),
    max_tpot_ratio: Optional[float] = typer.Option(
        None, "--max-tpot-ratio", metavar="RATIO", help="Fail if mean run TPOT / mean baseline TPOT exceeds this."
    ),
    min_tau_ratio: Optional[float] = typer.Option(
        None, "--min-tau-ratio", metavar="RATIO", help="Fail if run tau / baseline tau is below this."
    ),
    against: Optional[str] = typer.Option(
        None,
        "--against",
        metavar="METHOD",
        help="Compare every method with this BASELINE method (e.g. baseline: each vs target-only; works with BASELINE = RUN).",
    ),
    prefix_ok: bool = typer.Option(
        False, "--prefix-ok", help="Count an output that is a prefix of the other (different max_new_tokens) as a match."
    ),
    allow_target_divergence: bool = typer.Option(
        False,
        "--allow-target-divergence",
        help="Count a divergence as the targets' (column 'target'), not the method's, when on both sides the method's "
        "output equals that side's own target-only (baseline) output for the prompt; baseline-vs-baseline divergences "
        "are then reported, not failed. For a GPU engine against a CPU or bf16 reference whose targets round "
        "differently at near-ties.",
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", metavar="PATH", help="Local tokenizer dir/file to decode the text around divergences."
    ),
    json_: bool = JsonOpt,
) -> None:
    """Exact-match, first divergence, tau and TPOT of RUN vs BASELINE; exit 11 if thresholds fail."""
    env = env_of(ctx)
    from ddtree_deploy.measure.compare import Thresholds, check, compare_records, local_decoder, render
    from ddtree_deploy.measure.records import load_records

    if min_exact_match is not None and min_exact_match < 0:
        min_exact_match = None
    decode = local_decoder(tokenizer) if tokenizer else None
    base_recs = load_records(baseline)
    run_recs = load_records(run)
    report = compare_records(
        base_recs,
        run_recs,
        decode=decode,
        against=against,
        thresholds=Thresholds(
            min_exact_match=min_exact_match,
            max_tpot_ratio=max_tpot_ratio,
            min_tau_ratio=min_tau_ratio,
            prefix_ok=prefix_ok,
            allow_target_divergence=allow_target_divergence,
        ),
    )
    report["baseline"] = str(baseline)
    report["run"] = str(run)
    render(report, env.err)
    if json_ and report["ok"]:  # the same envelope as the failure's JSON (cli.main prints that one)
        env.out_result({"report": report}, message="thresholds pass")
    check(report)  # raises CompareFailedError (exit 11): {"ok": false, "exit_code", "error", "message", "report"}


def register(app: typer.Typer) -> None:
    app.command(
        "bench",
        cls=Command,
        epilog="Example: ddtree-deploy bench gpu1 --dataset gsm8k --num-prompts 16 --budgets 16,64 --out out/bench",
    )(bench)
    app.command("compare", cls=Command, epilog="Example: ddtree-deploy compare baseline.jsonl out/bench/runs.jsonl --json")(
        compare
    )
