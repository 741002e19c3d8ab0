"""GPU correctness suite for the DDTree core, run on a lent H200 (or any CUDA machine).

Needs only torch and Triton. ``--src DIR`` is a directory holding a bare ``sglang/`` tree with our
``srt/speculative/ddtree_utils.py`` and ``ddtree_probe.py`` (as the series builds them) and the
pinned, unmodified ``kernels/ops/speculative/spec_tree.py``; ``make_gpu_bundle.py`` (this folder)
makes it. Run by ``tools/gpu_kernels/gpu_run.sh`` as ``PYTHONPATH=tools python3 tools/gpu_kernels/gpu_suite.py
--src .gpu/src``: ``sglang_kernels`` is this script's sibling (its folder is ``sys.path[0]``) and
``ddtree_offline`` (the heap oracle) comes from ``tools/`` on ``PYTHONPATH`` or from an installed checkout.

Checks, each printed as one line and collected into ``--json``:
0. the fused Triton kernel is the default of ``build_ddtree_tree_from_topk`` on CUDA;
1. the kernel (and the torch builder) on CUDA == the heap oracle (``ddtree_offline.heap_oracle``),
   every field, on hundreds of random, tie-heavy and all-equal cases, B up to 1024, K up to 64; the
   fused top-K + log-normalizer == a stable sort of ``log_softmax`` on [bs, 15, 151936] bf16 logits;
2. the probe (``python -m sglang.srt.speculative.ddtree_probe --device cuda``) exits 0;
3. SGLang's own compiled Triton greedy verify kernel accepts the same paths as ``ddtree_accept``;
4. no host sync inside top-K + build + accept (``torch.cuda.set_sync_debug_mode("error")``);
5. build + accept (the kernel) can be captured in a CUDA graph and replayed with identical results;
6. ``GraphedTreeBuilder`` (what the SGLang worker calls) equals the eager builder across shapes
   and evictions, and its per-call time is measured beside the eager builder's;
7. ``GraphedTreeBuilder.capture`` (the worker's start-up capture): padded replays == eager, a batch
   above the captured sizes is built eagerly, no call captures.
Exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path


def import_from_bare_tree(src: Path, module: str) -> types.ModuleType:
    """Import ``module`` (``sglang....``) from the bare ``SRC/sglang/`` tree (no ``__init__.py``, so
    nothing of SGLang runs) without adding ``SRC`` to ``sys.path``: ``sglang`` is bound to that one
    folder, as ``ddtree_deploy.build.overlay.import_patched`` does on a machine with the tool."""
    root = Path(src) / "sglang"
    if not root.is_dir():
        raise SystemExit(f"--src {src}: no sglang/ folder in it (tools/gpu_kernels/make_gpu_bundle.py makes one)")
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(root)]
    sys.modules["sglang"] = pkg
    return importlib.import_module(module)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    from sglang_kernels import SPEC_TREE, load_verify_tree_greedy, run_sglang_verify  # this script's sibling

    from ddtree_offline.heap_oracle import build_ddtree_tree_heap  # tools/ on PYTHONPATH (gpu_run.sh)

    du = import_from_bare_tree(args.src, "sglang.srt.speculative.ddtree_utils")

    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    results: dict[str, object] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    failures: list[str] = []

    def report(name: str, ok: bool, detail: str) -> None:
        results[name] = {"ok": ok, "detail": detail}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    def inputs(bs, D, K, V=1000, ties=False):
        logits = torch.randn(bs, D, V, generator=g) * 2.5
        if ties:
            logits = (logits * 2).round() / 2
        ids, lps = du.topk_logprobs_from_logits(logits.to(dev), K)
        if ties:
            lps = (lps * 4).round() / 4  # force many equal scores
        root = torch.randint(0, V, (bs,), generator=g).to(dev)
        start = torch.randint(0, 500, (bs,), generator=g).to(dev)
        return ids, lps, root, start

    # 0. the fused Triton kernel is what the public API runs on CUDA
    report(
        "kernel_is_default_on_cuda",
        du.tree_builder_backend(dev) == "triton",
        f"tree_builder_backend(cuda) = {du.tree_builder_backend(dev)!r}",
    )

    # 1. builder (kernel, and the torch builder) vs the heap oracle on CUDA, ties included
    t0 = time.time()
    n_cases, bad = 0, []
    fields = (
        "draft_tokens",
        "parents",
        "depths",
        "positions",
        "tree_mask",
        "retrive_index",
        "retrive_next_token",
        "retrive_next_sibling",
        "ranks",
    )
    configs = [
        (15, 8, 64),
        (15, 8, 256),
        (15, 32, 256),
        (15, 16, 128),
        (15, 64, 1024),
        (15, 32, 512),
        (5, 3, 300),
        (15, 1, 20),
        (2, 8, 8),
        (15, 4, 1),
        (7, 16, 100),
        (3, 64, 1024),
    ]
    modes = ("random", "ties", "flat")
    kmod = du._tree_kernel()
    for D, K, B in configs:
        for mode in modes:
            for rep in range(3 if B >= 512 else 8):
                bs = 1 + (rep * 5 + D) % (2 if B >= 512 else 8)
                ids, lps, root, start = inputs(bs, D, K, ties=(mode == "ties"))
                if mode == "flat":
                    lps = torch.full_like(lps, -2.0)  # every score ties: depth, then rank path decide
                ref = build_ddtree_tree_heap(ids.cpu(), lps.cpu(), root.cpu(), start.cpu(), B)
                fast = du.build_ddtree_tree_from_topk(ids, lps, root, start, B)
                for f in fields + ("node_logprobs",):
                    if not torch.equal(getattr(fast, f).cpu(), getattr(ref, f).cpu()):
                        bad.append(f"bs={bs} D={D} K={K} B={B} {mode}: {f}")
                n_cases += 1
                if rep == 0:  # the torch builder, too (the CPU path's twin)
                    os.environ[du.TREE_KERNEL_ENV] = "0"
                    slow = du.build_ddtree_tree_from_topk(ids, lps, root, start, B)
                    os.environ.pop(du.TREE_KERNEL_ENV)
                    if not all(torch.equal(getattr(slow, f).cpu(), getattr(ref, f).cpu()) for f in fields):
                        bad.append(f"torch builder bs={bs} D={D} K={K} B={B} {mode}")
    report(
        "kernel_vs_heap_oracle_cuda",
        not bad and n_cases >= 200,
        f"{n_cases} cases ({len(configs)} shapes x {modes} x 8 seeds (3 at B >= 512), "
        "B up to 1024, K up to 64), "
        f"{len(bad)} mismatches {bad[:3]} ({time.time() - t0:.1f}s)",
    )

    # 1b. the fused top-K + log-normalizer on real-size bf16 logits
    t0 = time.time()
    tk_bad = []
    saved_min_k = getattr(kmod, "_TOPK_ROW_T_MIN_K", None)
    for min_k in (1, 10**9) if saved_min_k is not None else (None,):
        if min_k is not None:
            kmod._TOPK_ROW_T_MIN_K = min_k  # the candidate threshold of the chunks' best keys at every K, and at none
        for bs, K, scale in ((1, 8, 3), (1, 32, 3), (4, 64, 3), (32, 8, 3), (8, 32, 1), (2, 32, 0)):
            # integer logits: scale 3 ties some, scale 1 gives hundreds of tied candidates a row, 0 all equal
            logits = (torch.randn(bs, 15, 151936, generator=g) * scale).round().to(torch.bfloat16).to(dev)
            ids, lps = du.topk_logprobs_from_logits(logits, K)
            lp = torch.log_softmax(logits.float(), dim=-1)
            want = torch.sort(-lp, dim=-1, stable=True).indices[..., :K]
            if not torch.equal(ids, want):
                tk_bad.append(f"row_t_min_k={min_k} bs={bs} K={K} scale={scale}: ids")
            if not torch.allclose(lps, lp.gather(-1, want), atol=1e-5, rtol=0):
                err = (lps - lp.gather(-1, want)).abs().max().item()
                tk_bad.append(f"row_t_min_k={min_k} bs={bs} K={K} scale={scale}: logprobs max err {err:.2e}")
    if saved_min_k is not None:
        kmod._TOPK_ROW_T_MIN_K = saved_min_k
    report(
        "fused_topk_vs_torch_cuda",
        not tk_bad,
        f"[bs, 15, 151936] bf16 with ties (row threshold at every K and at none), K in 8..64: "
        f"{tk_bad or 'ids equal, log-probs within 1e-5'} ({time.time() - t0:.1f}s)",
    )

    # 2. the probe on CUDA
    env = {**os.environ, "PYTHONPATH": str(args.src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.srt.speculative.ddtree_probe", "--device", "cuda"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    line = (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-300:]])[-1]
    report("probe_cuda", proc.returncode == 0 and "builder=triton" in line, f"exit {proc.returncode}: {line}")

    # 3. SGLang's compiled Triton verify kernel vs our walk
    try:
        verify = load_verify_tree_greedy(args.src / SPEC_TREE)
        mism, total, accepted = 0, 0, 0
        for bs, D, K, B in [(1, 15, 8, 256), (8, 15, 8, 64), (32, 15, 4, 32), (4, 15, 16, 512)]:
            for _ in range(5):
                ids, lps, root, start = inputs(bs, D, K)
                tree = du.build_ddtree_tree_from_topk(ids, lps, root, start, B)
                n = tree.draft_tokens.shape[1]
                target = torch.randint(0, 1000, (bs, n), generator=g).to(dev)
                pick = torch.randint(0, n, (bs,), generator=g).tolist()
                par = tree.parents.cpu()
                tok = tree.draft_tokens.cpu()
                tcpu = target.cpu()
                for b, node in enumerate(pick):
                    while node > 0:
                        p = int(par[b, node])
                        tcpu[b, p] = tok[b, node]
                        node = p
                target = tcpu.to(dev)
                ours = du.ddtree_accept(tree, target)
                acc_idx, acc_num, predicts = run_sglang_verify(verify, tree, target)
                torch.cuda.synchronize()
                for b in range(bs):
                    L = int(ours.accept_length[b])
                    want = [b * n + int(x) for x in ours.accepted_nodes[b, : L + 1].tolist()]
                    got = acc_idx[b, : L + 1].tolist()
                    ok = int(acc_num[b]) == L and got == want and int(predicts[want[-1]]) == int(ours.bonus_tokens[b])
                    mism += not ok
                    total += 1
                    accepted += L
        report(
            "sglang_triton_verify_vs_walk_cuda",
            mism == 0,
            f"{total} requests, {mism} mismatches, mean accepted depth {accepted / max(total, 1):.2f}",
        )
    except Exception as exc:  # say exactly what blocked it
        report("sglang_triton_verify_vs_walk_cuda", False, f"could not run: {type(exc).__name__}: {exc}")

    # 4. zero host syncs in build + accept
    ids, lps, root, start = inputs(8, 15, 8)
    target = torch.randint(0, 1000, (8, 257), generator=g).to(dev)
    du.ddtree_accept(du.build_ddtree_tree_from_topk(ids, lps, root, start, 256), target)  # warm up
    torch.cuda.synchronize()
    big = torch.randn(8, 15, 151936, generator=g).to(torch.bfloat16).to(dev)
    du.topk_logprobs_from_logits(big, 32)  # warm up (compile)
    du.build_ddtree_tree_from_topk(*du.topk_logprobs_from_logits(big, 32), root, start, 1024)
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        tree = du.build_ddtree_tree_from_topk(ids, lps, root, start, 256)
        du.ddtree_accept(tree, target)
        du.build_ddtree_tree_from_topk(*du.topk_logprobs_from_logits(big, 32), root, start, 1024)
        torch.cuda.set_sync_debug_mode(0)
        report(
            "no_host_sync",
            True,
            "kernel build(bs=8,D=15,K=8,B=256)+accept and fused top-K(bs=8,V=151936,K=32)"
            "+kernel build(B=1024) ran under sync_debug_mode='error'",
        )
    except RuntimeError as exc:
        torch.cuda.set_sync_debug_mode(0)
        report("no_host_sync", False, f"{exc}"[:300])

    # 5. CUDA graph capture + replay
    try:
        s_ids, s_lps, s_root, s_start, s_target = (x.clone() for x in (ids, lps, root, start, target))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                du.ddtree_accept(du.build_ddtree_tree_from_topk(s_ids, s_lps, s_root, s_start, 256), s_target)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_tree = du.build_ddtree_tree_from_topk(s_ids, s_lps, s_root, s_start, 256)
            g_acc = du.ddtree_accept(g_tree, s_target)
        same = True
        for _ in range(3):
            ids2, lps2, root2, start2 = inputs(8, 15, 8)
            s_ids.copy_(ids2)
            s_lps.copy_(lps2)
            s_root.copy_(root2)
            s_start.copy_(start2)
            graph.replay()
            torch.cuda.synchronize()
            eager = du.build_ddtree_tree_from_topk(ids2, lps2, root2, start2, 256)
            eacc = du.ddtree_accept(eager, s_target)
            same &= torch.equal(eager.draft_tokens, g_tree.draft_tokens) and torch.equal(eager.parents, g_tree.parents)
            same &= torch.equal(eacc.accepted_nodes, g_acc.accepted_nodes)
        report("cuda_graph_capture", bool(same), "captured build+accept (bs=8,B=256); 3 replays on new inputs == eager")
    except Exception as exc:
        report("cuda_graph_capture", False, f"{type(exc).__name__}: {exc}"[:300])

    # 6. GraphedTreeBuilder: equal to eager, and how much faster
    try:
        gb = du.GraphedTreeBuilder(256, max_graphs=2)
        bad6 = 0
        for i, (bs, D, K) in enumerate([(1, 15, 8), (8, 15, 8), (1, 15, 8), (3, 7, 5), (8, 15, 8), (1, 15, 8)]):
            ids, lps, root, start = inputs(bs, D, K)
            got = gb(ids, lps, root, start)
            want = du.build_ddtree_tree_from_topk(ids, lps, root, start, 256)
            bad6 += not all(torch.equal(getattr(got, f), getattr(want, f)) for f in fields + ("node_logprobs",))
        timing = {}
        for bs in (1, 8, 32):
            ids, lps, root, start = inputs(bs, 15, 8)
            gbt = du.GraphedTreeBuilder(256)
            for label, fn in (
                ("eager", lambda: du.build_ddtree_tree_from_topk(ids, lps, root, start, 256)),
                ("graphed", lambda: gbt(ids, lps, root, start)),
            ):
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                times = []
                for _ in range(30):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    fn()
                    b.record()
                    torch.cuda.synchronize()
                    times.append(a.elapsed_time(b))
                times.sort()
                timing[f"bs{bs}_{label}_ms"] = round(times[len(times) // 2], 4)
        results["graphed_builder_timing_B256"] = timing
        report(
            "graphed_builder",
            bad6 == 0 and gb.failed is None and gb.num_graphs == 2,
            f"6 calls over 3 shapes (max_graphs=2): {bad6} mismatches, failed={gb.failed}; B=256 median ms: {timing}",
        )
    except Exception as exc:
        report("graphed_builder", False, f"{type(exc).__name__}: {exc}"[:300])

    # 7. Start-up capture (what DDTreeWorkerV2 does): padded replays == eager, never a capture on a call
    try:
        gs = du.GraphedTreeBuilder(256, capture_on_call=False)
        sizes = du.ddtree_builder_capture_sizes([1, 2, 4, 8, 16, 24, 32], 32)
        captured = gs.capture(sizes, depth=15, topk=8, device="cuda")
        bad7 = 0
        for bs in (1, 3, 8, 9, 31, 32, 33, 2):  # 3 -> graph 4, 9 -> 16, 33 -> eager (logged once)
            ids, lps, root, start = inputs(bs, 15, 8)
            got = gs(ids, lps, root, start)
            want = du.build_ddtree_tree_from_topk(ids, lps, root, start, 256)
            bad7 += not all(torch.equal(getattr(got, f), getattr(want, f)) for f in fields + ("node_logprobs",))
        report(
            "startup_capture",
            bad7 == 0 and captured == sizes and gs.num_graphs == len(sizes) and gs.failed is None,
            f"captured {captured} ({gs.graph_bytes / 2**20:.1f} MiB); 8 calls: {bad7} mismatches, "
            f"graphs after calls {gs.num_graphs}, failed={gs.failed}",
        )
    except Exception as exc:
        report("startup_capture", False, f"{type(exc).__name__}: {exc}"[:300])

    results["failures"] = failures
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"gpu_suite: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
