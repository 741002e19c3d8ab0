"""SGLang's own greedy tree-verify kernel accepts exactly the paths our walk accepts.

Real parts: the unmodified ``verify_tree_greedy_kernel_triton`` from the pinned 0.5.23 wheel
(cut out of ``spec_tree.py`` by ``tools/gpu_kernels/sglang_kernels.py``, which explains why), our builder
and walk from the patch series, real Triton. Stood in: the GPU. Triton runs the kernel in its
interpreter (``TRITON_INTERPRET=1``) on the CPU here; tools/gpu_kernels/gpu_suite.py runs the same check
compiled on an H200.
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
    import json, sys, torch
    from sglang_kernels import SPEC_TREE, load_verify_tree_greedy, run_sglang_verify
    from ddtree_deploy.build.overlay import import_patched
    du = import_patched("sglang.srt.speculative.ddtree_utils")
    verify = load_verify_tree_greedy(sys.argv[1] + "/" + SPEC_TREE)
    g = torch.Generator().manual_seed(int(sys.argv[2]))
    cases = 0
    for bs, D, K, B in [(1, 4, 2, 5), (3, 6, 3, 16), (2, 15, 4, 64), (4, 3, 1, 3), (2, 5, 8, 1)]:
        for trial in range(6):
            logits = torch.randn(bs, D, 40, generator=g) * 3
            ids, lps = du.topk_logprobs_from_logits(logits, K)
            root = torch.randint(0, 40, (bs,), generator=g)
            tree = du.build_ddtree_tree_from_topk(ids, lps, root, torch.zeros(bs, dtype=torch.long), B)
            n = tree.draft_tokens.shape[1]
            # Targets: a random node per request; follow its path, then random tokens.
            target = torch.randint(0, 40, (bs, n), generator=g)
            for b in range(bs):
                node = int(torch.randint(0, n, (1,), generator=g))
                while node > 0:
                    parent = int(tree.parents[b, node])
                    target[b, parent] = tree.draft_tokens[b, node]
                    node = parent
            ours = du.ddtree_accept(tree, target)
            acc_idx, acc_num, predicts = run_sglang_verify(verify, tree, target)
            for b in range(bs):
                L = int(ours.accept_length[b])
                assert int(acc_num[b]) == L, (bs, D, K, B, b, int(acc_num[b]), L)
                want = [b * n + int(x) for x in ours.accepted_nodes[b, : L + 1]]
                assert acc_idx[b, : L + 1].tolist() == want, (acc_idx[b].tolist(), want)
                last = want[-1]
                assert int(predicts[last]) == int(ours.bonus_tokens[b])
            cases += 1
    print(json.dumps({"cases": cases}))
""")


def test_sglang_triton_verify_matches_our_walk(repo, snapshot_root, tmp_path):
    script = tmp_path / "check.py"
    script.write_text(SCRIPT)
    # tools/gpu_kernels/sglang_kernels.py is a script's helper module, not a package: the child gets its folder
    # on its PYTHONPATH.
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(repo / "tools" / "gpu_kernels"), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(script), str(snapshot_root), "7"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["cases"] == 30
