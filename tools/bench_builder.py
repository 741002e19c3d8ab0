#!/usr/bin/env python3
"""Micro-benchmark of the DDTree tree builder (and the accept walk).

Times ``build_ddtree_tree_from_topk`` (batched, device-resident) against
``build_ddtree_tree_heap`` (the paper's per-request Python heap) over a grid of batch sizes x
budgets, with D = 15 (b16 drafters) and K = min(B, cap). On CUDA it also:

* captures builder + accept walk in one CUDA graph and times its replay (second column);
* runs one eager step under ``torch.cuda.set_sync_debug_mode("error")`` to prove that the
  builder and the walk never synchronize with the host;
* optionally (``--with-forward``) times one verify forward of a random-weight bf16
  Qwen3-8B-shaped decoder stack over the B + 1 tree tokens (tree mask + a KV context), and
  expresses the builder's cost as a percentage of it.

Self-contained: needs only torch, plus a directory holding ``sglang/srt/speculative/ddtree_utils.py``
(``--src DIR``; imported by file path). Without ``--src`` it uses the repo's patch series through
``ddtree_deploy.overlay.import_patched`` when that package is importable, else a plain
``import sglang.srt.speculative.ddtree_utils``.

    python tools/bench_builder.py --quick                      # CPU, seconds
    python tools/bench_builder.py --threads 1 --repeats 7      # CPU grid (1 thread: steadier)
    python tools/bench_builder.py --device cuda --with-forward --layers 36 \
        --src /path/to/build --out bench.md --json bench.json

Writes a markdown table (machine, date, torch version, device name first) to ``--out``
(default stdout) and the raw numbers to ``--json`` (default: ``--out`` with ``.json``, or
``bench_builder.json`` in the current directory).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import importlib.util
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

REL = Path("sglang/srt/speculative/ddtree_utils.py")


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
        from ddtree_deploy.overlay import import_patched  # the repo's series

        mod = import_patched("sglang.srt.speculative.ddtree_utils")
        return mod, mod.__file__
    except ImportError:
        pass
    mod = importlib.import_module("sglang.srt.speculative.ddtree_utils")
    return mod, mod.__file__


# ------------------------------------------------------------------------------------------
# Timing helpers
# ------------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    """Median wall time of ``fn`` in ms (device-synchronized before and after each call)."""
    for _ in range(warmup):
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


def synthetic_inputs(du, bs: int, depth: int, k: int, device: torch.device, seed: int, vocab: int = 4096):
    """Random per-request, per-depth top-k (full-vocab log-probs, sorted) on ``device``."""
    g = torch.Generator().manual_seed(seed)
    temp = torch.rand((bs, depth, 1), generator=g) * 3.0 + 0.5
    logits = torch.randn((bs, depth, vocab), generator=g) * temp
    ids, lps = du.topk_logprobs_from_logits(logits, k)
    roots = torch.randint(0, vocab, (bs,), generator=g)
    starts = torch.randint(0, 8192, (bs,), generator=g)
    return [t.to(device) for t in (ids, lps, roots, starts)]


# ------------------------------------------------------------------------------------------
# A random-weight, Qwen3-8B-shaped verify forward (pure torch)
# ------------------------------------------------------------------------------------------

QWEN3_8B = dict(hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, layers=36)


class RandomDecoderStack:
    """``layers`` random bf16 Qwen3-style decoder layers (GQA attention with q/k norm, SwiGLU MLP).

    Not a model: the weights are random; only the shapes and the work of one verify forward
    are real (the attention sees a KV context of ``context`` tokens plus the tree under its
    ancestor mask).
    """

    def __init__(self, layers: int, device: torch.device, dtype=torch.bfloat16, cfg=QWEN3_8B, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        h, i, nh, nkv, hd = cfg["hidden"], cfg["intermediate"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        self.cfg, self.device, self.dtype = cfg, device, dtype

        def w(rows, cols):
            return (torch.randn((rows, cols), generator=g, device=device) * (1.0 / math.sqrt(cols))).to(dtype)

        self.layers = []
        for _ in range(layers):
            self.layers.append(dict(
                qkv=w((nh + 2 * nkv) * hd, h), o=w(h, nh * hd), gate_up=w(2 * i, h), down=w(h, i),
                ln1=torch.ones(h, device=device, dtype=dtype), ln2=torch.ones(h, device=device, dtype=dtype),
                qn=torch.ones(hd, device=device, dtype=dtype), kn=torch.ones(hd, device=device, dtype=dtype),
            ))

    @staticmethod
    def _rms(x, w, eps=1e-6):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def make_context(self, bs: int, context: int, seed: int = 1):
        nkv, hd = self.cfg["kv_heads"], self.cfg["head_dim"]
        g = torch.Generator(device=self.device).manual_seed(seed)
        shape = (bs, nkv, context, hd)
        return [
            (torch.randn(shape, generator=g, device=self.device).to(self.dtype),
             torch.randn(shape, generator=g, device=self.device).to(self.dtype))
            for _ in self.layers
        ]

    def forward(self, x: torch.Tensor, tree_mask: torch.Tensor, kv_context) -> torch.Tensor:
        """x [bs, T, hidden] (T = B + 1 tree tokens); tree_mask bool [bs, T, T]."""
        bs, t, h = x.shape
        nh, nkv, hd = self.cfg["heads"], self.cfg["kv_heads"], self.cfg["head_dim"]
        ctx = kv_context[0][0].shape[2]
        mask = torch.cat([torch.ones((bs, t, ctx), dtype=torch.bool, device=x.device), tree_mask], dim=2)
        mask = mask.unsqueeze(1)  # [bs, 1, T, ctx + T]
        for layer, (kc, vc) in zip(self.layers, kv_context):
            y = self._rms(x, layer["ln1"])
            qkv = y @ layer["qkv"].t()
            q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = self._rms(q.view(bs, t, nh, hd), layer["qn"]).transpose(1, 2)
            k = self._rms(k.view(bs, t, nkv, hd), layer["kn"]).transpose(1, 2)
            v = v.view(bs, t, nkv, hd).transpose(1, 2)
            k = torch.cat([kc, k], dim=2).repeat_interleave(nh // nkv, dim=1)
            v = torch.cat([vc, v], dim=2).repeat_interleave(nh // nkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + a.transpose(1, 2).reshape(bs, t, nh * hd) @ layer["o"].t()
            y = self._rms(x, layer["ln2"])
            gate, up = (y @ layer["gate_up"].t()).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"].t()
        return x


# ------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------


def bench_cell(du, device, bs, budget, depth, cap, args, stack=None) -> Dict[str, object]:
    k = min(budget, cap)
    ids, lps, roots, starts = synthetic_inputs(du, bs, depth, k, device, seed=bs * 100003 + budget)
    n = du.ddtree_num_nodes(depth, k, budget) + 1
    row: Dict[str, object] = {"batch": bs, "budget": budget, "depth": depth, "k": k, "nodes": n - 1}

    def build():
        return du.build_ddtree_tree_from_topk(ids, lps, roots, starts, budget)

    tree = build()
    targets = tree.draft_tokens.roll(-1, dims=1).contiguous()  # follows the first chain a bit

    def step():
        t = du.build_ddtree_tree_from_topk(ids, lps, roots, starts, budget)
        return du.ddtree_accept(t, targets)

    row["build_ms"] = time_ms(build, device, args.repeats, args.warmup)
    row["walk_ms"] = time_ms(lambda: du.ddtree_accept(tree, targets), device, args.repeats, args.warmup)
    row["step_ms"] = time_ms(step, device, args.repeats, args.warmup)

    if not args.no_heap and bs * budget <= args.heap_max:
        cpu_args = [t.cpu() for t in (ids, lps, roots, starts)]
        row["heap_ms"] = time_ms(lambda: du.build_ddtree_tree_heap(*cpu_args, budget), torch.device("cpu"),
                                 max(1, min(args.repeats, 3)), 0)
        heap = du.build_ddtree_tree_heap(*cpu_args, budget)
        row["matches_heap"] = all(torch.equal(a.cpu(), b) for a, b in zip(tree, heap))
    else:
        row["heap_ms"] = None
        row["matches_heap"] = None

    if device.type == "cuda":
        # Zero host syncs: one eager step with sync debugging set to raise.
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
            row["sync_free"] = True
        except RuntimeError as exc:
            row["sync_free"] = False
            row["sync_error"] = str(exc).splitlines()[0]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        # CUDA graph of builder + walk.
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_acc = step()
            graph.replay()
            torch.cuda.synchronize()
            eager_acc = step()
            row["graph_matches_eager"] = all(torch.equal(a, b) for a, b in zip(static_acc, eager_acc))
            row["graph_step_ms"] = time_ms(graph.replay, device, args.repeats, args.warmup)
            del graph
        except Exception as exc:  # report, do not abort the grid
            row["graph_step_ms"] = None
            row["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    if stack is not None:
        h = stack.cfg["hidden"]
        x = torch.randn((bs, n, h), device=device, dtype=stack.dtype)
        kv = stack.make_context(bs, args.context)
        with torch.no_grad():
            fwd = time_ms(lambda: stack.forward(x, tree.tree_mask, kv), device, max(1, args.repeats // 2), 1)
        scale = QWEN3_8B["layers"] / len(stack.layers)
        row["forward_ms_measured"] = fwd
        row["forward_layers"] = len(stack.layers)
        row["forward_ms_36l"] = fwd * scale
        row["step_pct_of_forward"] = 100.0 * row["step_ms"] / row["forward_ms_36l"]
        if row.get("graph_step_ms"):
            row["graph_step_pct_of_forward"] = 100.0 * row["graph_step_ms"] / row["forward_ms_36l"]
        del kv, x
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


def markdown(info: Dict[str, object], rows: List[Dict[str, object]], args) -> str:
    out = ["# DDTree builder micro-benchmark", ""]
    for key in ("date_utc", "host", "device", "device_name", "cpu", "cpu_threads", "torch", "cuda", "python", "platform"):
        if key in info:
            out.append(f"- {key}: {info[key]}")
    out.append(f"- module: {info.get('module')}")
    out.append(f"- settings: depth={args.depth}, K=min(B, {args.topk_cap}), repeats={args.repeats} (median), "
               f"warmup={args.warmup}" + (f", forward context={args.context}" if args.with_forward else ""))
    out.append("")
    cuda = info["device"].startswith("cuda")
    cols = ["batch", "B", "K", "build ms", "walk ms", "build+walk ms"]
    if cuda:
        cols += ["graph build+walk ms", "sync-free"]
    cols += ["heap ms (CPU)", "heap / build", "= heap"]
    if args.with_forward:
        cols += ["fwd ms (36 L)", "build+walk % fwd"] + (["graph % fwd"] if cuda else [])
    out.append("| " + " | ".join(cols) + " |")
    out.append("|" + "---|" * len(cols))
    for r in rows:
        ratio = (r["heap_ms"] / r["build_ms"]) if r.get("heap_ms") and r["build_ms"] else None
        cells = [r["batch"], r["budget"], r["k"], fmt(r["build_ms"]), fmt(r["walk_ms"]), fmt(r["step_ms"])]
        if cuda:
            cells += [fmt(r.get("graph_step_ms")), fmt(r.get("sync_free"))]
        cells += [fmt(r.get("heap_ms"), 2), fmt(ratio, 1) + ("x" if ratio else ""), fmt(r.get("matches_heap"))]
        if args.with_forward:
            cells += [fmt(r.get("forward_ms_36l"), 2), fmt(r.get("step_pct_of_forward"), 2)]
            if cuda:
                cells += [fmt(r.get("graph_step_pct_of_forward"), 2)]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    notes = [r for r in rows if r.get("graph_error") or r.get("sync_error")]
    for r in notes:
        out.append(f"\n- batch={r['batch']} B={r['budget']}: {r.get('graph_error') or ''} {r.get('sync_error') or ''}")
    if args.with_forward:
        out.append(f"\nForward: random-weight bf16 Qwen3-8B-shaped stack, {rows[0].get('forward_layers')} layer(s) "
                   "measured, scaled to 36; tokens = batch x (B + 1), ancestor mask + KV context.")
    return "\n".join(out) + "\n"


def parse_list(s: str) -> List[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--src", default=None, help="dir containing sglang/srt/speculative/ddtree_utils.py")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--budgets", default="16,32,64,128,256,512")
    p.add_argument("--depth", type=int, default=15)
    p.add_argument("--topk-cap", type=int, default=8, help="K = min(B, cap)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--heap-max", type=int, default=64 * 512, help="skip the heap when batch*B exceeds this")
    p.add_argument("--no-heap", action="store_true")
    p.add_argument("--with-forward", action="store_true", help="also time a random-weight Qwen3-8B-shaped verify forward")
    p.add_argument("--layers", type=int, default=2, help="decoder layers to instantiate for --with-forward (36 = full)")
    p.add_argument("--context", type=int, default=1024, help="KV context tokens for --with-forward")
    p.add_argument("--quick", action="store_true", help="tiny grid for a fast CPU check")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", default=None, help="markdown output (default stdout)")
    p.add_argument("--json", dest="json_out", default=None, help="JSON output path")
    args = p.parse_args(argv)

    if args.quick:
        args.batches, args.budgets = "1,8", "16,64"
        args.repeats, args.warmup = min(args.repeats, 3), min(args.warmup, 1)
        args.layers, args.context = min(args.layers, 1), min(args.context, 128)
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
    stack = RandomDecoderStack(args.layers, device) if args.with_forward else None

    rows = []
    for bs in parse_list(args.batches):
        for budget in parse_list(args.budgets):
            row = bench_cell(du, device, bs, budget, args.depth, args.topk_cap, args, stack)
            rows.append(row)
            print(f"[bench_builder] batch={bs} B={budget} build={row['build_ms']:.3f}ms "
                  f"heap={fmt(row.get('heap_ms'), 2)}ms graph={fmt(row.get('graph_step_ms'))}ms", file=sys.stderr)
    text = markdown(info, rows, args)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    json_path = args.json_out or (str(Path(args.out).with_suffix(".json")) if args.out else "bench_builder.json")
    Path(json_path).write_text(json.dumps({"machine": info, "args": vars(args), "rows": rows}, indent=2) + "\n")
    print(f"[bench_builder] wrote {args.out or 'stdout'} and {json_path}", file=sys.stderr)
    bad = [r for r in rows if r.get("matches_heap") is False or r.get("sync_free") is False
           or r.get("graph_matches_eager") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
