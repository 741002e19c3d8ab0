"""Command line: ``python -m ddtree_offline {run,sweep,corebench}``.

``run``   decodes N synthetic prompts with each method/budget, checks losslessness against the
          baseline, and writes (a) JSONL in the contract's "Run records" format and (b) a ``.pt``
          in the reference ``benchmark.py`` format
          ``{responses: [{"baseline": rec, "dflash": rec, "ddtree_tb{B}": rec}, ...], block_size,
          draft_attn_implementation, target_attn_implementation, args}`` (plain dicts / lists /
          numbers / tensors only, loadable with ``torch.load(weights_only=True)``).
``sweep`` runs the synthetic drafter at several quality levels x budgets and writes a markdown
          table and a PNG plot (tau and tokens/s vs budget).
``corebench`` times one round's non-model DDTree work (top-k, tree build, mask, sampling, accept).

Models are random-weight (built from a config; nothing is downloaded) unless ``--checkpoint``
points at a LOCAL Hugging Face checkpoint directory.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
from pathlib import Path

import torch

from .drafters import SyntheticDrafter
from .engine import OfflineEngine, generated_tokens
from .models import load_checkpoint, model_summary, tiny_target

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _float_list(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--checkpoint", default=None, help="local HF checkpoint dir (default: random tiny model)")
    g.add_argument("--arch", default="llama", choices=["llama", "qwen3"])
    g.add_argument("--vocab", type=int, default=512)
    g.add_argument("--hidden", type=int, default=64)
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--kv-heads", type=int, default=2)
    g.add_argument("--intermediate", type=int, default=None, help="default 2 x hidden")
    g.add_argument("--model-seed", type=int, default=0)
    g.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    g.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    g.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    g.add_argument("--threads", type=int, default=None, help="torch intra-op threads (tiny CPU models run fastest with 1)")
    d = p.add_argument_group("drafter / decoding")
    d.add_argument("--block-size", type=int, default=16)
    d.add_argument("--drafter-seed", type=int, default=1)
    d.add_argument("--drafter-mode", default="calibrated", choices=["calibrated", "mass"])
    d.add_argument("--jitter", type=float, default=1.5)
    d.add_argument("--num-prompts", type=int, default=4)
    d.add_argument("--prompt-len", type=int, default=32)
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument("--temperature", type=float, default=0.0)
    d.add_argument("--seed", type=int, default=0, help="sampling seed (T > 0)")
    d.add_argument("--topk-cap", type=int, default=None)
    d.add_argument("--no-warmup", action="store_true")


def build_target(args):
    """The target model for ``args`` (random tiny model or a local checkpoint)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = _DTYPES[args.dtype]
    if args.checkpoint:
        return load_checkpoint(args.checkpoint, dtype=dtype, device=args.device, attn_implementation=args.attn)
    return tiny_target(
        seed=args.model_seed,
        vocab=args.vocab,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate=args.intermediate or 2 * args.hidden,
        arch=args.arch,
        dtype=dtype,
        device=args.device,
        attn_implementation=args.attn,
    )


def synthetic_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """``n`` random prompts (token ids), deterministic in ``seed``; lengths vary in [length/2, length]."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ln = int(torch.randint(max(1, length // 2), length + 1, (), generator=g))
        out.append(torch.randint(0, vocab, (ln,), generator=g).tolist())
    return out


def method_key(method: str, budget: int | None) -> str:
    return f"ddtree_tb{budget}" if method == "ddtree" else ("baseline" if method == "target" else method)


def run_record(rec: dict, key: str, budget: int | None, prompt_index: int, dataset: str, extra: dict) -> dict:
    """A contract "Run records" JSONL object from an engine record (output_ids: generated only)."""
    acc = None if key == "baseline" else [int(a) for a in rec["acceptance_lengths"]]
    n = int(rec["num_output_tokens"])
    latency = float(rec["time_to_first_token"]) + float(rec["time_per_output_token"]) * n
    meta = {
        "engine": "ddtree_offline",
        "num_input_tokens": int(rec["num_input_tokens"]),
        "time_to_first_token": float(rec["time_to_first_token"]),
        "decode_rounds": int(rec["decode_rounds"]),
        "stage_times": {k: float(v) for k, v in rec["stage_times"].items()},
        **extra,
    }
    if "predicted_acceptance" in rec:
        meta["predicted_acceptance_mean"] = _mean(rec["predicted_acceptance"])
        meta["tree_size_mean"] = _mean(rec["tree_sizes"])
    return {
        "dataset": dataset,
        "method": key,
        "budget": budget,
        "prompt_index": prompt_index,
        "output_ids": generated_tokens(rec),
        "acceptance_lengths": acc,
        "accept_length_mean": _mean(acc) if acc else None,
        "verify_ct": int(rec["decode_rounds"]),
        "num_output_tokens": n,
        "time_per_output_token": float(rec["time_per_output_token"]),
        "latency_s": latency,
        "meta_info": meta,
    }


def _mean(xs):
    xs = list(xs or [])
    return float(sum(xs) / len(xs)) if xs else None


def _plain(obj):
    """Make ``obj`` safe for torch.load(weights_only=True) / JSON: dicts, lists, numbers, str, tensors."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (bool, int, float, str)) or obj is None or isinstance(obj, torch.Tensor):
        return obj
    return str(obj)


def _environment(device: str) -> dict:
    import transformers

    env = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name(torch.device(device))
    else:
        env["device_name"] = "cpu"
    return env


def _make_engine(args, target, quality):
    drafter = SyntheticDrafter(target, quality=quality, seed=args.drafter_seed, jitter=args.jitter, mode=args.drafter_mode)
    return OfflineEngine(target, drafter, block_size=args.block_size, device=args.device)


def _warmup(eng, args, budgets):
    p = list(range(8))
    eng.generate(p, "target", max_new_tokens=8, temperature=args.temperature, seed=args.seed)
    eng.generate(p, "dflash", max_new_tokens=8, temperature=args.temperature, seed=args.seed)
    for b in budgets:
        eng.generate(p, "ddtree", budget=b, max_new_tokens=8, temperature=args.temperature, seed=args.seed)


# ---------------------------------------------------------------------------------------------
def cmd_run(args) -> int:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    methods = ["target" if m == "baseline" else m for m in methods]
    for m in methods:
        if m not in ("target", "dflash", "ddtree"):
            raise SystemExit(f"unknown method {m!r}")
    budgets = _int_list(args.budgets)
    target = build_target(args)
    eng = _make_engine(args, target, args.quality)
    if not args.no_warmup:
        _warmup(eng, args, budgets if "ddtree" in methods else [])
    prompts = synthetic_prompts(args.num_prompts, args.prompt_len, int(target.config.vocab_size), args.prompt_seed)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = Path(args.jsonl) if args.jsonl else out_dir / "records.jsonl"
    pt = Path(args.pt) if args.pt else out_dir / "run.pt"
    extra = {
        "temperature": args.temperature,
        "seed": args.seed,
        "quality": args.quality,
        "block_size": args.block_size,
        "synthetic": args.checkpoint is None,
    }
    responses = []
    mismatches = 0
    plan = [("target", None)] if "target" in methods else []
    plan += [("dflash", None)] if "dflash" in methods else []
    plan += [("ddtree", b) for b in budgets] if "ddtree" in methods else []
    with open(jsonl, "w") as fh:
        for i, prompt in enumerate(prompts):
            response = {}
            ref = None
            for m, b in plan:
                rec = eng.generate(
                    prompt,
                    m,
                    budget=b or 0,
                    topk_cap=args.topk_cap,
                    max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature,
                    seed=args.seed,
                )
                key = method_key(m, b)
                toks = generated_tokens(rec)
                if ref is None:
                    ref = toks
                elif toks != ref:
                    mismatches += 1
                    print(f"LOSSLESS VIOLATION: prompt {i} {key} differs from {plan[0][0]}", file=sys.stderr)
                response[key] = _plain(rec)
                fh.write(json.dumps(run_record(rec, key, b, i, args.dataset, extra)) + "\n")
            responses.append(response)
    ns = {k: _plain(v) for k, v in vars(args).items() if k != "func"}
    run_data = {
        "responses": responses,
        "block_size": args.block_size,
        "draft_attn_implementation": "synthetic",
        "target_attn_implementation": args.attn,
        "args": ns,
    }
    torch.save(run_data, pt)
    print(
        json.dumps(
            {
                "jsonl": str(jsonl),
                "pt": str(pt),
                "prompts": len(prompts),
                "methods": [method_key(m, b) for m, b in plan],
                "lossless_mismatches": mismatches,
            }
        )
    )
    return 1 if mismatches else 0


# ---------------------------------------------------------------------------------------------
def cmd_sweep(args) -> int:
    qualities = _float_list(args.qualities)
    budgets = _int_list(args.budgets)
    target = build_target(args)
    prompts = synthetic_prompts(args.num_prompts, args.prompt_len, int(target.config.vocab_size), args.prompt_seed)
    env = _environment(args.device)
    base_eng = _make_engine(args, target, 1.0)
    if not args.no_warmup:
        _warmup(base_eng, args, budgets)
    gen = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, topk_cap=args.topk_cap)
    base = [base_eng.generate(p, "target", **gen) for p in prompts]
    base_tpot = _mean(r["time_per_output_token"] for r in base)
    b_rounds = sum(r["decode_rounds"] for r in base)
    b_stage = {
        k: 1e3 * sum(r["stage_times"][k] for r in base) / max(b_rounds, 1) for k in ("draft", "tree_build", "verify", "commit")
    }
    rows = [
        {
            "stage_ms_per_round": b_stage,
            "quality": None,
            "method": "baseline",
            "budget": None,
            "tau": 1.0,
            "pred_tau": None,
            "tok_s": 1.0 / base_tpot,
            "tok_s_nodraft": 1.0 / base_tpot,
            "speedup_nodraft": 1.0,
            "lossless": True,
        }
    ]
    for q in qualities:
        eng = _make_engine(args, target, q)
        for m, b in [("dflash", None)] + [("ddtree", b) for b in budgets]:
            recs = [eng.generate(p, m, budget=b or 0, **gen) for p in prompts]
            lossless = all(generated_tokens(r) == generated_tokens(r0) for r, r0 in zip(recs, base))
            acc = [a for r in recs for a in r["acceptance_lengths"]]
            n = sum(r["num_output_tokens"] for r in recs)
            dec = sum(r["time_per_output_token"] * r["num_output_tokens"] for r in recs)
            draft = sum(r["stage_times"]["draft"] for r in recs)
            tpot = dec / n
            tpot_nd = max(dec - draft, 1e-12) / n
            pred = [x for r in recs for x in r.get("predicted_acceptance", [])]
            rounds = sum(r["decode_rounds"] for r in recs)
            stage_ms = {
                k: 1e3 * sum(r["stage_times"][k] for r in recs) / max(rounds, 1)
                for k in ("draft", "tree_build", "verify", "commit")
            }
            rows.append(
                {
                    "stage_ms_per_round": stage_ms,
                    "quality": q,
                    "method": method_key(m, b),
                    "budget": b,
                    "tau": _mean(acc),
                    "pred_tau": _mean(pred) if pred else None,
                    "tok_s": 1.0 / tpot,
                    "tok_s_nodraft": 1.0 / tpot_nd,
                    "speedup_nodraft": base_tpot / tpot_nd,
                    "lossless": lossless,
                }
            )
            print(
                f"q={q} {method_key(m, b)}: tau={_mean(acc):.2f} tok/s(no draft)={1.0 / tpot_nd:.1f} lossless={lossless}",
                file=sys.stderr,
            )
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, png, js = out_dir / "sweep.md", out_dir / "sweep.png", out_dir / "sweep.json"
    summ = model_summary(target)
    js.write_text(
        json.dumps(
            {
                "environment": env,
                "model": summ,
                "args": _plain({k: v for k, v in vars(args).items() if k != "func"}),
                "rows": rows,
            },
            indent=1,
        )
    )
    _write_markdown(md, rows, env, summ, args, png.name)
    _plot(png, rows, qualities, budgets, env)
    print(json.dumps({"markdown": str(md), "png": str(png), "json": str(js), "all_lossless": all(r["lossless"] for r in rows)}))
    return 0 if all(r["lossless"] for r in rows) else 1


def _fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def _write_markdown(path, rows, env, summ, args, png_name):
    lines = [
        "# DDTree offline sweep (synthetic models)",
        "",
        f"- date: {env['date_utc']}",
        f"- machine: {env['machine']} ({env['platform']}, {env['processor']}, {env['cpu_count']} CPUs)",
        f"- device: {env['device']} ({env['device_name']}); torch {env['torch']}, transformers {env['transformers']}",
        f"- target: SYNTHETIC random-weight {summ['model_type']} (vocab {summ['vocab_size']}, "
        f"hidden {summ['hidden_size']}, {summ['num_hidden_layers']} layers, {summ['num_parameters']:,} params, "
        f"{summ['dtype']}, attn {summ['attn_implementation']})"
        if not args.checkpoint
        else f"- target: checkpoint {args.checkpoint} ({summ['model_type']}, {summ['num_parameters']:,} params)",
        f"- drafter: SYNTHETIC `SyntheticDrafter` (oracle continuation of the target + noise, mode {args.drafter_mode}, "
        f"jitter {args.jitter}); quality q = per-depth oracle mass. NOT a trained DFlash drafter.",
        f"- block size {args.block_size} (depth {args.block_size - 1}), {args.num_prompts} prompts x "
        f"{args.max_new_tokens} new tokens, T = {args.temperature}, top-k cap {args.topk_cap}",
        "- tau = mean tokens per round incl. the bonus token; pred tau = drafter-predicted 1 + sum of node prefix probabilities.",
        "- tok/s (wall) includes the synthetic drafter, whose cost (oracle target forwards + CPU row construction) "
        "is not representative; tok/s (no draft) excludes the draft stage; speedup = baseline TPOT / method TPOT "
        "without the draft stage.",
        "",
        "- ms/round: mean per decode round of the engine stages tree_build (top-k + tree + mask), verify (target forward "
        "+ sampling), commit (accept walk + KV compaction / crop).",
        "",
        "| quality | method | budget | tau | pred tau | tok/s (wall) | tok/s (no draft) | speedup (no draft) "
        "| build ms/round | verify ms/round | commit ms/round | lossless |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {_fmt(r['quality'])} | {r['method']} | {r['budget'] if r['budget'] is not None else '-'} | {_fmt(r['tau'])} | "
            f"{_fmt(r['pred_tau'])} | {_fmt(r['tok_s'], 1)} | {_fmt(r['tok_s_nodraft'], 1)} | {_fmt(r['speedup_nodraft'])}x | "
            f"{_fmt(r['stage_ms_per_round']['tree_build'], 3)} | {_fmt(r['stage_ms_per_round']['verify'], 3)} | "
            f"{_fmt(r['stage_ms_per_round']['commit'], 3)} | {'yes' if r['lossless'] else 'NO'} |"
        )
    lines += ["", f"![sweep]({png_name})", ""]
    Path(path).write_text("\n".join(lines))


def _plot(path, rows, qualities, budgets, env):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = next(r for r in rows if r["method"] == "baseline")
    for i, q in enumerate(qualities):
        color = f"C{i}"
        tr = [r for r in rows if r["quality"] == q and r["method"].startswith("ddtree")]
        lin = next(r for r in rows if r["quality"] == q and r["method"] == "dflash")
        ax1.plot([r["budget"] for r in tr], [r["tau"] for r in tr], "o-", color=color, label=f"DDTree q={q}")
        ax1.axhline(lin["tau"], color=color, ls="--", lw=1, label=f"DFlash q={q}")
        ax2.plot([r["budget"] for r in tr], [r["tok_s_nodraft"] for r in tr], "o-", color=color, label=f"DDTree q={q}")
        ax2.axhline(lin["tok_s_nodraft"], color=color, ls="--", lw=1)
    ax2.axhline(base["tok_s_nodraft"], color="k", ls=":", lw=1.5, label="target-only")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets)
        ax.set_xticklabels([str(b) for b in budgets])
        ax.set_xlabel("tree budget B")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("tau (tokens / round)")
    ax1.set_title("acceptance vs budget")
    ax2.set_ylabel("tokens/s (draft stage excluded)")
    ax2.set_title("throughput vs budget")
    ax1.legend(fontsize=7, ncol=2)
    ax2.legend(fontsize=7)
    fig.suptitle(
        f"SYNTHETIC models (random-weight target, oracle+noise drafter) - {env['device_name']} - "
        f"{env['machine']} - {env['date_utc']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_corebench(args) -> int:
    from .corebench import bench, to_markdown

    if args.threads:
        torch.set_num_threads(args.threads)
    env = _environment(args.device)
    rows = bench(
        device=args.device,
        vocab=args.vocab,
        depth=args.depth,
        budgets=_int_list(args.budgets),
        reps=args.reps,
        prefix=args.prefix,
        temperature=args.temperature,
    )
    header = (
        f"# DDTree core micro-benchmark ({env['device_name']}, {env['machine']}, {env['date_utc']}; "
        f"torch {env['torch']}; vocab {args.vocab}, depth {args.depth}, T = {args.temperature}; "
        f"median of {args.reps} reps, ms; random log-probs, no model)"
    )
    md = to_markdown(rows, header)
    print(md)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(md)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ddtree_offline", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="decode synthetic prompts; write JSONL run records and a reference-format .pt")
    _add_model_args(r)
    r.add_argument("--methods", default="baseline,dflash,ddtree")
    r.add_argument("--budgets", default="16,64")
    r.add_argument("--quality", type=float, default=0.9)
    r.add_argument("--prompt-seed", type=int, default=0)
    r.add_argument("--dataset", default="synthetic")
    r.add_argument("--out-dir", default="out/ddtree_offline")
    r.add_argument("--jsonl", default=None, help="default OUT_DIR/records.jsonl")
    r.add_argument("--pt", default=None, help="default OUT_DIR/run.pt")
    r.set_defaults(func=cmd_run)
    s = sub.add_parser("sweep", help="quality x budget sweep; markdown table + PNG plot")
    _add_model_args(s)
    s.add_argument("--qualities", default="0.7,0.85,0.95")
    s.add_argument("--budgets", default="16,32,64,128,256,512")
    s.add_argument("--prompt-seed", type=int, default=0)
    s.add_argument("--out-dir", default="out/ddtree_offline_sweep")
    s.set_defaults(func=cmd_sweep)
    c = sub.add_parser("corebench", help="time one round's non-model DDTree work (top-k, build, mask, sample, accept)")
    c.add_argument("--device", default="cpu")
    c.add_argument("--vocab", type=int, default=32000)
    c.add_argument("--depth", type=int, default=15)
    c.add_argument("--budgets", default="16,32,64,128,256,512")
    c.add_argument("--reps", type=int, default=20)
    c.add_argument("--prefix", type=int, default=1024)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--out", default=None, help="also write the markdown table here")
    c.set_defaults(func=cmd_corebench)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
