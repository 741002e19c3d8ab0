"""Helpers shared by the test suites (import as ``from testkit import ...``).

Not named ``conftest`` on purpose: every test directory has its own conftest module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git_diff(old: bytes | None, new: bytes | None, rel: str, tmp: Path) -> bytes:
    """A real ``git diff --no-index`` of two versions of ``rel`` with a/ b/ package-relative paths."""
    a = tmp / "a" / rel
    b = tmp / "b" / rel
    for p, data in ((a, old), (b, new)):
        if p.exists():
            p.unlink()
        if data is not None:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    left = str(a.relative_to(tmp)) if old is not None else "/dev/null"
    right = str(b.relative_to(tmp)) if new is not None else "/dev/null"
    proc = subprocess.run(
        [
            "git",
            "-c",
            "core.autocrlf=false",
            "diff",
            "--no-index",
            "--no-color",
            "--no-ext-diff",
            "--full-index",
            "--src-prefix=",
            "--dst-prefix=",
            left,
            right,
        ],
        cwd=tmp,
        capture_output=True,
    )
    assert proc.returncode in (0, 1), proc.stderr
    # git used "a/<rel>" and "b/<rel>" as the real paths: they already carry the a/ b/ prefixes.
    return proc.stdout


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real console entry point in a subprocess (stdout and stderr kept apart)."""
    return subprocess.run(
        [sys.executable, "-m", "ddtree_deploy", *args], capture_output=True, text=True, env=env, cwd=cwd or REPO
    )
