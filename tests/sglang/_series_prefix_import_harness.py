"""Each patch of the series leaves SGLang importable: the import check of test_series_by_concern.py.

Run as ``PYTHONPATH=WORK_DIR/site python _series_prefix_import_harness.py SERIES_DIR BASE_DIR WORK_DIR``
(WORK_DIR/site an empty folder the harness fills: only this prefix tree may supply ``sglang``). What is real: the pinned SGLang 0.5.23 package (the
snapshot, hard-linked into WORK_DIR/site), the series applied by the project's own engine
(``apply_series``: the content of every file after each patch), and Python's import of every module
the series has touched up to that patch. Between patches the ``sglang`` modules are dropped from
``sys.modules`` and imported again from the files as that patch leaves them (heavy dependencies such
as torch stay loaded: re-importing them would only cost time). Bytecode is never written, so a
rewritten file cannot be served from a stale ``.pyc``.

Prints one line ``REPORT <json>``: per patch, the modules imported and the errors (module -> error).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import traceback
from pathlib import Path

sys.dont_write_bytecode = True


def main() -> None:
    series_dir, base_dir, work = (Path(a) for a in sys.argv[1:4])
    from ddtree_deploy.patches.engine import apply_series
    from ddtree_deploy.patches.series import load_series

    series = load_series(series_dir)

    def read_base(rel: str) -> bytes | None:
        p = base_dir / rel
        return p.read_bytes() if p.is_file() else None

    result = apply_series(series, read_base)
    site = work / "site"
    if os.path.realpath(os.environ.get("PYTHONPATH", "")) != os.path.realpath(site):
        raise SystemExit(f"run with PYTHONPATH={site} (and nothing else on it)")
    shutil.copytree(base_dir / "sglang", site / "sglang", copy_function=os.link)
    touched: list[str] = []
    report = []
    for patch in series.patches:
        for fp in patch.files:
            after = dict(result.files[fp.path].history)[patch.name]
            target = site / fp.path
            if target.exists():
                target.unlink()  # never write through a hard link into the snapshot
            if after is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(after)
            if fp.path not in touched:
                touched.append(fp.path)
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        modules = [p[: -len(".py")].replace("/", ".") for p in touched if p.endswith(".py") and (site / p).is_file()]
        errors = {}
        for mod in modules:
            try:
                importlib.import_module(mod)
            except Exception as exc:  # noqa: BLE001
                errors[mod] = f"{type(exc).__name__}: {exc} | {traceback.format_exc()[-600:]}"
        report.append({"patch": patch.name, "modules": modules, "errors": errors})
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
