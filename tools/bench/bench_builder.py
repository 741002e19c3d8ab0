#!/usr/bin/env python3
"""Micro-benchmark of the DDTree tree builder: ours (Triton kernel, torch) vs UNO vs the reference heap.

Everything is timed in ONE run on one machine, side by side (issue 11, item 3):

* **ours, kernel**: ``build_ddtree_tree_from_topk`` dispatching to the fused Triton kernels of
  ``ddtree_tree_kernel.py`` (patch ddtree-tree-builder), eager and replayed from a CUDA graph; from logits it
  is ``topk_logprobs_from_logits`` (the fused top-K + log-normalizer kernels) + the builder;
* **ours, torch**: the same API with ``SGLANG_DDTREE_TREE_KERNEL=0`` (the torch builder, and
  ``log_softmax`` + ``torch.topk``), eager and graphed;
* **UNO**: SGLang 0.5.23's own in-tree builder ``build_uno_tree_proposal``
  (``sglang/kernels/ops/speculative/uno_tree.py``, loaded unmodified from the verified snapshot by
  ``--uno FILE``) from logits, under a CUDA graph. Its ``flashinfer.top_k`` import is stood in
  by ``torch.topk`` (flashinfer is not installed on the benchmark machine); UNO's tree kernel and
  its split-vocabulary log-sum-exp kernels are UNO's own. UNO runs only where it allows
  (Q <= 128 nodes incl. the root, Q * K <= 2048); we compare ours at the same verify width
  (B = Q - 1 draft nodes + the root);
* **reference heap**: the DDTree reference's per-request builder re-implemented in its style
  (liranringel/ddtree ``build_ddtree_tree`` + ``compile_ddtree_tree``): GPU ``topk`` with
  K = B and ``logsumexp``, copy to the host, Python ``heapq`` best-first, the visibility mask
  row by row in numpy, upload of tokens, positions and mask;
* **GEMM lower bound**: the matrix multiplies alone of one Qwen3-8B verify forward (36 layers
  of qkv, o, gate/up, down projections and the lm_head, bf16, random weights) over
  bs x (B + 1) tokens, graphed: what the step costs at least, to put the builder in proportion.

GPU times are CUDA-event times per call, averaged over a batch of back-to-back calls, median
of ``--repeats`` batches; the heap's are host wall times (it synchronizes by design).
Every kernel tree is also compared with the torch builder's (bit for bit), and one eager
kernel step runs under ``torch.cuda.set_sync_debug_mode("error")``.

    python tools/bench/bench_builder.py --quick                         # CPU smoke (torch path)
    python tools/bench/bench_builder.py --device cuda --src .gpu/src --uno .gpu/src/sglang/kernels/ops/speculative/uno_tree.py \
        --out bench/builder-h200.md --json bench/builder-h200.json --plot bench/builder-h200.png

Writes a markdown table (machine first) to ``--out``, raw numbers to ``--json`` and a plot of
time vs B per batch size to ``--plot`` (matplotlib, when importable).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import heapq
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

REL = Path("sglang/srt/speculative/ddtree_utils.py")
KERNEL_ENV = "SGLANG_DDTREE_TREE_KERNEL"


# ------------------------------------------------------------------------------------------
# Loading the module under test
# ------------------------------------------------------------------------------------------


def load_ddtree_utils(src: Optional[str]):
    """The ddtree_utils module: from ``--src DIR`` by file path, else the series, else sglang."""
    if src:
        path = Path(src) / REL
        if not path.is_file():
            path = Path(src)
            if not (path.is_file() and path.name == "ddtree_utils.py"):
                raise SystemExit(f"--src: no {REL} under {src}")
        spec = importlib.util.spec_from_file_location("ddtree_utils_bench", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod, str(path)
    try:
        from ddtree_deploy.build.overlay import import_patched  # the repo's series

        mod = import_patched("sglang.srt.speculative.ddtree_utils")
        return mod, mod.__file__
    except ImportError:
        pass
    mod = importlib.import_module("sglang.srt.speculative.ddtree_utils")
    return mod, mod.__file__


def load_uno(path: str):
    """UNO's ``uno_tree.py`` (unmodified, from the verified snapshot) with flashinfer stood in.

    ``flashinfer.top_k(x, k, sorted=True, deterministic=False)`` -> ``torch.topk`` (values,
    indices): the only flashinfer call of the file (``uno_tree.py:530``); it selects the same
    top-K values (ties aside), so UNO's own kernels see the same inputs.
    """
    stub = types.ModuleType("flashinfer")

    def top_k(x, k, sorted=True, deterministic=False):  # noqa: A002 - flashinfer's signature
        res = torch.topk(x, k, dim=-1, largest=True, sorted=True)
        return res.values, res.indices

    stub.top_k = top_k
    saved = sys.modules.get("flashinfer")
    sys.modules["flashinfer"] = stub
    try:
        spec = importlib.util.spec_from_file_location("uno_tree_bench", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up while the class is built
        spec.loader.exec_module(mod)
    finally:
        if saved is None:
            sys.modules.pop("flashinfer", None)
        else:
            sys.modules["flashinfer"] = saved
    return mod


# ------------------------------------------------------------------------------------------
# Timing helpers
# ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def backend(kind: str):
    """``kernel``: the default dispatch; ``torch``: SGLANG_DDTREE_TREE_KERNEL=0."""
    old = os.environ.get(KERNEL_ENV)
    if kind == "torch":
        os.environ[KERNEL_ENV] = "0"
    else:
        os.environ.pop(KERNEL_ENV, None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(KERNEL_ENV, None)
        else:
            os.environ[KERNEL_ENV] = old


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, repeats: int, inner: int = 10) -> float:
    """Median over ``repeats`` batches of ``inner`` back-to-back calls of the per-call time, ms."""
    for _ in range(2):
        fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(samples)


def wall_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def graphed(fn: Callable[[], object]):
    """Capture ``fn`` (warmed up on a side stream) in a CUDA graph: (replay, captured output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, out


# ------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------


def drafter_logits(bs: int, depth: int, vocab: int, device: torch.device, seed: int, dtype=torch.bfloat16):
    """Drafter-like logits [bs, depth, vocab]: Zipf-shaped (logit of rank r ~ -1.8 log r) plus
    noise, tokens permuted per row, so the top-K is peaked as a real drafter's is."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    log_rank = torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    noise = torch.randn((bs, depth, vocab), generator=g)
    base = (-1.8 * log_rank)[None, None, :] + 0.3 * noise
    perm = torch.argsort(torch.rand((bs * depth, vocab), generator=g), dim=-1).reshape(bs, depth, vocab)
    logits = torch.empty_like(base).scatter_(-1, perm, base)
    return logits.to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------------------
# The DDTree reference's builder, in its style (per request, host heap)
# ------------------------------------------------------------------------------------------


def reference_style_build(logits: torch.Tensor, root: torch.Tensor, start: torch.Tensor, budget: int):
    """One request: logits [D, V] on the device -> (tokens, positions, mask) on the device.

    After liranringel/ddtree ``build_ddtree_tree`` + ``compile_ddtree_tree`` (our code, same steps).
    """
    import numpy as np

    device = logits.device
    depth_limit = logits.shape[0]
    topk = min(budget, logits.shape[-1])
    lf = logits.float()
    top_logits, top_ids = torch.topk(lf, k=topk, dim=-1)
    log_z = torch.logsumexp(lf, dim=-1, keepdim=True)
    lp = (top_logits - log_z).to("cpu", torch.float32).numpy()
    ids = top_ids.to("cpu", torch.long).numpy()
    heap = [(-float(lp[0, 0]), (0,), 0, 1, 0, float(lp[0, 0]))]
    toks = np.empty(budget, dtype=np.int64)
    deps = np.empty(budget, dtype=np.int64)
    parents = np.empty(budget + 1, dtype=np.int32)
    parents[0] = -1
    count = 0
    while heap and count < budget:
        _, ranks, parent, depth, rank, logw = heapq.heappop(heap)
        cur = count + 1
        toks[count] = ids[depth - 1, rank]
        deps[count] = depth
        parents[cur] = parent
        count += 1
        if rank + 1 < topk:
            sw = logw - float(lp[depth - 1, rank]) + float(lp[depth - 1, rank + 1])
            heapq.heappush(heap, (-sw, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, sw))
        if depth < depth_limit:
            cw = logw + float(lp[depth, 0])
            heapq.heappush(heap, (-cw, ranks + (0,), cur, depth + 1, 0, cw))
    n = count + 1
    vis = np.zeros((n, n), dtype=np.bool_)
    vis[0, 0] = True
    for i in range(1, n):
        p = int(parents[i])
        vis[i, :i] = vis[p, :i]
        vis[i, i] = True
    tokens = torch.empty(n, dtype=torch.long, device=device)
    tokens[0] = root
    tokens[1:].copy_(torch.from_numpy(toks[:count]))
    pos = torch.from_numpy(deps[:count]).to(device) + start
    mask = torch.from_numpy(vis).to(device)
    return tokens, pos, mask


# ------------------------------------------------------------------------------------------
# GEMM lower bound of a Qwen3-8B verify forward
# ------------------------------------------------------------------------------------------

QWEN3_8B = dict(hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, layers=36, vocab=151936)


class GemmBound:
    """The GEMMs of one Qwen3-8B forward (random bf16 weights, 36 distinct layers + lm_head)."""

    def __init__(self, device, layers: int = 36, cfg=QWEN3_8B):
        h, i = cfg["hidden"], cfg["intermediate"]
        qkv = (cfg["heads"] + 2 * cfg["kv_heads"]) * cfg["head_dim"]
        mk = lambda r, c: torch.randn((r, c), device=device, dtype=torch.bfloat16) * 0.02  # noqa: E731
        self.layers = [(mk(qkv, h), mk(h, cfg["heads"] * cfg["head_dim"]), mk(2 * i, h), mk(h, i)) for _ in range(layers)]
        self.lm_head = mk(cfg["vocab"], h)
        self.cfg = cfg

    def forward(self, x):
        h = self.cfg["hidden"]
        nq = self.cfg["heads"] * self.cfg["head_dim"]
        for w_qkv, w_o, w_gu, w_d in self.layers:
            q = x @ w_qkv.t()
            x = q[:, :nq] @ w_o.t()
            gu = x @ w_gu.t()
            x = gu[:, : w_d.shape[1]] @ w_d.t()
        return x[:, :h] @ self.lm_head.t()


# ------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------

FIELDS = (
    "draft_tokens",
    "parents",
    "depths",
    "positions",
    "tree_mask",
    "retrive_index",
    "retrive_next_token",
    "retrive_next_sibling",
    "node_logprobs",
    "ranks",
)


def same_tree(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def bench_uno(du, uno, device, bs, q, k, args) -> Dict[str, object]:
    depth, vocab = args.depth, args.vocab
    logits = drafter_logits(bs, depth, vocab, device, seed=bs * 7919 + q)
    roots = torch.randint(0, vocab, (bs,), device=device)
    starts = torch.zeros(bs, dtype=torch.int64, device=device)
    row: Dict[str, object] = {"batch": bs, "Q": q, "budget": q - 1, "k": k}
    ws: dict = {}

    def run_uno():
        return uno.build_uno_tree_proposal(roots, logits, max_nodes=q, candidate_top_k=k, temperature=1.0, workspace=ws)

    def ours():
        ids, lps = du.topk_logprobs_from_logits(logits, k)
        return du.build_ddtree_tree_from_topk(ids, lps, roots, starts, q - 1)

    try:
        g_uno, out_uno = graphed(run_uno)
        row["uno_graph_ms"] = time_ms(g_uno.replay, device, args.repeats)
        uno_tokens = torch.sort(out_uno.draft_tokens, dim=1).values.clone()
        del g_uno
    except Exception as exc:  # noqa: BLE001 - report, do not abort the grid
        row["uno_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        uno_tokens = None
    for kind in ("kernel", "torch"):
        with backend(kind):
            try:
                g, out = graphed(ours)
                row[f"{kind}_logits_graph_ms"] = time_ms(g.replay, device, args.repeats)
                if kind == "kernel" and uno_tokens is not None:
                    mine = torch.sort(out.draft_tokens[:, 1:], dim=1).values
                    row["same_token_multiset_as_uno"] = bool(torch.equal(mine, uno_tokens))
                del g
            except Exception as exc:  # noqa: BLE001
                row[f"{kind}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if row.get("uno_graph_ms") and row.get("kernel_logits_graph_ms"):
        row["kernel_vs_uno"] = row["kernel_logits_graph_ms"] / row["uno_graph_ms"]
    return row


def bench_budget(du, device, bs, budget, args, gemm=None) -> Dict[str, object]:
    depth, vocab = args.depth, args.vocab
    k = min(budget, args.topk_cap)
    logits = drafter_logits(bs, depth, vocab, device, seed=bs * 100003 + budget)
    roots = torch.randint(0, vocab, (bs,), device=device)
    starts = torch.randint(0, 8192, (bs,), device=device)
    with backend("torch"):
        ids, lps = du.topk_logprobs_from_logits(logits, k)
    row: Dict[str, object] = {"batch": bs, "budget": budget, "k": k, "depth": depth}

    def build():
        return du.build_ddtree_tree_from_topk(ids, lps, roots, starts, budget)

    def from_logits():
        i, lp = du.topk_logprobs_from_logits(logits, k)
        return du.build_ddtree_tree_from_topk(i, lp, roots, starts, budget)

    trees = {}
    for kind in ("kernel", "torch"):
        with backend(kind):
            trees[kind] = build()
            row[f"{kind}_backend"] = du.tree_builder_backend(device) if hasattr(du, "tree_builder_backend") else "torch"
            row[f"{kind}_eager_ms"] = time_ms(build, device, args.repeats, inner=3 if kind == "torch" else 10)
            if device.type == "cuda":
                for label, fn in (("topk", build), ("logits", from_logits)):
                    try:
                        g, _ = graphed(fn)
                        row[f"{kind}_{label}_graph_ms"] = time_ms(g.replay, device, args.repeats)
                        del g
                    except Exception as exc:  # noqa: BLE001
                        row[f"{kind}_{label}_graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    row["kernel_equals_torch"] = same_tree(trees["kernel"], trees["torch"])
    if device.type == "cuda":
        with backend("kernel"):
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                from_logits()
                row["sync_free"] = True
            except RuntimeError as exc:
                row["sync_free"] = False
                row["sync_error"] = str(exc).splitlines()[0]
            finally:
                torch.cuda.set_sync_debug_mode("default")
    if not args.no_heap and bs * budget <= args.heap_max:

        def ref():
            for b in range(bs):
                reference_style_build(logits[b], roots[b], starts[b], budget)

        row["heap_ref_ms"] = wall_ms(ref, device, max(1, min(args.repeats, 5)))
    if gemm is not None and bs * (budget + 1) <= args.gemm_max_tokens:
        x = torch.randn((bs * (budget + 1), QWEN3_8B["hidden"]), device=device, dtype=torch.bfloat16)
        try:
            g, _ = graphed(lambda: gemm.forward(x))
            row["gemm_ms"] = time_ms(g.replay, device, max(3, args.repeats // 2), inner=2)
            del g
        except Exception as exc:  # noqa: BLE001
            row["gemm_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        del x
    for key in ("kernel_topk_graph_ms", "kernel_logits_graph_ms"):
        if row.get(key) and row.get("gemm_ms"):
            row[key.replace("_ms", "_pct_gemm")] = 100.0 * row[key] / row["gemm_ms"]
    if row.get("heap_ref_ms") and row.get("kernel_logits_graph_ms"):
        row["heap_ref_over_kernel"] = row["heap_ref_ms"] / row["kernel_logits_graph_ms"]
    return row


def machine_info(device: torch.device) -> Dict[str, object]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_threads": torch.get_num_threads(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "torch": torch.__version__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        info["cuda"] = torch.version.cuda
    return info


def fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def us(x):
    return "-" if x is None else f"{1000.0 * x:.1f}"


def markdown(info, uno_rows, rows, args) -> str:
    out = ["# DDTree tree builder: ours (Triton kernel / torch) vs UNO vs the reference heap", ""]
    for key in (
        "date_utc",
        "host",
        "device",
        "device_name",
        "cpu",
        "cpu_threads",
        "torch",
        "triton",
        "cuda",
        "python",
        "platform",
    ):
        if key in info:
            out.append(f"- {key}: {info[key]}")
    out.append(f"- module: {info.get('module')}; UNO: {info.get('uno') or 'not run'}")
    out.append(
        f"- settings: depth D={args.depth}, vocab V={args.vocab} (bf16 drafter-like logits), "
        f"repeats={args.repeats} (median of batches of back-to-back calls, CUDA events)"
    )
    out.append(
        "- UNO's `flashinfer.top_k` is stood in by `torch.topk` (flashinfer is not installed here); "
        "UNO's log-sum-exp and tree kernels are its own. Times in microseconds unless marked ms."
    )
    out.append("")
    if uno_rows:
        out += [
            "## From drafter logits to a tree, where UNO runs (CUDA graph replay, us)",
            "",
            "Ours at the same verify width (B = Q - 1 draft nodes + the root); ours also writes the "
            "ancestor mask and the retrieve arrays, UNO does not.",
            "",
            "| batch | Q | K | UNO | ours kernel | ours torch | kernel / UNO | target <= 0.5 | same token multiset |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in uno_rows:
            ratio = r.get("kernel_vs_uno")
            out.append(
                f"| {r['batch']} | {r['Q']} | {r['k']} | {us(r.get('uno_graph_ms'))} | "
                f"{us(r.get('kernel_logits_graph_ms'))} | {us(r.get('torch_logits_graph_ms'))} | "
                f"{fmt(ratio, 2)} | {'met' if ratio is not None and ratio <= 0.5 else 'NOT met' if ratio else '-'} | "
                f"{fmt(r.get('same_token_multiset_as_uno'))} |"
            )
        errs = [r for r in uno_rows if any(k.endswith("error") for k in r)]
        for r in errs:
            out.append(
                f"\n- batch={r['batch']} Q={r['Q']}: " + "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("error"))
            )
        out.append("")
    out += [
        "## Budget sweep (K = min(B, %d); us)" % args.topk_cap,
        "",
        "topk: from per-depth top-K inputs; logits: from [bs, D, V] logits. eager = Python call; "
        "graph = CUDA graph replay. heap ref = the DDTree reference's per-request host heap "
        "(host wall time, all requests). GEMM = matmuls of one Qwen3-8B verify forward over bs x (B + 1) tokens (ms).",
        "",
        "| batch | B | K | kernel eager | kernel graph (topk) | kernel graph (logits) | torch eager | torch graph (topk) | "
        "torch graph (logits) | heap ref | heap ref / kernel | GEMM ms | kernel logits % GEMM | = torch | sync-free |",
        "|" + "---|" * 15,
    ]
    for r in rows:
        out.append(
            "| "
            + " | ".join(
                str(c)
                for c in [
                    r["batch"],
                    r["budget"],
                    r["k"],
                    us(r.get("kernel_eager_ms")),
                    us(r.get("kernel_topk_graph_ms")),
                    us(r.get("kernel_logits_graph_ms")),
                    us(r.get("torch_eager_ms")),
                    us(r.get("torch_topk_graph_ms")),
                    us(r.get("torch_logits_graph_ms")),
                    us(r.get("heap_ref_ms")),
                    (fmt(r.get("heap_ref_over_kernel"), 1) + "x") if r.get("heap_ref_over_kernel") else "-",
                    fmt(r.get("gemm_ms"), 2),
                    fmt(r.get("kernel_logits_graph_pct_gemm"), 2),
                    fmt(r.get("kernel_equals_torch")),
                    fmt(r.get("sync_free")),
                ]
            )
            + " |"
        )
    errs = [r for r in rows if any(k.endswith("error") for k in r)]
    for r in errs:
        out.append(
            f"\n- batch={r['batch']} B={r['budget']}: " + "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("error"))
        )
    return "\n".join(out) + "\n"


def plot(rows, path: str, info) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not importable"
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    series = (
        ("kernel_logits_graph_ms", "ours kernel, logits, graph"),
        ("kernel_topk_graph_ms", "ours kernel, top-K, graph"),
        ("torch_logits_graph_ms", "ours torch, logits, graph"),
        ("heap_ref_ms", "reference heap (host)"),
        ("gemm_ms", "GEMM bound (verify fwd)"),
    )
    for ax, bs in zip(axes[0], batches):
        rs = [r for r in rows if r["batch"] == bs]
        for key, label in series:
            pts = [(r["budget"], 1000.0 * r[key]) for r in rs if r.get(key)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("budget B")
        ax.set_ylabel("time per step (us)")
        ax.set_title(f"batch {bs}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"DDTree tree builder vs B ({info.get('device_name')}, {info.get('date_utc')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def parse_list(s: str) -> List[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--src", default=None, help="dir containing sglang/srt/speculative/ddtree_utils.py")
    p.add_argument("--uno", default=None, help="SGLang's uno_tree.py (from the verified snapshot)")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--budgets", default="16,32,64,128,256,512,1024")
    p.add_argument("--uno-grid", default="31:8,63:8,127:16", help="Q:K pairs for the UNO comparison")
    p.add_argument("--depth", type=int, default=15)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--topk-cap", type=int, default=32, help="K = min(B, cap) in the budget sweep")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--heap-max", type=int, default=8 * 512, help="skip the reference heap when batch*B exceeds this")
    p.add_argument("--no-heap", action="store_true")
    p.add_argument("--no-gemm", action="store_true")
    p.add_argument("--gemm-max-tokens", type=int, default=40000)
    p.add_argument("--quick", action="store_true", help="tiny grid for a fast CPU check")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", default=None, help="markdown output (default stdout)")
    p.add_argument("--json", dest="json_out", default=None, help="JSON output path")
    p.add_argument("--plot", default=None, help="PNG plot of time vs B per batch size")
    p.add_argument("--replot", default=None, help="only redraw --plot (and --out) from this JSON of an earlier run")
    args = p.parse_args(argv)
    if args.replot:
        data = json.loads(Path(args.replot).read_text())
        if args.plot:
            err = plot(data["rows"], args.plot, data["machine"])
            if err:
                raise SystemExit(f"error: no plot: {err}")
        if args.out:
            saved = argparse.Namespace(**data["args"])
            Path(args.out).write_text(markdown(data["machine"], data["uno_rows"], data["rows"], saved))
        return 0

    if args.quick:
        args.batches, args.budgets, args.vocab = "1,2", "16,64", 2048
        args.repeats = min(args.repeats, 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    device = torch.device(name)

    du, module_path = load_ddtree_utils(args.src)
    info = machine_info(device)
    info["module"] = module_path
    uno = None
    if args.uno and device.type == "cuda":
        uno = load_uno(args.uno)
        info["uno"] = args.uno
    results = {"machine": info, "args": vars(args), "uno_rows": [], "rows": []}
    json_path = args.json_out or (str(Path(args.out).with_suffix(".json")) if args.out else "bench_builder.json")

    def dump():
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")

    if uno is not None:
        for bs in parse_list(args.batches):
            for qk in args.uno_grid.split(","):
                q, k = (int(x) for x in qk.split(":"))
                row = bench_uno(du, uno, device, bs, q, k, args)
                results["uno_rows"].append(row)
                dump()
                print(
                    f"[bench_builder] uno batch={bs} Q={q} K={k} uno={us(row.get('uno_graph_ms'))}us "
                    f"kernel={us(row.get('kernel_logits_graph_ms'))}us",
                    file=sys.stderr,
                    flush=True,
                )
    gemm = GemmBound(device) if (device.type == "cuda" and not args.no_gemm) else None
    for bs in parse_list(args.batches):
        for budget in parse_list(args.budgets):
            row = bench_budget(du, device, bs, budget, args, gemm)
            results["rows"].append(row)
            dump()
            print(
                f"[bench_builder] batch={bs} B={budget} kernel graph topk={us(row.get('kernel_topk_graph_ms'))}us "
                f"logits={us(row.get('kernel_logits_graph_ms'))}us eager={us(row.get('kernel_eager_ms'))}us "
                f"heap={us(row.get('heap_ref_ms'))}us gemm={fmt(row.get('gemm_ms'), 2)}ms "
                f"=torch {row.get('kernel_equals_torch')}",
                file=sys.stderr,
                flush=True,
            )
    text = markdown(info, results["uno_rows"], results["rows"], args)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    dump()
    if args.plot:
        err = plot(results["rows"], args.plot, info)
        if err:
            print(f"[bench_builder] no plot: {err}", file=sys.stderr)
    print(f"[bench_builder] wrote {args.out or 'stdout'} and {json_path}", file=sys.stderr)
    bad = [
        r for r in results["rows"] + results["uno_rows"] if r.get("kernel_equals_torch") is False or r.get("sync_free") is False
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
