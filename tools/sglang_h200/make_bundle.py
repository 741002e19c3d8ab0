"""Make what the H200 harness carries to the device machine (``make h200-bundle``).

Writes ``--out`` (default ``.work/h200-bundle``, git-ignored), under 64 MiB in all:

* ``sglang.tar.xz``: the complete pinned ``sglang/`` package from the verified snapshot with the
  repo's series applied (``ddtree_deploy.build.overlay.patched_site``), minus ``multimodal_gen`` (diffusion
  serving, never imported by the LLM engine) and bytecode. SGLang's own files: carried, never committed.
* ``wheels/``: the dependency wheels the H200 image lacks (``wheels.txt``), downloaded for cp312
  manylinux x86_64 with ``pip download --no-deps`` (cached in ``.work/h200-wheels``).
* ``harness/``: this folder (stand-ins, shims, checks, the engine runner, ``h200.sh``).

``--carry DIR`` also copies the bundle there (for the device tool: ``/work/main/.carry-12``); a
``jit-cache.tar.gz`` already in DIR (SGLang's JIT builds brought back from an earlier run) is kept.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIMIT = 60 * 1024 * 1024
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_35_x86_64", "manylinux1_x86_64"]


def wheel_specs() -> list[str]:
    return [ln.strip() for ln in (HERE / "wheels.txt").read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]


def download_wheels(cache: Path) -> list[Path]:
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(cache)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + wheel_specs(), check=True, timeout=1800)
    return sorted(cache.glob("*.whl"))


def _filter(info: tarfile.TarInfo):
    parts = Path(info.name).parts
    if "__pycache__" in parts or info.name.endswith(".pyc") or parts[:2] == ("sglang", "multimodal_gen"):
        return None
    return info


def make(out: Path, wheel_cache: Path) -> Path:
    from ddtree_deploy.build.overlay import patched_site  # installed in the venv (`make h200-bundle`)

    site = patched_site()
    out.mkdir(parents=True, exist_ok=True)
    tar = out / "sglang.tar.xz"
    stamp = out / "sglang.site"
    if not tar.is_file() or not stamp.is_file() or stamp.read_text() != str(site):
        with tarfile.open(tar, "w:xz", preset=6) as tf:
            tf.add(site / "sglang", arcname="sglang", filter=_filter)
        stamp.write_text(str(site))
    wheels = out / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    wheels.mkdir()
    for whl in download_wheels(wheel_cache):
        shutil.copy2(whl, wheels / whl.name)
    harness = out / "harness"
    if harness.exists():
        shutil.rmtree(harness)
    shutil.copytree(HERE, harness, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    if size > LIMIT:
        raise SystemExit(f"error: the bundle is {size / 2**20:.1f} MiB, over the device tool's 64 MiB\n"
                         f"fix: drop wheels from tools/sglang_h200/wheels.txt or exclude more of sglang/")
    print(f"{out}: {size / 2**20:.1f} MiB (sglang {tar.stat().st_size / 2**20:.1f} MiB, "
          f"{len(list(wheels.iterdir()))} wheels)", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".work" / "h200-bundle")
    ap.add_argument("--wheel-cache", type=Path, default=REPO / ".work" / "h200-wheels")
    ap.add_argument("--carry", type=Path, help="also copy the bundle into this folder")
    args = ap.parse_args(argv)
    out = make(args.out, args.wheel_cache)
    if args.carry:
        args.carry.mkdir(parents=True, exist_ok=True)
        for item in out.iterdir():
            dest = args.carry / item.name
            if dest.is_dir():
                shutil.rmtree(dest)
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, dest)
        print(f"copied to {args.carry}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
