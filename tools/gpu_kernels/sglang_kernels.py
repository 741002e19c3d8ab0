"""Load SGLang's own Triton tree-verify kernel from the pinned wheel, without importing SGLang.

``sglang/kernels/ops/speculative/spec_tree.py`` (the pinned 0.5.23 file, unmodified) imports
SGLang's platform layer at module level, which needs most of SGLang. The two functions we need,
``verify_tree_greedy_kernel_triton`` (the ``@triton.jit`` kernel) and its launcher
``verify_tree_greedy_triton``, only use ``torch``, ``triton`` and ``triton.language``. So we cut
exactly those two definitions out of the file with ``ast`` (their text is not changed by a single
byte), write them to a small module file (Triton's JIT needs real source on disk) and import that.

Works on a GPU and, with ``TRITON_INTERPRET=1`` set before Triton is imported, on the CPU.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path

SPEC_TREE = "sglang/kernels/ops/speculative/spec_tree.py"
WANTED = ("verify_tree_greedy_kernel_triton", "verify_tree_greedy_triton")


def extract_source(spec_tree_file: Path) -> str:
    src = Path(spec_tree_file).read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    parts = ["import torch\nimport triton\nimport triton.language as tl\n\n"]
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in WANTED:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            parts.append("".join(lines[start : node.end_lineno]) + "\n\n")
            found.append(node.name)
    missing = set(WANTED) - set(found)
    if missing:
        raise RuntimeError(f"{spec_tree_file}: no definition of {sorted(missing)}")
    return "".join(parts)


def load_verify_tree_greedy(spec_tree_file: Path):
    """Return SGLang's ``verify_tree_greedy_triton`` launcher (real kernel code from the wheel)."""
    code = extract_source(spec_tree_file)
    digest = hashlib.sha256(code.encode()).hexdigest()[:12]
    mod_dir = Path(tempfile.gettempdir()) / f"sglang_spec_tree_{digest}"
    mod_dir.mkdir(exist_ok=True)
    path = mod_dir / "sglang_spec_tree_extract.py"
    if not path.exists():
        path.write_text(code)
    name = f"sglang_spec_tree_extract_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod.verify_tree_greedy_triton


def run_sglang_verify(verify, tree, target_tokens):
    """Run SGLang's greedy verify on one of our trees. Returns (accept_index, accept_token_num, predicts).

    ``tree`` is a ``DDTreeTree``; ``target_tokens`` [bs, N] is the target's token after each node.
    ``accept_index`` [bs, D+1] holds flat indices (b * N + i), -1 padded, as SGLang produces them.
    """
    import torch

    bs, n = tree.draft_tokens.shape
    depth = int(tree.depths.max().item()) if n > 1 else 0
    dev = tree.draft_tokens.device
    steps = max(depth, 1) + 1
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32, device=dev)
    accept_num = torch.zeros((bs,), dtype=torch.int32, device=dev)
    verify(
        predicts,
        accept_index,
        accept_num,
        tree.draft_tokens.to(torch.int32).contiguous(),
        tree.retrive_index.to(torch.int32).contiguous(),
        tree.retrive_next_token.to(torch.int32).contiguous(),
        tree.retrive_next_sibling.to(torch.int32).contiguous(),
        target_tokens.to(torch.int32).reshape(-1).contiguous(),
    )
    return accept_index, accept_num, predicts
