"""Run the DDTree reference's own decode loops on a trained pair and save ``benchmark.py``-format runs.

What it runs: the reference implementation (liranringel/ddtree, a checkout given by ``--ref``; it is
imported from there, never copied here) on a pair written by ``train_pair.py`` (``--pair`` holds
``target/``, ``draft/`` and ``heldout_prompts.json``). For each held-out prompt, in file order, it
calls exactly what ``benchmark.py`` calls, with the same arguments:

- ``baseline``: ``dflash_generate(..., block_size=1)`` (target-only greedy/sampled decoding; this is how
  ``benchmark.py`` makes its baseline, and the name it stores it under);
- ``dflash``: ``dflash_generate(..., block_size=B)`` with ``B = --block-size`` or the draft's block size;
- ``ddtree_tb{N}``: ``ddtree_generate(..., block_size=B, tree_budget=N)`` for each ``--budgets`` N;

all with ``mask_token_id=draft.mask_token_id``, ``stop_token_ids=[tokenizer.eos_token_id]``,
``max_new_tokens``, ``temperature``, after the same seeds (``random``/``numpy``/``torch`` = 0) and the same
warm-up calls (one short call per method). Prompts are the pair's ``input_ids`` as they are (no
re-tokenization, no chat template; ``benchmark.py`` renders dataset turns with the chat template instead).

What it writes under ``--out``:

- ``{dataset}__{pair}_target__{pair}_draft__temp{T}__sdpa.pt`` (the ``run_benchmark.sh`` naming; ``sdpa``
  is its name for the non-flash-attn target mode, the only one that runs DDTree): ``torch.save`` of
  ``{"responses": [{method: SimpleNamespace}, ...], "block_size", "draft_attn_implementation",
  "target_attn_implementation", "args"}``, one response dict per prompt, each record being what the
  reference function returned (``output_ids`` = ``[1, prompt + output]`` CPU tensor, ``num_input_tokens``,
  ``num_output_tokens``, ``time_to_first_token``, ``time_per_output_token``, ``acceptance_lengths``,
  ``decode_rounds``, ``stage_times``, ``round_timestamps`` (+ ``round_trees`` for DDTree)). ``args`` has
  ``benchmark.py``'s keys (``dataset`` = ``--dataset-name``, which ``ddtree-deploy compare`` uses as the
  dataset key; match it to the name of the SGLang run's dataset) plus this script's own;
- ``summary.json``: per method, tau (mean over prompts of the per-prompt mean acceptance length, as the
  reference's ``make_latex_table.py`` computes it), mean TPOT, tokens/s, speedup over ``baseline``
  (baseline mean TPOT / method mean TPOT, as ``make_latex_table.py``), prompts, and prompts whose output
  equals the baseline's.

Use one ``--out`` per temperature: ``ddtree-deploy compare`` reads every ``.pt`` of a directory and
groups records by (dataset, method), and ``summary.json`` is rewritten by each run.

Then check it (at T=0 every method must equal target-only decoding token for token)::

    .venv/bin/ddtree-deploy compare OUT OUT --against baseline

Usage (a CPU smoke on the tiny pair takes about a minute; on a GPU use ``--device cuda``)::

    .venv/bin/python tools/real_pair/run_reference.py --pair /tmp/pair-tiny --ref /tmp/ddref \\
        --out /tmp/ref-out --budgets 16,64 --num-prompts 4 --max-new-tokens 32 --device cpu

What differs from ``benchmark.py``, and why the tokens do not change:

- ``datasets``: the reference's ``model/utils.py`` imports it at module top (only for
  ``load_and_process_dataset``, which is never called here). If it is not installed, an in-memory
  stand-in module is registered under that name (its ``load_dataset`` raises); it is an import
  stand-in only (the same thing as ``/tmp/refstub/datasets.py``).
- no ``torch.distributed`` (one process; ``benchmark.py``'s ``dist.init`` is a no-op without ``RANK``).
- ``--device cpu`` only: ``dflash.py``'s ``cuda_time()`` (``torch.cuda.synchronize()`` then
  ``time.perf_counter()``) raises on a machine without a CUDA device; it is used by both ``dflash.py``
  and ``ddtree.py`` (imported by name), so both modules' ``cuda_time`` are replaced by plain
  ``time.perf_counter()``. It only feeds timing fields; on CPU there is no asynchronous work to wait for.
- ``--device cpu`` (or no ``flash_attn``): the draft runs with ``sdpa`` instead of ``flash_attention_2``
  (``benchmark.py`` insists on flash-attn). The draft calls attention with ``attention_mask=None`` and
  ``is_causal=False``, so both compute the same full (non-causal) attention over context + block;
  only the kernel differs (floating-point rounding, not the math). The target uses ``sdpa`` as in
  ``benchmark.py``'s DDTree mode.
- the C++ KV-cache compaction extension (``maybe_enable_cpp_compact``) is built as in ``benchmark.py``
  unless ``--disable-cpp-compact-cache`` (the reference's own flag) is given; it is a CPU extension, and
  the reference falls back to its Python path (the same ``index_select`` + ``copy_``) if it cannot build.
- warm-up prompt: the first held-out prompt instead of a chat-templated "Warmup" (timing only).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

DEFAULT_REF = "/tmp/ddref"


def _slug(value: str) -> str:
    """``run_benchmark.sh``'s ``slugify``: ``/``, ``:`` and spaces become ``_``."""
    return value.replace("/", "_").replace(":", "_").replace(" ", "_")


def _int_list(text: str) -> list[int]:
    vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    if not vals or any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated non-negative integers, got {text!r}")
    return vals


def _host_time() -> float:
    """Stand-in for the reference's ``cuda_time()`` on CPU: the same clock, without the CUDA sync."""
    return time.perf_counter()


def import_reference(ref: Path, device: str) -> tuple[types.ModuleType, types.ModuleType, Any]:
    """Import the reference's ``dflash``, ``ddtree`` and ``model.DFlashDraftModel`` from ``ref``."""
    for name in ("ddtree.py", "dflash.py", "model/__init__.py", "model/utils.py"):
        if not (ref / name).is_file():
            raise SystemExit(f"--ref {ref}: no {name} (expected a checkout of liranringel/ddtree)")
    try:
        import datasets  # noqa: F401
    except ImportError:  # import stand-in: model/utils.py imports it only for load_and_process_dataset
        stub = types.ModuleType("datasets")

        def load_dataset(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError("datasets is an import stand-in here (run_reference.py)")

        stub.load_dataset = load_dataset  # type: ignore[attr-defined]
        stub.Features = stub.Sequence = stub.Value = object  # type: ignore[attr-defined]
        sys.modules["datasets"] = stub
    for clash in ("model", "dflash", "ddtree"):
        if clash in sys.modules:
            raise SystemExit(f"a module named {clash!r} is already imported; cannot import the reference's")
    sys.path.insert(0, str(ref))
    import ddtree as ddtree_mod
    import dflash as dflash_mod
    from model import DFlashDraftModel

    for mod in (ddtree_mod, dflash_mod):
        origin = Path(str(getattr(mod, "__file__", ""))).resolve()
        if origin.parent != ref.resolve():
            raise SystemExit(f"imported {mod.__name__} from {origin}, not from --ref {ref}")
    if device == "cpu":  # the CPU shim (see the module docstring): timing only
        dflash_mod.cuda_time = _host_time
        ddtree_mod.cuda_time = _host_time
    return dflash_mod, ddtree_mod, DFlashDraftModel


def load_prompts(path: Path, n: int | None) -> list[list[int]]:
    items = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(items, list) or not all(isinstance(it, dict) and "input_ids" in it for it in items):
        raise SystemExit(f"{path}: expected a list of {{'file', 'input_ids', 'text'}} objects")
    prompts = [[int(t) for t in it["input_ids"]] for it in items]
    return prompts if n is None else prompts[:n]


def summarize(responses: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per-method figures, computed the way the reference's ``make_latex_table.py`` does."""

    def gen(rec: Any) -> list[int]:
        return [int(t) for t in rec.output_ids[0, rec.num_input_tokens :].tolist()]

    out: dict[str, dict[str, Any]] = {}
    base_tpot = float(np.mean([r["baseline"].time_per_output_token for r in responses]))
    for m in methods:
        recs = [r[m] for r in responses]
        tpot = float(np.mean([rec.time_per_output_token for rec in recs]))
        n_out = sum(int(rec.num_output_tokens) for rec in recs)
        decode_s = sum(float(rec.time_per_output_token) * max(int(rec.num_output_tokens), 1) for rec in recs)
        out[m] = {
            "tau": float(np.mean([np.mean(rec.acceptance_lengths) for rec in recs])),
            "mean_tpot_s": tpot,
            "tokens_per_s": n_out / decode_s if decode_s > 0 else None,
            "speedup_vs_baseline": base_tpot / tpot if tpot > 0 else None,
            "num_prompts": len(recs),
            "num_output_tokens": n_out,
            "matches_baseline": sum(gen(r[m]) == gen(r["baseline"]) for r in responses),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", type=Path, required=True, help="holds target/, draft/, heldout_prompts.json")
    ap.add_argument("--ref", type=Path, default=Path(DEFAULT_REF), help=f"liranringel/ddtree checkout (default {DEFAULT_REF})")
    ap.add_argument("--out", type=Path, required=True, help="output directory (.pt + summary.json)")
    ap.add_argument("--budgets", type=_int_list, default=_int_list("16,32,64,128,256,512"), help="DDTree tree budgets")
    ap.add_argument("--num-prompts", type=int, default=None, help="first N held-out prompts (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--block-size", type=int, default=None, help="default: the draft's block_size (benchmark.py's default)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="benchmark.py uses bfloat16")
    ap.add_argument("--dataset-name", default="heldout", help="args['dataset'] in the .pt (compare's dataset key)")
    ap.add_argument("--disable-cpp-compact-cache", action="store_true", help="benchmark.py's flag of the same name")
    args = ap.parse_args(argv)

    ref = args.ref.resolve()
    dflash_mod, ddtree_mod, DFlashDraftModel = import_reference(ref, args.device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    if args.device == "cuda":
        torch.cuda.manual_seed_all(0)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    ddtree_mod.maybe_enable_cpp_compact(not args.disable_cpp_compact_cache)

    try:
        import flash_attn  # noqa: F401

        has_flash = True
    except ImportError:
        has_flash = False
    target_attn = "sdpa"
    draft_attn = "flash_attention_2" if args.device == "cuda" and has_flash else "sdpa"

    target = AutoModelForCausalLM.from_pretrained(str(args.pair / "target"), attn_implementation=target_attn, dtype=dtype)
    target = target.to(device).eval()
    draft = DFlashDraftModel.from_pretrained(str(args.pair / "draft"), attn_implementation=draft_attn, dtype=dtype)
    draft = draft.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(args.pair / "target"))
    block_size = args.block_size if args.block_size is not None else int(draft.block_size)
    prompts = load_prompts(args.pair / "heldout_prompts.json", args.num_prompts)
    if not prompts:
        raise SystemExit("no prompts")

    budget_of = {f"ddtree_tb{b}": b for b in args.budgets}
    methods = ["dflash", *budget_of]
    common = dict(
        model=draft,
        target=target,
        mask_token_id=draft.mask_token_id,
        stop_token_ids=[tokenizer.eos_token_id],
        temperature=args.temperature,
    )

    def call(method: str, input_ids: torch.Tensor, max_new_tokens: int) -> Any:
        kw: dict[str, Any] = dict(common, input_ids=input_ids, max_new_tokens=max_new_tokens)
        if method == "baseline":
            return dflash_mod.dflash_generate(**kw, block_size=1)
        if method == "dflash":
            return dflash_mod.dflash_generate(**kw, block_size=block_size)
        return ddtree_mod.ddtree_generate(**kw, block_size=block_size, tree_budget=budget_of[method])

    def as_input(ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.long, device=device)

    t0 = time.perf_counter()
    warm = as_input(prompts[0])
    for m in ["baseline", *methods]:  # benchmark.py's warm-up: one short call per method
        call(m, warm, min(args.max_new_tokens, 16))

    responses: list[dict[str, Any]] = []
    for i, ids in enumerate(prompts):
        x = as_input(ids)
        responses.append({m: call(m, x, args.max_new_tokens) for m in ["baseline", *methods]})
        print(f"prompt {i + 1}/{len(prompts)} done ({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)

    pair_name = args.pair.resolve().name
    temp = str(float(args.temperature))
    args.out.mkdir(parents=True, exist_ok=True)
    models = f"{_slug(pair_name + '/target')}__{_slug(pair_name + '/draft')}"
    pt_path = args.out / f"{args.dataset_name}__{models}__temp{_slug(temp)}__sdpa.pt"
    run_args = {  # benchmark.py's vars(args) keys, then this script's
        "model_name_or_path": str(args.pair / "target"),
        "draft_name_or_path": str(args.pair / "draft"),
        "block_size": args.block_size,
        "tree_budget": ",".join(str(b) for b in args.budgets),
        "dataset": args.dataset_name,
        "max_samples": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "flash_attn": False,
        "disable_cpp_compact_cache": bool(args.disable_cpp_compact_cache),
        "save_path": str(pt_path),
        "runner": "tools/real_pair/run_reference.py",
        "ref": str(ref),
        "pair": str(args.pair),
        "device": args.device,
        "dtype": args.dtype,
    }
    run_data = {
        "responses": responses,
        "block_size": block_size,
        "draft_attn_implementation": draft_attn,
        "target_attn_implementation": target_attn,
        "args": run_args,
    }
    torch.save(run_data, pt_path)

    table = summarize(responses, ["baseline", *methods])
    summary = {"pt": pt_path.name, "args": run_args, "block_size": block_size, "wall_s": time.perf_counter() - t0}
    summary["methods"] = table
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")

    print(f"{'method':<14} {'tau':>6} {'tok/s':>9} {'TPOT ms':>9} {'speedup':>8} {'prompts':>8} {'=baseline':>10}")
    for m, s in table.items():
        tps = "-" if s["tokens_per_s"] is None else f"{s['tokens_per_s']:.1f}"
        sp = "-" if s["speedup_vs_baseline"] is None else f"{s['speedup_vs_baseline']:.2f}x"
        print(
            f"{m:<14} {s['tau']:>6.2f} {tps:>9} {s['mean_tpot_s'] * 1e3:>9.2f} {sp:>8} {s['num_prompts']:>8}"
            f" {s['matches_baseline']:>5}/{s['num_prompts']}"
        )
    print(f"wrote {pt_path} and {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
