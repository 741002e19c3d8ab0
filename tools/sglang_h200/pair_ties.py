"""Where a speculative run on the pair differs from target-only at T = 0, how close the target's choice was.

In bf16 two engine paths (the verify's prefill kernel with a tree mask, the decode kernel) round differently
and can break a tie between the target's best tokens differently; a speculative method then leaves the
target-only path with no bug in it. This reads ``run_engine.py --part pair`` JSON files (one of them holding
a ``target-only`` case), finds every T = 0 prompt whose output differs from target-only, and at the first
differing token ``k`` evaluates the target itself with transformers on this CPU, in float32 and in bf16:
its two best tokens and their log-prob gap. It also says which (prompt, k) pairs every listed case shares
(e.g. DDTREE's with upstream DFLASH's). Writes ``--out`` (JSON) and a table on stdout.

    .venv/bin/python tools/sglang_h200/pair_ties.py --pair tools/real_pair/model --out ties.json RUN.json...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cases(files: list[Path]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in files:
        for name, c in json.loads(f.read_text()).items():
            if "ok" in c:
                out[name.split("@")[0]] = c["ok"]
    return out


def divergences(all_cases: dict[str, dict]) -> list[dict]:
    if "target-only" not in all_cases:
        raise SystemExit("error: no target-only case in the files given (pass the run that holds it)")
    ref = {r["batch"]: r["output_ids"] for r in all_cases["target-only"]["runs"] if r["temperature"] == 0.0}
    rows = []
    for name, c in all_cases.items():
        for r in c["runs"]:
            if name == "target-only" or r["temperature"] != 0.0 or r["batch"] not in ref:
                continue
            for i, (o, p) in enumerate(zip(r["output_ids"], ref[r["batch"]])):
                if o != p:
                    k = next((j for j, (x, y) in enumerate(zip(o, p)) if x != y), min(len(o), len(p)))
                    if k < min(len(o), len(p)):
                        rows.append(
                            {
                                "case": name,
                                "batch": r["batch"],
                                "prompt": i,
                                "k": k,
                                "speculative": o[k],
                                "target_only": p[k],
                                "prefix": p[:k],
                            }
                        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run_engine.py --part pair JSON files")
    ap.add_argument("--pair", type=Path, required=True, help="the pair (target/, heldout_prompts.json)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    prompts = [p["input_ids"] for p in json.loads((args.pair / "heldout_prompts.json").read_text())]
    rows = divergences(cases(args.runs))
    models = {
        n: AutoModelForCausalLM.from_pretrained(str(args.pair / "target"), dtype=dt).eval()
        for n, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    for row in rows:
        ids = torch.tensor([prompts[row["prompt"]] + row.pop("prefix")])
        disputed = sorted([row["speculative"], row["target_only"]])
        for n, m in models.items():
            with torch.no_grad():
                lp = m(ids).logits[0, -1].float().log_softmax(-1)
            v, t = lp.topk(2)
            row[f"{n}_top2"] = t.tolist()
            row[f"{n}_gap"] = round((v[0] - v[1]).item(), 5)
            # how far below the best token each disputed token lies
            row[f"{n}_below_best"] = [round((v[0] - lp[x]).item(), 5) for x in disputed]
    seen: dict[tuple, set] = {}
    for r in rows:
        seen.setdefault((r["batch"], r["prompt"], r["k"]), set()).add(r["case"])
    names = sorted({r["case"] for r in rows})
    shared = sorted(k for k, v in seen.items() if len(v) == len(names))
    args.out.write_text(json.dumps({"rows": rows, "shared_by_every_case": shared, "cases": names}, indent=1))
    print(
        "| case | batch | prompt | first diff k | speculative | target-only "
        "| fp32: both within of best | bf16: both within of best |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['batch']} | {r['prompt']} | {r['k']} | {r['speculative']} | {r['target_only']} | "
            f"{max(r['fp32_below_best']):.4f} | {max(r['bf16_below_best']):.4f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
