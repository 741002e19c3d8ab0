"""Turn run_engine.py's JSON (equal / time parts, from the H200) into the bench/engine-h200 tables.

python tools/sglang_h200/report.py --equal equal.json --time time.json --machine "..." > table.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _load(paths):
    out = {}
    for p in paths or []:
        out.update(json.loads(Path(p).read_text()))
    return out


def equal_table(res: dict) -> str:
    ref = res.get("plain", {}).get("ok")
    for name, r in res.items():
        if name != "plain" and r.get("ok") and ref and "equal_to_plain" not in r:
            r["equal_to_plain"] = r["ok"]["runs"][0]["output_ids"] == ref["runs"][0]["output_ids"]
    rows = [
        "| case | engine start (s) | output equal to plain greedy | mean accepted length | error |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    for name, r in res.items():
        ok = r.get("ok")
        if ok:
            run = ok["runs"][0]
            acc = [a for a in run.get("accept_len") or [] if a is not None]
            equal = r.get("equal_to_plain", "reference") if name != "plain" else "reference"
            rows.append(
                f"| {name} | {ok['start_s']} | {equal} | {sum(acc) / len(acc):.2f} |  |"
                if acc
                else f"| {name} | {ok['start_s']} | {equal} | - |  |"
            )
        else:
            rows.append(f"| {name} | - | - | - | {r.get('error', '?')[:160]} |")
    return "\n".join(rows)


def time_table(res: dict) -> str:
    batches = sorted({run["batch"] for r in res.values() if r.get("ok") for run in r["ok"]["runs"]})
    head = (
        "| case | "
        + " | ".join(f"ms/step b={b}" for b in batches)
        + " | "
        + " | ".join(f"steps b={b}" for b in batches)
        + " | error |"
    )
    rows = [head, "| --- |" + " ---: |" * (2 * len(batches)) + " --- |"]
    for name, r in res.items():
        ok = r.get("ok")
        if not ok:
            rows.append(f"| {name} |" + " - |" * (2 * len(batches)) + f" {r.get('error', '?')[:160]} |")
            continue
        by = {run["batch"]: run for run in ok["runs"]}
        ms = " | ".join(f"{by[b]['ms_per_step']:.2f}" if b in by else "-" for b in batches)
        st = " | ".join(str(by[b]["decode_steps"]) if b in by else "-" for b in batches)
        rows.append(f"| {name} | {ms} | {st} |  |")
    ref = res.get("dflash-graphs", {}).get("ok") or res.get("dflash-nographs", {}).get("ok")
    if ref:
        rref = {run["batch"]: run["ms_per_step"] for run in ref["runs"]}
        rows.append("")
        rows.append(
            "Step-time ratio vs "
            + ("dflash-graphs" if res.get("dflash-graphs", {}).get("ok") else "dflash-nographs")
            + " (same run):"
        )
        rows.append("")
        rows.append("| case | " + " | ".join(f"b={b}" for b in batches) + " |")
        rows.append("| --- |" + " ---: |" * len(batches))
        for name, r in res.items():
            if r.get("ok"):
                by = {run["batch"]: run["ms_per_step"] for run in r["ok"]["runs"]}
                rows.append(
                    f"| {name} | "
                    + " | ".join(f"{by[b] / rref[b]:.2f}" if b in by and b in rref and rref[b] else "-" for b in batches)
                    + " |"
                )
    return "\n".join(rows)


def wall_per_step(run: dict) -> float:
    """ms per decode step from the whole generation's wall (prefill included): an upper bound that,
    unlike ms_per_step, does not depend on the 1-token reference (which at times took 0.3-0.5 s)."""
    return 1000.0 * run["wall_s"] / max(run["decode_steps"], 1)


def ratio_table(res: dict, ref: str) -> str:
    """wall/step of every case, its ratio to ``ref`` (a DFLASH case of the same run), whether its
    tokens equal ``ref``'s, and (auto budget) which budgets its steps ran."""
    base = {run["batch"]: run for run in res[ref]["ok"]["runs"]}
    batches = sorted(base)
    rows = [
        "| case | " + " | ".join(f"b={b} ms (ratio)" for b in batches) + " | tokens = " + ref + " | budgets run |",
        "| --- |" + " ---: |" * len(batches) + " --- | --- |",
    ]
    for name, r in res.items():
        if not r.get("ok"):
            continue
        by = {run["batch"]: run for run in r["ok"]["runs"]}
        cells = [
            f"{wall_per_step(by[b]):.2f} ({wall_per_step(by[b]) / wall_per_step(base[b]):.2f})" if b in by else "-"
            for b in batches
        ]
        same = all(by[b]["output_ids"] == base[b]["output_ids"] for b in batches if b in by)
        budgets = "; ".join(f"b={b}: {by[b].get('budgets')}" for b in batches if by.get(b, {}).get("budgets"))
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} | {budgets} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--equal", nargs="*")
    ap.add_argument("--time", nargs="*")
    ap.add_argument("--ratios-to", metavar="CASE", help="with --time: wall/step ratios to this DFLASH case")
    args = ap.parse_args(argv)
    if args.equal:
        print(equal_table(_load(args.equal)) + "\n")
    if args.time:
        res = _load(args.time)
        print((ratio_table(res, args.ratios_to) if args.ratios_to else time_table(res)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
