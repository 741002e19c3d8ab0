"""Tables and a plot from the H200 harness's `pair` part (tools/sglang_h200/run_engine.py --part pair).

Usage: python tools/real_pair/pair_report.py pair.json --md bench/real-pair/h200.md --png bench/real-pair/h200.png
[--machine "..."] [--summary tools/real_pair/model/summary.json]

Per temperature and batch: tokens per verify step (tau; target-only: 1), decode tokens/s of the batch, speed-up
over target-only and over DFLASH measured in the same run, and (T = 0) whether every output equals
target-only's token for token.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def rows(res: dict) -> list[dict]:
    out = []
    for name, case in res.items():
        if "ok" not in case:
            out.append({"method": name, "error": case.get("error", "?")})
            continue
        for r in case["ok"]["runs"]:
            out.append(
                {
                    "method": name,
                    "batch": r["batch"],
                    "T": r["temperature"],
                    "mix": bool(r.get("mixed")),  # run_engine --mixed: T = 1, top-k/top-p/min-p in one batch
                    "tau": r.get("tau"),
                    "tok_s": r["decode_tok_s"],
                    "ms_step": r["ms_per_step"],
                    "equal": case.get("equal_to_plain") if r["temperature"] == 0.0 else None,
                }
            )
    return out


def _budget(method: str) -> int | None:
    m = re.match(r"ddtree-B(\d+)", method)
    return int(m.group(1)) if m else None


def table(rs: list[dict]) -> str:
    by = {(r["method"], r.get("batch"), (r.get("T"), r.get("mix"))): r for r in rs if "error" not in r}
    lines = []
    for temp in sorted({(r["T"], r["mix"]) for r in rs if "T" in r}):
        title = f"T = {temp[0]:g}" + (", one batch mixing top-k 20 / top-p 0.9 / min-p 0.05 / plain" if temp[1] else "")
        lines += [
            f"\n### {title}\n",
            "| method | batch | tau (tokens/step) | decode tok/s | ms/step | x target-only | x DFLASH | T=0 equal |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for (method, batch, t), r in sorted(by.items(), key=lambda kv: (kv[0][1], _budget(kv[0][0]) or -1, kv[0][0])):
            if t != temp:
                continue
            base = by.get(("target-only", batch, t))
            dfl = by.get(("dflash", batch, t))
            sp = r["tok_s"] / base["tok_s"] if base else float("nan")
            sd = r["tok_s"] / dfl["tok_s"] if dfl else float("nan")
            tau = "1 (no drafter)" if method == "target-only" else (f"{r['tau']:.2f}" if r["tau"] else "-")
            eq = {True: "yes", False: "**no**", None: "-"}[r["equal"]]
            lines.append(f"| {method} | {batch} | {tau} | {r['tok_s']:.0f} | {r['ms_step']:.2f} | {sp:.2f} | {sd:.2f} | {eq} |")
    errs = [r for r in rs if "error" in r]
    for r in errs:
        lines.append(f"\n{r['method']}: **error** {r['error'][:300]}")
    return "\n".join(lines) + "\n"


def plot(rs: list[dict], png: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["method"], r["batch"], r["T"]): r for r in rs if "error" not in r and not r["mix"]}
    temps = sorted({k[2] for k in by})
    fig, axes = plt.subplots(2, len(temps), figsize=(5.5 * len(temps), 8), squeeze=False)
    for j, temp in enumerate(temps):
        for batch, color in zip((1, 8, 32), ("C0", "C1", "C2")):
            pts = sorted((_budget(m), r) for (m, b, t), r in by.items() if b == batch and t == temp and _budget(m))
            base = by.get(("target-only", batch, temp))
            dfl = by.get(("dflash", batch, temp))
            if not pts or not base:
                continue
            xs = [p[0] for p in pts]
            axes[0][j].plot(xs, [p[1]["tok_s"] / base["tok_s"] for p in pts], "o-", color=color, label=f"DDTREE, batch {batch}")
            axes[1][j].plot(xs, [p[1]["tau"] or 0 for p in pts], "o-", color=color, label=f"DDTREE, batch {batch}")
            if dfl:
                axes[0][j].axhline(dfl["tok_s"] / base["tok_s"], color=color, ls="--", lw=1, label=f"DFLASH, batch {batch}")
                axes[1][j].axhline(dfl["tau"] or 0, color=color, ls="--", lw=1)
        for i, ylab in enumerate(("speed-up over target-only (decode tok/s)", "tau (tokens per verify step)")):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("DDTREE budget B (nodes)")
            ax.set_ylabel(ylab)
            ax.set_title(f"T = {temp:g}")
            ax.grid(alpha=0.3)
        axes[0][j].legend(fontsize=7)
    fig.suptitle(f"Trained pair (tools/real_pair), real SGLang engine, graphs on - {machine}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def write_jsonl(res: dict, out_dir: Path, batch: int, dataset: str = "heldout") -> list[Path]:
    """The engine's outputs at one batch size as ``ddtree-deploy compare`` records, one file per temperature
    (methods named as the reference's benchmark.py names them: baseline, dflash, ddtree_tb{B})."""
    from ddtree_deploy.measure import records

    by_temp: dict[float, list] = {}
    for name, case in res.items():
        if "ok" not in case:
            continue
        budget = _budget(name)
        method = {"target-only": records.METHOD_BASELINE, "dflash": records.METHOD_DFLASH}.get(name)
        method = method or records.ddtree_method(budget)
        for r in case["ok"]["runs"]:
            if r["batch"] != batch or r.get("mixed"):
                continue
            tpot = (r["wall_s"] - r["prefill_s"]) / max(1, max(len(x) for x in r["output_ids"]) - 1)
            verify = r.get("verify_ct") or [None] * len(r["output_ids"])
            # Runs before verify_ct was recorded carry SGLang's per-request spec_accept_length.
            accept = r.get("accept_len") or [None] * len(r["output_ids"])
            for i, (ids, vc, acc) in enumerate(zip(r["output_ids"], verify, accept)):
                by_temp.setdefault(r["temperature"], []).append(
                    records.RunRecord(
                        dataset=dataset,
                        method=method,
                        budget=budget,
                        prompt_index=i,
                        output_ids=ids,
                        accept_length_mean=(len(ids) - 1) / vc if vc else acc,
                        verify_ct=vc,
                        num_output_tokens=len(ids),
                        time_per_output_token=tpot,
                        latency_s=r["wall_s"],
                    )
                )
    paths = []
    for temp, recs in by_temp.items():
        path = out_dir / f"engine-b{batch}-temp{temp:g}.jsonl"
        records.write_jsonl(path, recs)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--md", type=Path, required=True)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--machine", default="one NVIDIA H200")
    ap.add_argument("--jsonl-dir", type=Path, help="also write the outputs as ddtree-deploy compare records")
    ap.add_argument("--jsonl-batch", type=int, default=32)
    args = ap.parse_args(argv)
    rs = rows(json.loads(args.json.read_text()))
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(table(rs))
    if args.png:
        plot(rs, args.png, args.machine)
    if args.jsonl_dir:
        write_jsonl(json.loads(args.json.read_text()), args.jsonl_dir, args.jsonl_batch)
    print(args.md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
