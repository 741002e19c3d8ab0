"""Per-decode-step host launches and GPU busy / idle time from SGLang's torch-profiler traces.

    python tools/sglang_h200/trace_stats.py TRACE.json.gz [...]       # one row per trace

A decode step is the interval between the starts of consecutive ``scheduler.run_batch`` ranges
that hold a ``step[VERIFY ...]`` or ``step[DECODE ...]`` range (SGLang's own annotations); the
steady state is every such interval but the first and the last. Per step:

* ``launches``: host-side launch calls of the scheduler thread: ``cudaLaunchKernel``,
  ``cudaLaunchKernelExC``, ``cuLaunchKernelEx`` (Triton), ``cudaGraphLaunch`` (one per replayed
  graph), ``cudaMemcpyAsync``, ``cudaMemsetAsync``; ``graphs`` counts ``cudaGraphLaunch`` alone;
* ``gpu busy``: the union of the GPU's kernel / memcpy / memset intervals inside the step;
  ``gpu idle`` = step wall - busy: time the GPU waited on the host;
* ``run_batch``: the scheduler's ``run_batch`` range (host time to launch one step).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

LAUNCH = {
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
    "cuLaunchKernel",
    "cudaGraphLaunch",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
}
GPU = {"kernel", "gpu_memcpy", "gpu_memset"}


def _load(path: Path) -> list:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _union(intervals, lo, hi) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def step_stats(events: list) -> dict:
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    ann = [e for e in xs if e.get("cat") == "user_annotation"]
    runs = sorted((e for e in ann if e["name"] == "scheduler.run_batch"), key=lambda e: e["ts"])
    steps = [e for e in ann if e["name"].startswith(("step[VERIFY", "step[DECODE"))]
    decode_runs = [r for r in runs if any(r["ts"] <= s["ts"] <= r["ts"] + r["dur"] for s in steps)]
    starts = [r["ts"] for r in decode_runs]
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("cat") in GPU]
    launches = [e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in LAUNCH]
    rows = []
    for i in range(1, len(starts) - 1):  # steady state: drop the first and the last step
        lo, hi = starts[i], starts[i + 1]
        ln = [e for e in launches if lo <= e["ts"] < hi]
        busy = _union(gpu, lo, hi)
        rows.append(
            {
                "wall_ms": (hi - lo) / 1e3,
                "gpu_busy_ms": busy / 1e3,
                "gpu_idle_ms": (hi - lo - busy) / 1e3,
                "launches": len(ln),
                "graphs": sum(e["name"] == "cudaGraphLaunch" for e in ln),
                "run_batch_ms": decode_runs[i]["dur"] / 1e3,
            }
        )
    if not rows:
        return {"steps": 0}
    out = {"steps": len(rows)}
    for k in rows[0]:
        out[k] = statistics.median(r[k] for r in rows)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true", help="one JSON object per trace instead of a table")
    args = ap.parse_args(argv)
    print("| trace | steps | wall ms | GPU busy ms | GPU idle ms | host launches | of which graph replays | run_batch ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in args.traces:
        s = step_stats(_load(p))
        if args.json:
            print(json.dumps({"trace": str(p), **s}))
            continue
        if not s["steps"]:
            print(f"| {p} | 0 | - | - | - | - | - | - |")
            continue
        print(
            f"| {p} | {s['steps']} | {s['wall_ms']:.2f} | {s['gpu_busy_ms']:.2f} | {s['gpu_idle_ms']:.2f} | "
            f"{s['launches']:.0f} | {s['graphs']:.0f} | {s['run_batch_ms']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
