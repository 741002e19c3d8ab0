"""Tell a soak's greedy divergences apart: a near-tie the hardware's rounding flipped, or a real one.

A soak (``soak.py``) fails a greedy request whose tokens differ from the target-only engine's. On a GPU
two engines that batch differently also round differently (Triton's fp32 ``tl.dot`` is TF32 by default,
bf16 kernels differ by shape), so a token whose two best candidates are nearly tied can flip between
them without any bug. This tool re-decodes every diverged request with the target alone on this CPU
(the real-engine suite's environment: float32, Triton interpreted, no TF32), asks for each position's
top-2 logprobs, and classifies each divergence at its first differing token ``k``:

- ``near-tie``: the CPU decode agrees with the soak's target-only reference before ``k``, its two best
  tokens at ``k`` are exactly the two the GPU engines disagreed on, and their logprob gap is below
  ``--tie-gap`` (default 0.01);
- ``real``: the CPU's two best tokens at ``k`` are not the disputed pair, or the gap is wide: a
  speculative answer no rounding explains (a bug to chase);
- ``inconclusive``: the CPU decode already differs from the reference before ``k`` (an earlier near-tie
  of its own), so position ``k`` cannot be compared.

Writes ``OUT/triage.json`` and prints a table (stdout). Exit 0 when every divergence is a near-tie, 1
otherwise, 2 for bad input. Example (the GPU soak's output folder brought back here)::

    .venv/bin/python tools/soak/soak_triage.py --soak-dir /tmp/soak --model tools/real_pair/model/target
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from soak_checks import first_divergence  # siblings: the script's directory is on sys.path

HERE = Path(__file__).resolve().parent


def diverged(soak_dir: Path) -> list[dict]:
    """The soak's greedy requests whose speculative output differs from its target-only reference:
    index, prompt, sampling params, both outputs and the first differing position."""
    need = ["soak-ddtree-job.json", "soak-ddtree-result.json", "reference-plain-job.json", "reference-plain-result.json"]
    absent = [n for n in need if not (soak_dir / n).is_file()]
    if absent:
        raise SystemExit(
            f"error: {soak_dir} is not a finished soak's output folder (missing {', '.join(absent)}); "
            "give the --out folder of a soak.py run that reached its target-only reference"
        )
    load = lambda n: json.loads((soak_dir / n).read_text())  # noqa: E731
    reqs = {r["index"]: r for r in load("soak-ddtree-job.json")["requests"]}
    spec = {r["index"]: (r.get("final") or {}).get("output_ids") for r in load("soak-ddtree-result.json")["results"]}
    ref_job, ref_res = load("reference-plain-job.json"), load("reference-plain-result.json")
    out = []
    for r, o in zip(ref_job["requests"], ref_res["outputs"]):
        i, ref_ids, ids = r["index"], o.get("output_ids"), spec.get(r["index"])
        if ref_ids is None or ids is None or ids == ref_ids:
            continue
        k = first_divergence(ids, ref_ids)
        if k >= min(len(ids), len(ref_ids)):
            continue  # one is a prefix of the other (length, not tokens): not this tool's question
        out.append(
            {
                "index": i,
                "input_ids": reqs[i]["input_ids"],
                "sampling_params": reqs[i]["sampling_params"],
                "speculative": ids,
                "reference": ref_ids,
                "k": k,
            }
        )
    return out


def classify(d: dict, cpu_ids: list[int], top2: list[list], tie_gap: float) -> dict:
    """One divergence ``d`` (diverged()) against the CPU re-decode (its tokens and per-position top-2)."""
    k = d["k"]
    pair = sorted([d["speculative"][k], d["reference"][k]])
    row = {"index": d["index"], "k": k, "speculative": d["speculative"][k], "reference": d["reference"][k]}
    if cpu_ids[:k] != d["reference"][:k] or k >= len(top2) or len(top2[k]) < 2:
        return dict(row, verdict="inconclusive", why="the CPU decode differs from the reference before k")
    (t0, lp0), (t1, lp1) = top2[k][0], top2[k][1]
    gap = lp0 - lp1
    row.update(cpu_token=cpu_ids[k] if k < len(cpu_ids) else None, cpu_top2=[t0, t1], gap=gap)
    if sorted([t0, t1]) != pair:
        return dict(row, verdict="real", why="the CPU's two best tokens are not the disputed pair")
    if gap >= tie_gap:
        return dict(row, verdict="real", why=f"top-2 gap {gap:.2e} >= --tie-gap {tie_gap:g}")
    return dict(row, verdict="near-tie", why=f"top-2 gap {gap:.2e}")


def table(rows: list[dict]) -> str:
    lines = [
        "| request | first diff k | speculative | target-only | CPU top-2 | gap | verdict |",
        "|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        gap = f"{r['gap']:.2e}" if "gap" in r else "-"
        lines.append(
            f"| {r['index']} | {r['k']} | {r['speculative']} | {r['reference']} | "
            f"{r.get('cpu_top2', '-')} | {gap} | {r['verdict']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--soak-dir", type=Path, required=True, help="a soak.py --out folder")
    ap.add_argument("--model", type=Path, required=True, help="the soak's target checkpoint (read on this CPU)")
    ap.add_argument("--out", type=Path, help="where triage.json goes (default: --soak-dir)")
    ap.add_argument("--tie-gap", type=float, default=0.01, help="largest top-2 logprob gap called a near-tie")
    ap.add_argument("--context-length", type=int, default=512)
    args = ap.parse_args(argv)
    if not (args.model / "config.json").is_file():
        ap.error(f"--model {args.model}: no config.json there")
    ds = diverged(args.soak_dir)
    out = args.out or args.soak_dir
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    if ds:
        import soak  # the CPU engine environment and the engine runner, defined once there
        from ddtree_deploy.build import overlay

        env = soak._load(soak.CPU_SUITE / "re_engine_proc.py").engine_env(overlay.patched_site())
        kw = dict(
            model_path=str(args.model),
            device="cpu",
            dtype="float32",
            attention_backend="triton",
            disable_cuda_graph=True,
            max_total_tokens=max(4096, 2 * args.context_length * len(ds)),
            max_running_requests=len(ds),
            context_length=args.context_length,
            random_seed=0,
            log_level="warning",
            skip_server_warmup=True,
        )
        job = {
            "mode": "margins",
            "engine": kw,
            "requests": [{"input_ids": d["input_ids"], "sampling_params": d["sampling_params"]} for d in ds],
        }
        res, _ = soak.run_engine(job, out, "triage-cpu", env, 1800)
        if not res.get("ok"):
            print(f"error: the CPU engine failed: {res.get('error')}; log {out / 'triage-cpu.log'}", file=sys.stderr)
            return 1
        rows = [classify(d, o["output_ids"], o["top2"], args.tie_gap) for d, o in zip(ds, res["outputs"])]
    verdicts = {v: sum(r["verdict"] == v for r in rows) for v in ("near-tie", "real", "inconclusive")}
    (out / "triage.json").write_text(json.dumps({"tie_gap": args.tie_gap, "counts": verdicts, "rows": rows}, indent=1))
    print(table(rows))
    print(f"{len(rows)} divergences: " + ", ".join(f"{n} {v}" for v, n in verdicts.items()), file=sys.stderr)
    return 0 if verdicts["near-tie"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
