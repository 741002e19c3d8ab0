"""Use the patched SGLang without installing it: for tests, tools and the demo.

- :func:`import_patched` imports a module the series creates (e.g. the torch-only
  ``sglang.srt.speculative.ddtree_utils``) under a bare ``sglang`` package, so SGLang's own
  ``__init__`` (and its heavy dependencies) never run.
- :func:`patched_site` gives a directory with the complete patched ``sglang/`` package (the
  pinned snapshot with the series applied, byte-compiled) for ``PYTHONPATH=`` in a subprocess.

Both build into the cache, keyed by the series id, so they are cheap after the first call.
"""

from __future__ import annotations

import compileall
import importlib
import os
import shutil
import sys
import types
from pathlib import Path

from ddtree_deploy.build.build import apply_checked, manifest_for, resolve_inputs, write_tree
from ddtree_deploy.paths import cache_dir, publish_once

_MARK = "__ddtree_overlay__"


def build_overlay(series_dir: Path | None = None) -> Path:
    """Build the series (patched files only) into the cache; returns the dir containing ``sglang/``."""
    inputs = resolve_inputs(series_dir)
    dest = cache_dir() / "overlay" / inputs.series.series_id
    if not (dest / "manifest.json").is_file():
        result = apply_checked(inputs, require_coverage=False)
        write_tree(result, manifest_for(result, inputs.pin), dest)
    return dest


def import_patched(module_name: str, series_dir: Path | None = None) -> types.ModuleType:
    """Import ``module_name`` (``sglang.…``) from the series' build under a bare ``sglang`` package."""
    if not module_name.startswith("sglang."):
        raise ValueError(f"{module_name!r} is not a module of the sglang package")
    root = build_overlay(series_dir) / "sglang"
    current = sys.modules.get("sglang")
    if current is None or getattr(current, _MARK, None) != str(root):
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
        pkg = types.ModuleType("sglang")
        pkg.__path__ = [str(root)]
        setattr(pkg, _MARK, str(root))
        sys.modules["sglang"] = pkg
    return importlib.import_module(module_name)


def patched_site(series_dir: Path | None = None) -> Path:
    """A dir holding the whole pinned ``sglang/`` with the series applied (hard links where unchanged)."""
    inputs = resolve_inputs(series_dir)
    from ddtree_deploy.pin import snapshot

    base = inputs.base_dir or snapshot.ensure_snapshot(inputs.pin)
    dest = cache_dir() / "site" / inputs.series.series_id
    if (dest / ".complete").is_file():
        return dest
    result = apply_checked(type(inputs)(inputs.series, base, inputs.pin), require_coverage=False)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    def fill(tmp: Path) -> str:
        shutil.copytree(base / "sglang", tmp / "sglang", copy_function=link)
        for fr in result.changed():
            target = tmp / fr.path
            if target.exists():
                target.unlink()  # never write through a hard link into the snapshot
            if fr.result is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(fr.result)
                os.chmod(target, fr.mode)
        # Byte-code once, here: every process that imports the site (each test harness, each engine
        # process) would otherwise compile SGLang's few thousand modules again, and more than not the
        # tests run with PYTHONDONTWRITEBYTECODE. Tracebacks name the published path (ddir).
        compileall.compile_dir(tmp / "sglang", ddir=str(dest / "sglang"), quiet=2, workers=0)
        return inputs.series.series_id + "\n"

    publish_once(dest, ".complete", fill)
    return dest
