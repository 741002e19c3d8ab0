"""The series applies: `git apply --check` patch by patch on a pristine copy agrees with the
project's own engine (`ddtree_deploy.build.build`), and every patched Python file compiles."""

from __future__ import annotations

import hashlib
import py_compile
import shutil
import subprocess
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent.parent
SERIES = REPO / "patches" / "sglang-0.5.23"


def _names():
    return [l.strip() for l in (SERIES / "series").read_text().splitlines()
            if l.strip() and not l.lstrip().startswith("#")]


def test_series_lists_ddtree_integration_patches():
    names = _names()
    assert names == sorted(names) and len(names) >= 8
    assert [int(n[:4]) for n in names] == list(range(1, len(names) + 1))  # numbered 0001.. in order
    assert {"0004-ddtree-tree-builder.patch", "0011-ddtree-worker.patch"} <= set(names)
    for n in names:
        assert (SERIES / n).is_file(), n


def test_git_apply_agrees_with_build(tmp_path, snapshot_root):
    from ddtree_deploy.build import build
    from ddtree_deploy.patches.series import load_series

    series = load_series(SERIES)
    touched = sorted(series.touched_paths())
    work = tmp_path / "work"
    for rel in touched:
        src = Path(snapshot_root) / rel
        if src.is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / rel)
    work.mkdir(exist_ok=True)
    for name in _names():
        patch = SERIES / name
        chk = subprocess.run(["git", "apply", "--check", str(patch)], cwd=work,
                             capture_output=True, text=True)
        assert chk.returncode == 0, (name, chk.stderr)
        subprocess.run(["git", "apply", str(patch)], cwd=work, check=True)
    # The engine's result, from a copy of the series (the repo pin may lag the series).
    copy = tmp_path / "series" / SERIES.name
    shutil.copytree(SERIES, copy)
    out = tmp_path / "build"
    build.build(out, series_dir=copy, base_dir=Path(snapshot_root))
    for rel in touched:
        a, b = work / rel, out / rel
        assert a.is_file() == b.is_file(), rel
        if a.is_file():
            assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest(), rel
            if rel.endswith(".py"):
                py_compile.compile(str(a), doraise=True)
