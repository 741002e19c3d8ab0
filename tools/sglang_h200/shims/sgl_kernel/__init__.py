"""Shim for the ``sgl_kernel`` wheel (SGLang's AOT CUDA ops) on a GPU machine that cannot install it.

Used only by the H200 harness (tools/sglang_h200, docs/h200-harness.md). It replaces the compiled
``sglang-kernel`` wheel, which has no build for this machine's torch (2.11) and cannot be fetched there.

* The ops SGLang 0.5.23's decode path calls on CUDA for a Qwen3 target with the Triton attention
  backend are implemented in torch in :mod:`sgl_kernel._ops` (each one's SGLang call site and the
  reference it is checked against are listed there and in docs/h200-harness.md). They compute what the
  CUDA kernels compute (fp32 accumulation, output in the input dtype), so the model's math is the
  same; only the kernel that runs it differs. They are plain torch ops, so CUDA graphs capture them.
* Every other name is importable (SGLang imports many at module load under ``if _is_cuda:``) but is a
  :class:`NotShimmed` object: calling it, or reading an attribute of it, raises
  ``NotImplementedError`` naming ``sgl_kernel.<name>``. So a path that reaches an op we did not stand
  in stops loudly at that op instead of computing something else.
* ``sgl_kernel.<sub>`` submodules: ``utils`` is here; those in :data:`STUB_SUBMODULES` (imported
  unconditionally at module load on CUDA) are created on import with the NotShimmed rule by
  :class:`_SubmoduleFinder`; any other raises ``ModuleNotFoundError`` as if the wheel lacked it, so
  SGLang's own ``except ImportError`` fallbacks run (e.g. ``sgl_kernel.scalar_type`` in
  ``srt/layers/quantization/utils.py:26-42``).

Set ``H200_SHIM_LOG=<file>`` to append one line per name first imported and per shimmed op
first called (``import <name>`` / ``call <name>``), to see what the engine used.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

__version__ = "0.4.10+shim"
SHIM = True

_seen: set[str] = set()

# Submodules that SGLang imports without an ImportError fallback on the decode path's modules.
STUB_SUBMODULES: frozenset[str] = frozenset(
    {
        "sgl_kernel.kvcacheio",
        "sgl_kernel.quantization",
    }
)


def _log(kind: str, name: str) -> None:
    key = f"{kind} {name}"
    if key in _seen:
        return
    _seen.add(key)
    path = os.environ.get("H200_SHIM_LOG")
    if path:
        try:
            with open(path, "a") as fh:
                fh.write(f"{key} pid={os.getpid()}\n")
        except OSError:
            pass


class NotShimmed:
    """An ``sgl_kernel`` name with no shim: importable, raises naming itself when used."""

    def __init__(self, qualname: str):
        object.__setattr__(self, "_qualname", qualname)

    def _fail(self, *_a, **_k):
        raise NotImplementedError(
            f"{self._qualname} is not shimmed by the H200 harness's sgl_kernel "
            f"(tools/sglang_h200/shims/sgl_kernel): the engine reached an op the harness does not implement"
        )

    __call__ = _fail

    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        self._fail()

    def __bool__(self):
        self._fail()

    def __repr__(self):
        return f"<NotShimmed {self._qualname}>"


def _stub_getattr(modname: str):
    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _log("import", f"{modname}.{name}")
        return NotShimmed(f"{modname}.{name}")

    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Creates ``sgl_kernel.<sub>`` modules that do not exist on disk as stubs (see module doc)."""

    def find_spec(self, fullname, path=None, target=None):
        # This finder is last on sys.meta_path: the real files of this shim (utils.py, _ops.py)
        # were found by the path finder before it is asked.
        if not fullname.startswith("sgl_kernel."):
            return None
        if fullname not in STUB_SUBMODULES:
            _log("absent", fullname)
            return None  # -> ModuleNotFoundError, as for a wheel without it (SGLang's fallbacks run)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = _stub_getattr(spec.name)
        return mod

    def exec_module(self, module):
        _log("import", module.__name__)


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())

from . import _ops  # noqa: E402, F401  (registers the shimmed ops)
from ._ops import SHIMMED  # noqa: E402

for _name, _fn in SHIMMED.items():
    globals()[_name] = _fn

__getattr__ = _stub_getattr("sgl_kernel")
