"""The fused Triton tree builder and top-K kernels (patch ddtree-tree-builder) equal the heap oracle, ties included.

Real parts: the kernels of ``ddtree_tree_kernel.py`` as the series builds them, reached through
the public API (``build_ddtree_tree_from_topk`` / ``topk_logprobs_from_logits`` of patch ddtree-tree-builder),
real Triton. Stood in: the GPU. Triton runs the very same kernels in its interpreter
(``TRITON_INTERPRET=1``) on the CPU; ``SGLANG_DDTREE_TREE_KERNEL=cpu`` makes the API dispatch
CPU tensors to them (on CUDA tensors it does so by default). ``tools/gpu_kernels/gpu_suite.py`` runs the same
comparison compiled on an H200 (hundreds of cases). The script counts the kernel launches it
routes through, so a dispatch that silently fell back to the torch builder fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(r"""
    import json, os, sys, torch
    from ddtree_deploy.build.overlay import import_patched
    from ddtree_offline.heap_oracle import build_ddtree_tree_heap
    du = import_patched("sglang.srt.speculative.ddtree_utils")
    assert du.tree_builder_backend("cpu") == "triton", "the kernel is not dispatched to"
    kmod = du._tree_kernel()
    calls = {"tree": 0, "topk": 0}
    real_build, real_topk = kmod.build_tree, kmod.topk_logprobs
    def build_tree(*a, **k):
        calls["tree"] += 1
        return real_build(*a, **k)
    def topk_logprobs(*a, **k):
        calls["topk"] += 1
        return real_topk(*a, **k)
    kmod.build_tree, kmod.topk_logprobs = build_tree, topk_logprobs

    g = torch.Generator().manual_seed(int(sys.argv[1]))
    bad, cases = [], 0
    def inputs(bs, D, K, V, mode):
        logits = torch.randn(bs, D, V, generator=g) * (torch.rand(bs, D, 1, generator=g) * 3 + 0.3)
        if mode == "ties":
            logits = (logits * 2).round() / 2
        lp = torch.log_softmax(logits, dim=-1)
        vals, ids = torch.topk(lp, K, dim=-1)
        if mode == "ties":
            vals = (vals * 4).round() / 4          # many exactly equal scores and sums
        elif mode == "flat":
            vals = torch.full_like(vals, -2.0)     # everything ties: order = depth, then rank path
        root = torch.randint(0, V, (bs,), generator=g)
        start = torch.randint(0, 5000, (bs,), generator=g)
        return ids, vals, root, start
    grid = [(1, 15, 8, 64), (3, 6, 4, 50), (2, 4, 5, 300), (2, 15, 1, 20), (1, 1, 8, 8), (4, 5, 3, 1),
            (2, 7, 16, 128), (1, 3, 64, 1024), (1, 15, 32, 256), (2, 15, 64, 256),
            (1, 15, 4, 1024)]  # B 1024, small K: the union-tile cap (BC = BM; shared memory on sm90)
    for bs, D, K, B in grid:
        for mode in ("random", "ties", "flat"):
            ids, lps, root, start = inputs(bs, D, K, 100, mode)
            got = du.build_ddtree_tree_from_topk(ids, lps, root, start, B)
            ref = build_ddtree_tree_heap(ids, lps, root, start, B)
            for name in du.DDTreeTree._fields:
                a, b = getattr(got, name), getattr(ref, name)
                if a.dtype != b.dtype or not torch.equal(a, b):
                    bad.append(f"bs={bs} D={D} K={K} B={B} {mode}: {name}")
            cases += 1
    # out= buffers and bf16 inputs
    ids, lps, root, start = inputs(2, 6, 4, 100, "ties")
    ref = build_ddtree_tree_heap(ids, lps.to(torch.bfloat16), root, start, 40)
    out = du.DDTreeTree(*(torch.empty_like(t) for t in ref), max_depth=6)
    du.build_ddtree_tree_from_topk(ids.to(torch.int32), lps.to(torch.bfloat16), root, start, 40, out=out)
    if not all(torch.equal(a, b) for a, b in zip(out, ref)):
        bad.append("out= / bf16 / int32 ids")

    # The fused top-K + log-normalizer: ids as a stable sort (ties to the smaller id), values
    # equal to log_softmax up to float32 rounding of the normalizer.
    topk_bad = []
    for shape, k, block in [((2, 3, 3000), 8, 128), ((2, 3, 1000), 8, 256), ((1, 2, 5000), 64, 1024), ((3, 1, 300), 33, 4096),
                            ((1, 4, 70), 64, 32),
                            ((2, 2, 20000), 32, 512)]:  # K >= 32 with 160 chunk-best keys: the row threshold
        x = torch.randn(*shape, generator=g) * 3
        x = (x * 2).round() / 2                      # heavy ties in the logits
        ids, lps = kmod.topk_logprobs(x, k, block_v=block)
        lp = torch.log_softmax(x, dim=-1)
        want = torch.sort(-lp, dim=-1, stable=True).indices[..., :k]
        if not torch.equal(ids, want):
            topk_bad.append(f"{shape} k={k}: ids")
        if not torch.allclose(lps, lp.gather(-1, want), atol=1e-5, rtol=0):  # float32 normalizer, V up to 20000
            topk_bad.append(f"{shape} k={k}: logprobs")
    ids, lps = du.topk_logprobs_from_logits(torch.randn(2, 3, 500, generator=g), 16)  # the API path
    print(json.dumps({"cases": cases, "bad": bad, "topk_bad": topk_bad, "calls": calls}))
""")


def test_triton_kernels_match_the_heap_oracle_under_the_interpreter(tmp_path):
    """The kernels give the oracle's trees and top-K. The grid covers both mask paths (fused into the tree
    program up to 64 nodes, its own launch above) and both top-K thresholds (the chunks' best keys at
    K >= 32, the chunk maxima below)."""
    script = tmp_path / "check.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TRITON_INTERPRET": "1", "SGLANG_DDTREE_TREE_KERNEL": "cpu"}
    proc = subprocess.run([sys.executable, str(script), "11"], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["cases"] == 33
    assert res["bad"] == [], res["bad"]
    assert res["topk_bad"] == [], res["topk_bad"]
    # every tree of the grid (and the out= case) and the API top-K went through the kernels
    assert res["calls"] == {"tree": 31, "topk": 7}, res["calls"]


SHARDED = textwrap.dedent(r"""
    import json, sys, torch
    from ddtree_deploy.build.overlay import import_patched
    du = import_patched("sglang.srt.speculative.ddtree_utils")
    backend = du.tree_builder_backend("cpu")
    g = torch.Generator().manual_seed(5)
    bad, cases = [], 0
    for rows, V, k, cuts in [(6, 300, 8, (100, 200)), (4, 1000, 32, (123, 500, 900)), (3, 97, 5, (40,)),
                             (2, 5000, 64, (2500,)), (5, 64, 16, (16, 32, 48))]:
        for ties in (False, True):
            x = torch.randn(rows, V, generator=g) * 3
            if ties:
                x = (x * 2).round() / 2  # many equal logits, across shard boundaries too
            # The unsharded top-K of the whole row, computed independently: a stable sort of
            # log_softmax (ties to the smaller id).
            lp = torch.log_softmax(x, dim=-1)
            want_ids = torch.sort(-lp, dim=-1, stable=True).indices[:, :k]
            want_lps = lp.gather(-1, want_ids)
            bounds = (0,) + tuple(cuts) + (V,)
            parts = [du.topk_logprobs_with_stats(x[:, a:b], k) for a, b in zip(bounds, bounds[1:])]
            for (ids, lps, vals, stats), a, b in zip(parts, bounds, bounds[1:]):
                xs = x[:, a:b]
                if not torch.equal(vals, xs.gather(-1, ids)):
                    bad.append(f"V={V} k={k} ties={ties}: shard values are not the raw logits")
                lse = torch.logsumexp(xs, dim=-1)
                if not torch.allclose(stats[:, 0] + stats[:, 1], lse, atol=1e-5, rtol=0):
                    bad.append(f"V={V} k={k} ties={ties}: shard stats")
            kk = min(k, min(b - a for a, b in zip(bounds, bounds[1:])))
            stack = lambda i: torch.stack([p[i] for p in parts])
            ids = torch.stack([p[0] + a for p, a in zip(parts, bounds)])
            # each shard returns min(k, its size) entries: merge the common width
            got_ids, got_lps = du.merge_sharded_topk(ids[..., :kk], stack(2)[..., :kk], stack(3), k)
            n = min(k, got_ids.shape[-1])
            if not torch.equal(got_ids[:, :n], want_ids[:, :n]):
                bad.append(f"V={V} k={k} ties={ties}: ids {got_ids[0].tolist()} != {want_ids[0].tolist()}")
            if not torch.allclose(got_lps[:, :n], want_lps[:, :n], atol=1e-5, rtol=0):
                bad.append(f"V={V} k={k} ties={ties}: logprobs")
            cases += 1
    print(json.dumps({"backend": backend, "cases": cases, "bad": bad}))
""")


@pytest.mark.parametrize("kernel", ["cpu", "0"])
def test_sharded_topk_merges_to_the_unsharded_topk(tmp_path, kernel):
    """Issue 20 (patch ddtree-tree-builder, the draft head under TP): a per-shard top-K (``topk_logprobs_with_stats``:
    the fused kernel's raw values and the row's (max, log-sum-exp)) merged by ``merge_sharded_topk``
    equals the unsharded top-K of the whole vocabulary: the same ids in the same order (ties to the
    smaller id, also across shard boundaries) and the same log-probs up to float32 rounding of the
    normalizer. Both the fused kernel (under the interpreter) and the torch path. The all-gather itself
    is a stack here: no second device."""
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    env = {**os.environ, "TRITON_INTERPRET": "1", "SGLANG_DDTREE_TREE_KERNEL": kernel}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["backend"] == ("triton" if kernel == "cpu" else "torch"), res
    assert res["cases"] == 10 and res["bad"] == [], res
