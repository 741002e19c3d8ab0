"""Access to the DDTree core module (``sglang/srt/speculative/ddtree_utils.py``).

The offline engine never re-implements the DDTree core: it imports the module that the patch
series creates, so the engine is an end-to-end check of exactly the code shipped to SGLang hosts.

Resolution order of :func:`ddtree_utils`:

1. ``DDTREE_UTILS_PATH`` (environment): a path to a ``ddtree_utils.py`` file, loaded directly by
   file path. Used on machines that only carry the files (e.g. a bare GPU box with only torch,
   transformers and matplotlib). When set, it wins: an explicit path is what the user asked for.
2. ``ddtree_deploy.build.overlay.import_patched("sglang.srt.speculative.ddtree_utils")``: builds the
   repository's patch series into a cache and imports the module from there.

If neither works, :class:`CoreUnavailable` is raised with both reasons.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ENV_VAR = "DDTREE_UTILS_PATH"
MODULE_NAME = "sglang.srt.speculative.ddtree_utils"

#: The names the engine uses from the core (see docs/contracts.md, "DDTree core API").
REQUIRED_NAMES = (
    "build_ddtree_tree_from_topk",
    "ddtree_accept",
    "predicted_accept_length",
)


class CoreUnavailable(ImportError):
    """The DDTree core module could not be imported by any configured route."""


def _load_from_path(path: str) -> ModuleType:
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise CoreUnavailable(f"{ENV_VAR}={path!r} is not a file")
    # A private module name, so it never collides with a real ``sglang`` package.
    name = "_ddtree_offline_core_ddtree_utils"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:  # pragma: no cover - defensive
        raise CoreUnavailable(f"cannot load {p}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception:
        sys.modules.pop(name, None)
        raise
    return mod


def _check(mod: ModuleType, origin: str) -> ModuleType:
    missing = [n for n in REQUIRED_NAMES if not hasattr(mod, n)]
    if missing:
        raise CoreUnavailable(f"DDTree core from {origin} lacks {missing}")
    return mod


@functools.lru_cache(maxsize=None)
def ddtree_utils() -> ModuleType:
    """Return the DDTree core module (cached after the first successful import)."""
    path = os.environ.get(ENV_VAR)
    if path:
        return _check(_load_from_path(path), f"{ENV_VAR}={path}")
    try:
        from ddtree_deploy.build.overlay import import_patched  # type: ignore
    except Exception as exc:  # ImportError, or the overlay's own import failing
        raise CoreUnavailable(
            f"ddtree_deploy.build.overlay is not importable ({exc!r}) and {ENV_VAR} is not set; "
            f"set {ENV_VAR}=/path/to/sglang/srt/speculative/ddtree_utils.py"
        ) from exc
    try:
        mod = import_patched(MODULE_NAME)
    except Exception as exc:
        raise CoreUnavailable(f"import_patched({MODULE_NAME!r}) failed ({exc!r}) and {ENV_VAR} is not set") from exc
    return _check(mod, "ddtree_deploy.build.overlay.import_patched")


def describe() -> str:
    """A one-line description of where the core comes from (for run metadata)."""
    mod = ddtree_utils()
    return getattr(mod, "__file__", None) or repr(mod)
