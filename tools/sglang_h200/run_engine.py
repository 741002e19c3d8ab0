"""Run the real SGLang engine (pinned 0.5.23 + the repo's series) on the H200: plain, DFLASH, DDTREE.

Run by tools/sglang_h200/h200.sh on the device machine (docs/h200-harness.md). Two parts:

``--part equal``: tiny random-weight models created here (a 3-layer Qwen3 target, a 1-layer DFlash
drafter in the z-lab layout, vocab 12 so acceptance is high and trees go deep), float32. Plain greedy,
DFLASH (graphs off and on) and DDTREE (graphs off, B in 16/64/256), each on its own engine, the same 4
ragged prompts; every speculative output must equal the plain greedy output token for token.

``--part time``: a Qwen3-8B-shaped bf16 target and a DFlash-shaped drafter (z-lab Qwen3-8B-DFlash-b16
shapes: 5 layers, block 16, target layers 1/9/17/25/33), random weights (SGLang's ``dummy`` load
format: nothing written, nothing downloaded). Decode step time in ms/step at batch 1, 8, 32 for DFLASH
(graphs off/on) and DDTREE (graphs off, B 16/64/256).

``--part pair --pair DIR``: the small real pair trained by ``tools/real_pair/train_pair.py`` (issue 21):
target-only, DFLASH and DDTREE at B 16..512, graphs on, held-out prompts at batch 1/8/32, T = 0 and T = 1:
tokens per verify step (tau), decode tokens/s, and every T = 0 output against target-only's.

Each engine case runs in a fresh child process (one engine per process; a crash or hang is confined
to its case, bounded by ``--case-timeout``). Results: one JSON line per case on stdout prefixed
``CASE``, and ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from pathlib import Path

TINY = dict(
    vocab_size=12,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
TINY_BLOCK = 8
Q8B = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    bos_token_id=151643,
    eos_token_id=151645,
)
Q8B_DRAFT_LAYERS = 5
Q8B_BLOCK = 16
Q8B_TARGET_LAYERS = [1, 9, 17, 25, 33]
SINK: Path | None = None


# ----------------------------------------------------------------------------- models


def _tokenizer(dest: Path, vocab: int) -> None:
    """A WordLevel tokenizer over tokens t0..t{vocab-1} (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "t1",
                "eos_token": "t2",
                "pad_token": "t0",
                "unk_token": "t0",
                "model_max_length": 1 << 20,
            }
        )
    )


def make_tiny_models(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """Seeded random weights scaled up so greedy is not flat (as the CPU engine runs, notes)."""
    import torch
    from safetensors.torch import save_file

    target, draft = root / "tiny-target", root / "tiny-draft"
    for d in (target, draft):
        d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    H, FF, V, L = TINY["hidden_size"], TINY["intermediate_size"], TINY["vocab_size"], TINY["num_hidden_layers"]
    nh, nkv, hd = TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["head_dim"]

    def w(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale / (shape[-1] ** 0.5)).float().contiguous()

    def layer(prefix: str) -> dict:
        return {
            f"{prefix}.self_attn.q_proj.weight": w(nh * hd, H),
            f"{prefix}.self_attn.k_proj.weight": w(nkv * hd, H),
            f"{prefix}.self_attn.v_proj.weight": w(nkv * hd, H),
            f"{prefix}.self_attn.o_proj.weight": w(H, nh * hd),
            f"{prefix}.self_attn.q_norm.weight": torch.ones(hd),
            f"{prefix}.self_attn.k_norm.weight": torch.ones(hd),
            f"{prefix}.mlp.gate_proj.weight": w(FF, H),
            f"{prefix}.mlp.up_proj.weight": w(FF, H),
            f"{prefix}.mlp.down_proj.weight": w(H, FF),
            f"{prefix}.input_layernorm.weight": torch.ones(H),
            f"{prefix}.post_attention_layernorm.weight": torch.ones(H),
        }

    tw = {
        "model.embed_tokens.weight": w(V, H, scale=H**0.5),
        "model.norm.weight": torch.ones(H),
        "lm_head.weight": w(V, H, scale=4.0),
    }
    for i in range(L):
        tw.update(layer(f"model.layers.{i}"))
    save_file(tw, str(target / "model.safetensors"))
    (target / "config.json").write_text(
        json.dumps(dict(TINY, architectures=["Qwen3ForCausalLM"], model_type="qwen3", torch_dtype="float32"))
    )
    dw = {"norm.weight": torch.ones(H), "hidden_norm.weight": torch.ones(H), "fc.weight": w(H, 2 * H)}
    dw.update(layer("layers.0"))
    save_file(dw, str(draft / "model.safetensors"))
    (draft / "config.json").write_text(
        json.dumps(
            dict(
                TINY,
                architectures=["DFlashDraftModel"],
                model_type="qwen3",
                torch_dtype="float32",
                num_hidden_layers=1,
                block_size=TINY_BLOCK,
                num_target_layers=L,
                dflash_config={"mask_token_id": V - 1, "target_layer_ids": [0, 1]},
            )
        )
    )
    for d in (target, draft):
        _tokenizer(d, V)
    return target, draft


def make_8b_configs(root: Path) -> tuple[Path, Path]:
    """Config-only dirs (weights: SGLang's dummy loader, random, in GPU memory)."""
    target, draft = root / "q8b-target", root / "q8b-draft"
    for d in (target, draft):
        d.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(
        json.dumps(dict(Q8B, architectures=["Qwen3ForCausalLM"], model_type="qwen3", torch_dtype="bfloat16"))
    )
    (draft / "config.json").write_text(
        json.dumps(
            dict(
                Q8B,
                architectures=["DFlashDraftModel"],
                model_type="qwen3",
                torch_dtype="bfloat16",
                num_hidden_layers=Q8B_DRAFT_LAYERS,
                block_size=Q8B_BLOCK,
                num_target_layers=Q8B["num_hidden_layers"],
                dflash_config={"mask_token_id": 151669, "target_layer_ids": Q8B_TARGET_LAYERS},
            )
        )
    )
    for d in (target, draft):
        _tokenizer(d, 64)  # only for the tokenizer manager's start; requests pass input_ids
    return target, draft


# ----------------------------------------------------------------------------- cases


DDTREE_GRAPH_ARGS: list[str] = []  # --ddtree-graph-args: extra flags for the DDTREE graphs-on cases
# --attention-backend / --sampling-backend: triton + pytorch unless FlashInfer is carried (issue 22)
BACKENDS = {"attention": "triton", "sampling": "pytorch"}
# --mem-fraction-static for every case; "default" leaves it to SGLang (what a user who does not pass it gets)
MEM_FRACTION = {"static": "0.75"}


def server_argv(
    target: Path, draft: Path | None, algo: str, graphs: bool, dtype: str, budget: int | None, extra: list[str]
) -> list[str]:
    argv = [
        "--model-path",
        str(target),
        "--device",
        "cuda",
        "--dtype",
        dtype,
        "--attention-backend",
        BACKENDS["attention"],
        "--trust-remote-code",
        "--random-seed",
        "0",
        *(["--mem-fraction-static", MEM_FRACTION["static"]] if MEM_FRACTION["static"] != "default" else []),
        "--log-level",
        "warning",
        "--sampling-backend",
        BACKENDS["sampling"],
    ]
    if not graphs:
        # Both spellings: the legacy boolean alone does not turn the decode graph off once
        # cuda_graph_config is resolved (issue 9); the per-phase backends do.
        argv += ["--disable-cuda-graph", "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    if algo != "plain":
        argv += [
            "--speculative-algorithm",
            algo,
            "--speculative-draft-model-path",
            str(draft),
            "--speculative-draft-attention-backend",
            BACKENDS["attention"],
        ]
    if algo == "DDTREE":
        argv += ["--speculative-ddtree-budget", str(budget)]
        if graphs:
            argv += DDTREE_GRAPH_ARGS
    return argv + extra


def _read_probe(path):
    try:
        steps, build, step = Path(path).read_text().split()
        return int(steps), float(build), float(step)
    except (OSError, ValueError):
        return 0, 0.0, 0.0


def _count(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


# the "mixed" pass (--mixed): request i of a batch gets MIXED[i % 4] on top of T = 1
MIXED = [{"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.05}, {}]


def _child(conn, argv, prompts_by_batch, max_new_tokens, env, temps=(0.0,)):
    os.setpgid(0, 0)  # the engine's scheduler/detokenizer join this group: the parent ends them all
    os.environ.update(env or {})
    probe = os.environ.get("H200_TIME_BUILDER")
    try:
        import sglang
        from sglang.srt.server_args import prepare_server_args

        t0 = time.perf_counter()
        engine = sglang.Engine(server_args=prepare_server_args(argv))
        res = {"start_s": round(time.perf_counter() - t0, 1), "runs": []}
        # what was passed ("default": nothing, SGLang sizes the static pool in the scheduler process)
        res["mem_fraction_static"] = MEM_FRACTION["static"]
        sp0 = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        engine.generate(input_ids=prompts_by_batch[0][:1], sampling_params=dict(sp0, max_new_tokens=4))  # warm
        for temp, prompts in [(t, p) for t in temps for p in prompts_by_batch]:
            mixed = temp == "mixed"  # T = 1, one batch mixing top-k / top-p / min-p / plain requests
            sp = (
                [dict(sp0, temperature=1.0, **MIXED[i % len(MIXED)]) for i in range(len(prompts))]
                if mixed
                else dict(sp0, temperature=temp)
            )
            # One unmeasured full generation first: the first use of a batch shape compiles Triton
            # kernels (seen on the H200: a prefill-only reference that took longer than the full
            # generation after it). Then the prefill-only reference (1 new token) and the measured
            # full generation: the difference is decode.
            engine.generate(input_ids=prompts, sampling_params=sp)
            t1 = time.perf_counter()
            engine.generate(
                input_ids=prompts,
                sampling_params=[dict(x, max_new_tokens=1) for x in sp] if mixed else dict(sp, max_new_tokens=1),
            )
            prefill_s = time.perf_counter() - t1
            before = _read_probe(probe) if probe else None
            t1 = time.perf_counter()
            outs = engine.generate(input_ids=prompts, sampling_params=sp)
            wall_s = time.perf_counter() - t1
            after = _read_probe(probe) if probe else None
            ids = [list(o.get("output_ids") or []) for o in outs]
            metas = [o.get("meta_info", {}) for o in outs]
            verify = [int(m.get("spec_verify_ct") or 0) for m in metas]
            steps = max(verify) or (max_new_tokens - 1)
            res["runs"].append(
                {
                    "batch": len(prompts),
                    "temperature": 1.0 if mixed else temp,
                    "mixed": mixed,
                    "wall_s": wall_s,
                    "prefill_s": prefill_s,
                    "decode_steps": steps,
                    "ms_per_step": 1000.0 * max(wall_s - prefill_s, 0.0) / max(steps, 1),
                    "tokens": sum(len(x) for x in ids),
                    "output_ids": ids,
                    # decode tokens per second of the whole batch (the prefill-only call's time taken off)
                    "decode_tok_s": sum(len(x) - 1 for x in ids) / max(wall_s - prefill_s, 1e-9),
                    # tau: tokens per verify step, the first token (from prefill) left out
                    "tau": (sum(len(x) - 1 for x in ids) / sum(verify)) if sum(verify) else None,
                    "accept_len": [m.get("spec_accept_length") for m in metas],
                    "verify_ct": verify,
                    # --speculative-ddtree-budget auto: how many request-steps ran each budget
                    "budgets": _count(b for m in metas for b in (m.get("ddtree_budget") or [])),
                }
            )
            if probe:
                n = after[0] - before[0]
                res["runs"][-1]["probe"] = {
                    "decode_steps": n,
                    "build_ms": 1000 * (after[1] - before[1]) / max(n, 1),
                    "step_ms": 1000 * (after[2] - before[2]) / max(n, 1),
                }
        prof = os.environ.get("H200_PROFILE_DIR")
        if prof:  # a torch profiler trace of a few decode steps at the middle batch (SGLang's own profiler)
            prompts = prompts_by_batch[len(prompts_by_batch) // 2]
            engine.start_profile(
                output_dir=prof,
                num_steps=8,
                activities=["CPU", "GPU"],
                with_stack=False,
                record_shapes=False,
                profile_prefix=f"bs{len(prompts)}",
            )
            engine.generate(input_ids=prompts, sampling_params=dict(sp0, max_new_tokens=12))
            res["profile_dir"] = prof
        engine.shutdown()
        conn.send({"ok": res})
    except BaseException as exc:  # report everything to the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-6000:]})
    finally:
        conn.close()


def run_case(name, argv, prompts_by_batch, max_new_tokens, timeout, env=None, temps=(0.0,)) -> dict:
    if os.environ.get("H200_TAG"):  # h200.sh's H200_TAG: results of a before/after run keep apart
        name = f"{name}@{os.environ['H200_TAG']}"
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, argv, prompts_by_batch, max_new_tokens, env, temps))
    t0 = time.perf_counter()
    proc.start()
    child.close()
    result = {"error": f"timed out after {timeout} s"}
    if parent.poll(timeout):
        try:
            result = parent.recv()
        except EOFError:
            result = {"error": f"engine process died (exit {proc.exitcode})"}
    proc.join(15)
    try:  # this case's engine processes, and only them (the child's own process group)
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    proc.join(5)
    time.sleep(2)  # let the driver release the GPU memory before the next engine sizes its pools
    result.update(name=name, argv=argv, case_s=round(time.perf_counter() - t0, 1))
    line = {k: v for k, v in result.items() if k != "argv"}
    if "ok" in line:
        line["ok"] = {**line["ok"], "runs": [{k: v for k, v in r.items() if k != "output_ids"} for r in line["ok"]["runs"]]}
    trace = line.pop("trace", None)
    print("CASE " + json.dumps(line), flush=True)
    if SINK is not None:  # written after every case: a run cut short still leaves its finished cases
        done = json.loads(SINK.read_text()) if SINK.is_file() else {}
        done[name] = result
        SINK.write_text(json.dumps(done))
    if trace:
        for ln in trace[-2500:].splitlines():
            print("  | " + ln, flush=True)
    return result


def tiny_prompts(n: int, vocab: int, seed: int = 1) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab - 1) for _ in range(5 + 3 * i)] for i in range(n)]


def part_equal(root: Path, args) -> dict:
    target, draft = make_tiny_models(root)
    prompts = [tiny_prompts(4, TINY["vocab_size"])]
    # Order: what the "done when" needs first (DDTREE with graphs vs plain greedy), so a run cut
    # at the call limit still holds it; every case is compared with "plain", which therefore runs first.
    cases = [("plain", "plain", False, None)]
    cases += [(f"ddtree-B{b}-graphs", "DDTREE", True, b) for b in (16, 64, 256)]
    cases += [("dflash-graphs", "DFLASH", True, None), ("dflash-nographs", "DFLASH", False, None)]
    cases += [(f"ddtree-B{b}-nographs", "DDTREE", False, b) for b in (16, 64, 256)]
    cases += [("plain-graphs", "plain", True, None)]
    out = {}
    for name, algo, graphs, budget in cases:
        if args.only and name not in args.only:
            continue
        argv = server_argv(
            target, draft, algo, graphs, "float32", budget, ["--context-length", "1024", "--cuda-graph-max-bs-decode", "8"]
        )
        # the first engine also compiles SGLang's JIT kernels (nvcc), cached for the others
        timeout = args.case_timeout if out else max(args.case_timeout, 420)
        out[name] = run_case(name, argv, prompts, args.max_new_tokens, timeout)
        if name == "plain" and "error" in out[name]:
            break  # every other case starts the same engine first: fail fast, report where it stopped
    ref = out.get("plain", {}).get("ok")
    for name, r in out.items():
        if "ok" in r and ref and name != "plain":
            r["equal_to_plain"] = r["ok"]["runs"][0]["output_ids"] == ref["runs"][0]["output_ids"]
            print(f"EQUAL {name} {r['equal_to_plain']}", flush=True)
    return out


def part_time(root: Path, args) -> dict:
    target, draft = make_8b_configs(root)
    import random

    rng = random.Random(2)
    # H200_TIME_BATCHES (default 1,8,32) and H200_TIME_PROMPT_LEN (default 64 random tokens; a long prompt
    # shows what the verify's mask costs over the prefix) shape every time case of the call alike.
    batches = [int(x) for x in os.environ.get("H200_TIME_BATCHES", "1,8,32").split(",")]
    plen = int(os.environ.get("H200_TIME_PROMPT_LEN", "64"))
    prompts = [[[rng.randrange(1000, 100000) for _ in range(plen)] for _ in range(bs)] for bs in batches]
    # Order: the graphed pair the roadmap's break-even needs first, then eager, then the builder probe.
    cases = [("dflash-graphs", "DFLASH", True, None)]
    cases += [(f"ddtree-B{b}-graphs", "DDTREE", True, b) for b in (16, 64, 256)]
    cases += [("ddtree-auto-graphs", "DDTREE", True, "auto")]  # --speculative-ddtree-budget auto
    # The synchronous scheduler (overlap off): what overlap scheduling alone is worth.
    cases += [("ddtree-B16-graphs-sync", "DDTREE", True, 16)]
    cases += [("dflash-nographs", "DFLASH", False, None)]
    cases += [(f"ddtree-B{b}-nographs", "DDTREE", False, b) for b in (16, 64, 256)]
    # builder's share: the same DDTREE cases with the synchronizing probe (sitecustomize.py, 3.)
    cases += [(f"ddtree-B{b}-nographs-probe", "DDTREE", False, b) for b in (16, 64, 256)]
    # Prefill graphs off in every time case: decode step time is what is measured, and on the 8B shape the
    # prefill graph capture ran out of memory at --mem-fraction-static 0.75 (H200, 2026-12-03).
    extra = [
        "--load-format",
        "dummy",
        "--speculative-draft-load-format",
        "dummy",
        "--context-length",
        str(max(4096, plen + 512)),
        "--max-running-requests",
        str(max(32, max(batches))),
        "--cuda-graph-max-bs-decode",
        str(max(32, max(batches))),
        "--cuda-graph-backend-prefill",
        "disabled",
    ]
    out = {}
    for name, algo, graphs, budget in cases:
        if args.only and name not in args.only:
            continue
        argv = server_argv(
            target,
            draft,
            algo,
            graphs,
            "bfloat16",
            budget,
            extra + (["--disable-overlap-schedule"] if name.endswith("-sync") else []),
        )
        timeout = args.case_timeout if out else max(args.case_timeout, 420)
        first = not out
        env = {"H200_TIME_BUILDER": f"/tmp/h200-probe-{name}"} if name.endswith("-probe") else {}
        if args.profile and name in args.profile:
            env["H200_PROFILE_DIR"] = str(args.profile_dir / name)
        r = out[name] = run_case(name, argv, prompts, args.max_new_tokens, timeout, env)
        if first and "error" in r:
            break
    return {r["name"]: r for r in out.values()}  # tagged names (H200_TAG) keep runs apart


PAIR_BUDGETS = (16, 32, 64, 128, 256, 512)


def part_pair(root: Path, args) -> dict:
    """The trained pair (tools/real_pair): target-only, DFLASH and DDTREE at PAIR_BUDGETS, graphs on,
    held-out prompts at batch 1/8/32, T = 0 and T = 1; every T = 0 output compared with target-only's."""
    pair = args.pair
    prompts_all = [p["input_ids"] for p in json.loads((pair / "heldout_prompts.json").read_text())]
    prompts = [prompts_all[:bs] for bs in (1, 8, 32)]
    cases = [("target-only", "plain", None), ("dflash", "DFLASH", None)]
    cases += [(f"ddtree-B{b}", "DDTREE", b) for b in PAIR_BUDGETS]
    extra = [
        "--context-length",
        "2048",
        "--max-running-requests",
        "32",
        "--cuda-graph-max-bs-decode",
        "32",
        "--cuda-graph-backend-prefill",
        "disabled",
    ]
    out = {}
    for name, algo, budget in cases:
        if args.only and name not in args.only:
            continue
        argv = server_argv(pair / "target", pair / "draft", algo, True, args.pair_dtype, budget, extra)
        timeout = args.case_timeout if out else max(args.case_timeout, 420)
        temps = (0.0, 1.0, "mixed") if args.mixed else (0.0, 1.0)
        r = out[name] = run_case(name, argv, prompts, args.max_new_tokens, timeout, temps=temps)
        if name == "target-only" and "error" in r:
            break
    ref = out.get("target-only", {}).get("ok")
    for name, r in out.items():
        if "ok" in r and ref and name != "target-only":
            greedy = [(a["output_ids"], b["output_ids"]) for a, b in zip(r["ok"]["runs"], ref["runs"]) if a["temperature"] == 0.0]
            r["equal_to_plain"] = all(a == b for a, b in greedy)
            print(f"EQUAL {name} {r['equal_to_plain']}", flush=True)
    return {r["name"]: r for r in out.values()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["equal", "time", "pair", "models"], required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/h200-models"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--case-timeout", type=int, default=240)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--pair", type=Path, help="--part pair: the trained pair (target/, draft/, heldout_prompts.json)")
    ap.add_argument(
        "--pair-dtype",
        default="float32",
        help="--part pair: engine dtype (float32: T = 0 equality is not blurred by bf16 near-ties)",
    )
    ap.add_argument(
        "--mixed",
        action="store_true",
        default=os.environ.get("PAIR_MIXED") == "1",
        help="--part pair: also a T = 1 pass whose batch mixes top-k / top-p / min-p requests",
    )
    ap.add_argument(
        "--ddtree-graph-args",
        default=os.environ.get("H200_DDTREE_GRAPH_ARGS", ""),
        help="extra engine flags for the ddtree-B*-graphs cases (graphs are DDTREE's default with "
        "triton since patch ddtree-server-args; e.g. --speculative-ddtree-cuda-graph to say so explicitly)",
    )
    ap.add_argument(
        "--attention-backend",
        default=os.environ.get("H200_ATTENTION_BACKEND", "triton"),
        choices=["triton", "flashinfer"],
        help="target and drafter (flashinfer: h200.sh with FlashInfer carried)",
    )
    ap.add_argument(
        "--sampling-backend",
        default=os.environ.get("H200_SAMPLING_BACKEND", "pytorch"),
        choices=["pytorch", "flashinfer"],
        help="SGLang's sampler at T > 0 (greedy is argmax either way)",
    )
    ap.add_argument(
        "--mem-fraction-static",
        default=os.environ.get("H200_MEM_FRACTION", "0.75"),
        help='every case\'s --mem-fraction-static; "default": not passed, SGLang sizes it',
    )
    ap.add_argument(
        "--profile", nargs="*", default=[], help="cases (time part) that also record a torch profiler trace of 8 decode steps"
    )
    ap.add_argument("--profile-dir", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "prof")
    args = ap.parse_args(argv)
    import shlex

    DDTREE_GRAPH_ARGS[:] = shlex.split(args.ddtree_graph_args)
    BACKENDS.update(attention=args.attention_backend, sampling=args.sampling_backend)
    MEM_FRACTION.update(static=args.mem_fraction_static)
    args.work.mkdir(parents=True, exist_ok=True)
    global SINK
    SINK = args.out
    if args.part == "models":  # CPU check of the model/config writers
        print(make_tiny_models(args.work), make_8b_configs(args.work))
        return 0
    part = {"equal": part_equal, "time": part_time, "pair": part_pair}[args.part]
    res = part(args.work, args)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    bad = [k for k, v in res.items() if "error" in v or v.get("equal_to_plain") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
