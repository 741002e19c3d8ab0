"""Run records: one generation of one prompt by one method, and how to read and write them.

Two on-disk formats are read:

* our JSONL (``ddtree-deploy bench`` writes it; the contract in ``docs/contracts.md``): one JSON
  object per line with ``dataset``, ``method`` (``baseline`` | ``dflash`` | ``ddtree_tb{B}``),
  ``budget``, ``prompt_index``, ``output_ids``, ``acceptance_lengths`` (or null),
  ``accept_length_mean``, ``verify_ct``, ``num_output_tokens``, ``time_per_output_token``,
  ``latency_s``, ``meta_info``;
* the DDTree reference ``benchmark.py`` ``.pt`` file: ``{"responses": [{method: record}, ...],
  "block_size", "args", ...}`` where each record is a ``types.SimpleNamespace`` (or, from our
  offline engine, a dict) whose ``output_ids`` is a ``[1, prompt + output]`` tensor (the prompt is
  stripped here using ``num_input_tokens``).

``.pt`` files are loaded with ``torch.load(weights_only=True)`` and an explicit allow-list
(:data:`PT_SAFE_GLOBALS`): a baseline file can never execute code. Anything outside the list is
refused with a :class:`~ddtree_deploy.errors.UsageError` naming the offending globals.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from ddtree_deploy.errors import UsageError

METHOD_BASELINE = "baseline"
METHOD_DFLASH = "dflash"
_DDTREE_RE = re.compile(r"^ddtree_tb(\d+)$")


def ddtree_method(budget: int) -> str:
    return f"ddtree_tb{int(budget)}"


def method_budget(method: str) -> int | None:
    m = _DDTREE_RE.match(method)
    return int(m.group(1)) if m else None


def dataset_key(name: str) -> str:
    """Case- and punctuation-insensitive dataset key ("MT-Bench" == "mt_bench" == "mtbench")."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@dataclass
class RunRecord:
    dataset: str
    method: str
    budget: int | None
    prompt_index: int
    output_ids: list[int]
    acceptance_lengths: list[int] | None = None
    accept_length_mean: float | None = None
    verify_ct: int | None = None
    num_output_tokens: int = 0
    time_per_output_token: float | None = None
    latency_s: float | None = None
    meta_info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("time_per_output_token", "latency_s", "accept_length_mean"):
            v = d[k]
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d

    @property
    def tau(self) -> float | None:
        """Mean acceptance length of this request (tokens per verify step, bonus included)."""
        if self.acceptance_lengths:
            return sum(self.acceptance_lengths) / len(self.acceptance_lengths)
        if self.method == METHOD_BASELINE:
            return 1.0  # target-only decoding: one token per step by definition
        if self.accept_length_mean is not None:
            return float(self.accept_length_mean)
        if self.verify_ct:
            return self.num_output_tokens / self.verify_ct
        return None


# --- JSONL ------------------------------------------------------------------------------------


_REQUIRED = ("dataset", "method", "prompt_index", "output_ids")


def record_from_json(obj: dict[str, Any], *, where: str = "") -> RunRecord:
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise UsageError(f"{where}: run record lacks {', '.join(missing)}")
    ids = obj["output_ids"]
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise UsageError(f"{where}: output_ids must be a list of ints")
    al = obj.get("acceptance_lengths")
    budget = obj.get("budget")
    if budget is None:
        budget = method_budget(str(obj["method"]))
    return RunRecord(
        dataset=str(obj["dataset"]),
        method=str(obj["method"]),
        budget=None if budget is None else int(budget),
        prompt_index=int(obj["prompt_index"]),
        output_ids=list(ids),
        acceptance_lengths=None if al is None else [int(a) for a in al],
        accept_length_mean=_opt_float(obj.get("accept_length_mean")),
        verify_ct=None if obj.get("verify_ct") is None else int(obj["verify_ct"]),
        num_output_tokens=int(obj.get("num_output_tokens", len(ids))),
        time_per_output_token=_opt_float(obj.get("time_per_output_token")),
        latency_s=_opt_float(obj.get("latency_s")),
        meta_info=dict(obj.get("meta_info") or {}),
    )


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line of a JSONL file; bad JSON is a UsageError."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{lineno}: not JSON: {exc}") from None


def read_jsonl(path: Path) -> list[RunRecord]:
    out: list[RunRecord] = []
    for lineno, obj in iter_jsonl(path):
        if not isinstance(obj, dict):
            raise UsageError(f"{path}:{lineno}: a run record must be a JSON object")
        out.append(record_from_json(obj, where=f"{path}:{lineno}"))
    return out


def write_jsonl(path: Path, records: Iterable[RunRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")


def append_jsonl(fh: IO[str], record: RunRecord) -> None:
    fh.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
    fh.flush()


# --- the reference .pt format -----------------------------------------------------------------


def _pt_safe_globals() -> list[Any]:
    import types

    allowed: list[Any] = [types.SimpleNamespace]
    try:  # numpy scalars (e.g. np.float64 timings) are plain data; allow their reconstructors
        import numpy as np

        core = getattr(np, "_core", None) or np.core
        allowed += [core.multiarray.scalar, np.dtype]
        allowed += [
            getattr(np.dtypes, n) for n in ("Float64DType", "Float32DType", "Int64DType", "Int32DType") if hasattr(np.dtypes, n)
        ]
    except Exception:  # pragma: no cover - numpy absent
        pass
    return allowed


#: The only non-builtin globals a baseline ``.pt`` may reference (beyond torch's own tensor
#: rebuilders, which ``weights_only=True`` already allows).
PT_SAFE_GLOBALS = ("types.SimpleNamespace", "numpy scalar + dtype reconstructors")


def load_pt(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True`` and our allow-list. Never executes pickled code."""
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals(_pt_safe_globals()):
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        unsafe: list[str] = []
        try:
            unsafe = list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
        except Exception:
            pass
        what = f" (it references {', '.join(unsafe)})" if unsafe else ""
        raise UsageError(
            f"{path}: refused to load: not a plain-data baseline{what}. Baselines are loaded with "
            f"torch.load(weights_only=True) and only these extra types are allowed: "
            f"{', '.join(PT_SAFE_GLOBALS)}. First error: {str(exc).splitlines()[0][:200]}",
            hint="convert the file to our JSONL run-record format on a machine where you trust it",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable torch .pt file: {exc}") from None


def _field(rec: Any, name: str, default: Any = None) -> Any:
    if isinstance(rec, dict):
        return rec.get(name, default)
    return getattr(rec, name, default)


def _ids_list(x: Any) -> list[int]:
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return [int(t) for t in x.reshape(-1).tolist()]
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, (list, tuple)):
        flat: list[int] = []
        for t in x:
            if isinstance(t, (list, tuple)):
                flat.extend(int(u) for u in t)
            else:
                flat.append(int(t))
        return flat
    raise UsageError(f"output_ids of unsupported type {type(x).__name__}")


def _opt_float(x: Any) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v


def records_from_reference(data: Any, *, source: str, dataset: str | None = None) -> list[RunRecord]:
    """Flatten a reference ``benchmark.py`` run (``{"responses": [...]}``) into run records."""
    if not isinstance(data, dict) or "responses" not in data:
        raise UsageError(f"{source}: not a DDTree reference run (no 'responses' key)")
    args = data.get("args") or {}
    if not isinstance(args, dict):
        args = vars(args) if hasattr(args, "__dict__") else {}
    ds = dataset or args.get("dataset") or data.get("dataset") or Path(source).stem
    out: list[RunRecord] = []
    for idx, response in enumerate(data["responses"]):
        if not isinstance(response, dict):
            raise UsageError(f"{source}: responses[{idx}] is not a dict of method -> record")
        for method, rec in response.items():
            ids = _ids_list(_field(rec, "output_ids", []))
            n_in = _field(rec, "num_input_tokens")
            n_out = _field(rec, "num_output_tokens")
            n_in = None if n_in is None else int(n_in)
            n_out = None if n_out is None else int(n_out)
            # Reference output_ids hold prompt + output; our offline engine's hold only the output.
            if n_in is not None and n_out is not None and len(ids) == n_in + n_out and n_in > 0:
                ids = ids[n_in:]
            elif n_in is not None and n_out is None and len(ids) > n_in:
                ids = ids[n_in:]
            al = _field(rec, "acceptance_lengths")
            al_list = None if al is None else [int(a) for a in _ids_list(al)]
            out.append(
                RunRecord(
                    dataset=str(ds),
                    method=str(method),
                    budget=method_budget(str(method)),
                    prompt_index=idx,
                    output_ids=ids,
                    acceptance_lengths=al_list,
                    accept_length_mean=(sum(al_list) / len(al_list)) if al_list else None,
                    verify_ct=_field(rec, "decode_rounds") if al_list is None else len(al_list),
                    num_output_tokens=len(ids) if n_out is None else n_out,
                    time_per_output_token=_opt_float(_field(rec, "time_per_output_token")),
                    latency_s=None,
                    meta_info={"source": "reference-pt", "num_input_tokens": n_in},
                )
            )
    return out


def load_records(path: str | Path) -> list[RunRecord]:
    """Read a ``.pt`` reference run, a ``.jsonl`` run, or every such file in a directory."""
    p = Path(path)
    if p.is_dir():
        files = sorted(list(p.glob("*.jsonl")) + list(p.glob("*.pt")))
        if not files:
            raise UsageError(f"{p}: no *.jsonl or *.pt files in this directory")
        out: list[RunRecord] = []
        for f in files:
            out.extend(load_records(f))
        return out
    if not p.exists():
        raise UsageError(f"{p}: no such file")
    if p.suffix == ".pt" or p.suffix == ".pth":
        return records_from_reference(load_pt(p), source=str(p))
    return read_jsonl(p)


def iter_groups(records: Iterable[RunRecord]) -> Iterator[tuple[tuple[str, str], dict[int, RunRecord]]]:
    groups: dict[tuple[str, str], dict[int, RunRecord]] = {}
    for r in records:
        groups.setdefault((r.dataset, r.method), {})[r.prompt_index] = r
    yield from groups.items()
