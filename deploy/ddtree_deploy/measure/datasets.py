"""Benchmark prompts: local JSONL files, or the usual datasets from a host's local HF cache.

Prompt formats are those of the DFlash/DDTree reference benchmark (``load_and_process_dataset``
in the DFlash ``model/utils.py`` that the DDTree ``benchmark.py`` imports as ``from model import
load_and_process_dataset``). Each dataset row becomes a list of user turns; each turn is rendered
with the target's chat template (``add_generation_prompt=True, enable_thinking=False``) and
encoded with ``tokenizer.encode`` (default special tokens), exactly as ``benchmark.py`` does.
See ``docs/bench.md`` for what could and could not be verified.

Nothing here touches the network: HF datasets are read with ``HF_DATASETS_OFFLINE=1`` /
``HF_HUB_OFFLINE=1`` from the local cache only, tokenizers with ``local_files_only=True``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ddtree_deploy.errors import UsageError
from ddtree_deploy.measure.records import iter_jsonl

_REASON = "\nPlease reason step by step, and put your final answer within \\boxed{{}}."

#: name -> (HF dataset id, config, split, how a row becomes its list of user turns).
#: The format strings are the reference's, character for character.
REFERENCE_DATASETS: dict[str, tuple[str, str | None, str, Callable[[dict[str, Any]], list[str]]]] = {
    "gsm8k": ("openai/gsm8k", "main", "test", lambda x: [("{question}" + _REASON).format(**x)]),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", lambda x: [("{problem}" + _REASON).format(**x)]),
    "aime24": ("HuggingFaceH4/aime_2024", None, "train", lambda x: [("{problem}" + _REASON).format(**x)]),
    "aime25": ("MathArena/aime_2025", None, "train", lambda x: [("{problem}" + _REASON).format(**x)]),
    "alpaca": (
        "tatsu-lab/alpaca",
        None,
        "train",
        lambda x: [f"{x['instruction']}\n\nInput:\n{x['input']}" if x["input"] else x["instruction"]],
    ),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train", lambda x: list(x["prompt"])),
    "humaneval": (
        "openai/openai_humaneval",
        None,
        "test",
        lambda x: [
            "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```".format(
                **x
            )
        ],
    ),
    "mbpp": ("google-research-datasets/mbpp", "sanitized", "test", lambda x: [x["prompt"]]),
}

_ALIASES = {
    "math-500": "math500",
    "math_500": "math500",
    "mtbench": "mt-bench",
    "mt_bench": "mt-bench",
    "human-eval": "humaneval",
    "human_eval": "humaneval",
}


@dataclass
class Instance:
    """One dataset row: its user turns (text) or its raw token ids (no chat template)."""

    dataset: str
    first_prompt_index: int  # prompt_index of its first turn (the reference counts each turn)
    turns: list[str] = field(default_factory=list)
    input_ids: list[int] | None = None

    @property
    def n_turns(self) -> int:
        return 1 if self.input_ids is not None else len(self.turns)


def canonical_name(name: str) -> str:
    n = name.strip().lower()
    return _ALIASES.get(n, n)


def _row_to_instance(obj: Any, dataset: str, where: str) -> tuple[list[str], list[int] | None]:
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: each line must be a JSON object")
    if "input_ids" in obj:
        ids = obj["input_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise UsageError(f"{where}: input_ids must be a non-empty list of ints")
        return [], list(ids)
    if "turns" in obj:
        turns = obj["turns"]
        if isinstance(turns, str):
            turns = [turns]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise UsageError(f"{where}: turns must be a non-empty list of strings")
        return list(turns), None
    for key in ("prompt", "text", "question", "instruction"):
        if isinstance(obj.get(key), str):
            return [obj[key]], None
    raise UsageError(f"{where}: needs one of input_ids, turns, prompt, text, question, instruction")


def load_jsonl_prompts(path: Path, limit: int | None, name: str | None = None) -> list[Instance]:
    """Prompts from a local JSONL file: the first ``limit`` lines, in file order."""
    ds = name or path.stem
    out: list[Instance] = []
    idx = 0
    for lineno, obj in iter_jsonl(path):
        if limit is not None and len(out) >= limit:
            break
        turns, ids = _row_to_instance(obj, ds, f"{path}:{lineno}")
        inst = Instance(ds, idx, turns, ids)
        out.append(inst)
        idx += inst.n_turns
    if not out:
        raise UsageError(f"{path}: no prompts")
    return out


def load_hf_prompts(name: str, limit: int | None) -> list[Instance]:
    """A reference dataset from the LOCAL Hugging Face cache (never downloads).

    Selection is the reference's: if the set is larger than ``limit``,
    ``dataset.shuffle(seed=0).select(range(limit))``.
    """
    name = canonical_name(name)
    if name not in REFERENCE_DATASETS:
        raise UsageError(f"unknown dataset {name!r}: use one of {', '.join(REFERENCE_DATASETS)} or a path to a .jsonl file")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError:
        raise UsageError(
            f"dataset {name!r} needs the `datasets` package and a local HF cache of it on this machine",
            hint=f'pass a local JSONL file instead: --dataset path/to/{name}.jsonl (one {{"turns": [...]}} per line)',
        ) from None
    hf_id, config, split, fmt = REFERENCE_DATASETS[name]
    try:
        ds = datasets.load_dataset(hf_id, config, split=split) if config else datasets.load_dataset(hf_id, split=split)
    except Exception as exc:
        raise UsageError(
            f"dataset {name!r} ({hf_id}) is not in the local HF cache: {str(exc).splitlines()[0][:200]}",
            hint=f"pass a local JSONL file instead: --dataset path/to/{name}.jsonl",
        ) from None
    if limit is not None and len(ds) > limit:
        ds = ds.shuffle(seed=0).select(range(limit))
    out: list[Instance] = []
    idx = 0
    for row in ds:
        inst = Instance(name, idx, fmt(row), None)
        out.append(inst)
        idx += inst.n_turns
    return out


def load_prompts(spec: str, limit: int | None) -> list[Instance]:
    """``spec`` is a path to a ``.jsonl`` file (dataset name = file stem, or ``NAME=PATH``) or a
    reference dataset name."""
    name = None
    if "=" in spec and not spec.startswith(("/", ".")):
        name, spec = spec.split("=", 1)
    p = Path(spec).expanduser()
    if p.suffix == ".jsonl" or p.exists():
        if not p.exists():
            raise UsageError(f"--dataset {spec}: no such file")
        return load_jsonl_prompts(p, limit, name)
    return load_hf_prompts(spec, limit)


class ChatRenderer:
    """Renders user turns the way the reference benchmark does (local tokenizer only)."""

    def __init__(self, tokenizer_path: str):
        p = Path(tokenizer_path).expanduser()
        if not p.exists():
            raise UsageError(f"--tokenizer {tokenizer_path}: no such local file or directory")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        return list(self.tok.encode(text))

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))
