"""Make ``.gpu/src``: what a GPU machine with only torch + Triton needs to run the DDTree checks.

It holds a bare ``sglang/`` tree (no ``__init__.py``, so nothing of SGLang runs) with the files
the series creates (as ``ddtree-deploy build`` makes them) and the pinned, unmodified
``sglang/kernels/ops/speculative/spec_tree.py`` and ``uno_tree.py`` (UNO's builder, timed by
``tools/bench/bench_builder.py --uno``) from the verified snapshot. ``.gpu/`` is listed in
``.git/info/exclude``: it is carried to the device machine, never committed (it holds an SGLang
source file).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from sglang_kernels import SPEC_TREE  # this script's sibling: tools/gpu_kernels/ is sys.path[0] when it runs

from ddtree_deploy.build.overlay import build_overlay
from ddtree_deploy.pin.snapshot import ensure_snapshot

UNO_TREE = "sglang/kernels/ops/speculative/uno_tree.py"  # SGLang's own tree builder, for bench_builder


def main() -> int:
    repo = Path(__file__).resolve().parents[2]
    dest = repo / ".gpu" / "src"
    if dest.exists():
        shutil.rmtree(dest)
    built = build_overlay()
    for path in (built / "sglang").rglob("*.py"):
        rel = path.relative_to(built)
        if "speculative/ddtree_" in str(rel):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
    (dest / SPEC_TREE).parent.mkdir(parents=True, exist_ok=True)
    for rel in (SPEC_TREE, UNO_TREE):
        shutil.copy2(ensure_snapshot() / rel, dest / rel)
    exclude = repo / ".git" / "info" / "exclude"
    if exclude.exists() and "/.gpu/" not in exclude.read_text():
        exclude.write_text(exclude.read_text() + "/.gpu/\n")
    for p in sorted(dest.rglob("*.py")):
        print(p.relative_to(repo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
