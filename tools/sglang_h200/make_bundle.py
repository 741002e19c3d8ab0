"""Make what the H200 harness carries to the device machine (``make h200-bundle``).

Writes ``--out`` (default ``.work/h200-bundle``, git-ignored), under 64 MiB in all:

* ``sglang.tar.xz``: the complete pinned ``sglang/`` package from the verified snapshot with the
  repo's series applied (``ddtree_deploy.build.overlay.patched_site``), minus ``multimodal_gen`` (diffusion
  serving, never imported by the LLM engine) and bytecode. SGLang's own files: carried, never committed.
* ``wheels/``: the dependency wheels the H200 image lacks (``wheels.txt``), downloaded for cp312
  manylinux x86_64 with ``pip download --no-deps`` (cached in ``.work/h200-wheels``).
* ``harness/``: this folder (shims, checks, the engine runner, ``h200.sh``).
* ``before.tar.xz`` (with ``--before REF``): only the files that the series at git ``REF`` patches,
  as that series builds them. ``H200_OVERLAY=<bundle>/before.tar.xz`` makes ``h200.sh`` unpack it over
  the bundle's tree, so one device call measures the series before and after a change side by side.

``--carry DIR`` also copies the bundle there (for the device tool: ``/work/main/.carry-12``); a
``jit-cache.tar.gz`` already in DIR (SGLang's JIT builds brought back from an earlier run) is kept.
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIMIT = 60 * 1024 * 1024
PLATFORMS = [
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux1_x86_64",
]


def wheel_specs() -> list[str]:
    return [ln.strip() for ln in (HERE / "wheels.txt").read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def pip_download(specs: list[str], dest: Path) -> None:
    """``pip download`` binary wheels for the device's Python (cp312, manylinux x86_64) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    if subprocess.run(cmd + specs, timeout=1800).returncode != 0:
        raise SystemExit(f"error: pip download failed for {specs}")


def download_wheels(cache: Path) -> list[Path]:
    specs = wheel_specs()
    pip_download(specs, cache)
    # only the wheels wheels.txt names now: the cache may hold ones an earlier wheels.txt named
    wanted = {re.split(r"[=<>!~ ]", s, maxsplit=1)[0].lower().replace("-", "_") for s in specs}
    return sorted(w for w in cache.glob("*.whl") if w.name.split("-")[0].lower() in wanted)


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
        raise SystemExit(
            f"error: the bundle is {size / 2**20:.1f} MiB, over the device tool's 64 MiB\n"
            f"fix: drop wheels from tools/sglang_h200/wheels.txt or exclude more of sglang/"
        )
    print(
        f"{out}: {size / 2**20:.1f} MiB (sglang {tar.stat().st_size / 2**20:.1f} MiB, {len(list(wheels.iterdir()))} wheels)",
        file=sys.stderr,
    )
    return out


def make_before(out: Path, ref: str) -> Path:
    """``out/before.tar.xz``: the patched files of the series committed at git ``ref``."""
    import tempfile

    from ddtree_deploy.build.build import apply_checked, resolve_inputs

    rel = "patches/sglang-0.5.23"
    with tempfile.TemporaryDirectory() as tmp:
        arch = subprocess.run(["git", "-C", str(REPO), "archive", ref, rel], check=True, capture_output=True).stdout
        tar_in = Path(tmp) / "series.tar"
        tar_in.write_bytes(arch)
        with tarfile.open(tar_in) as tf:
            tf.extractall(tmp, filter="data")
        result = apply_checked(resolve_inputs(Path(tmp) / rel), require_coverage=False)
        dest = out / "before.tar.xz"
        with tarfile.open(dest, "w:xz") as tf:
            for fr in result.changed():
                if fr.result is None:
                    continue
                info = tarfile.TarInfo(fr.path)
                info.size = len(fr.result)
                info.mode = 0o644
                tf.addfile(info, io.BytesIO(fr.result))
    (out / "before.ref").write_text(
        subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], check=True, capture_output=True, text=True).stdout
    )
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".work" / "h200-bundle")
    ap.add_argument("--wheel-cache", type=Path, default=REPO / ".work" / "h200-wheels")
    ap.add_argument("--carry", type=Path, help="also copy the bundle into this folder")
    ap.add_argument("--before", metavar="REF", help="also pack the series at git REF (before.tar.xz)")
    args = ap.parse_args(argv)
    out = make(args.out, args.wheel_cache)
    if args.before:
        print(f"{make_before(out, args.before)}: the series at {args.before}", file=sys.stderr)
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
