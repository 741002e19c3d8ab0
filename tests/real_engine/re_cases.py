"""Prompts, lengths and server configs of the real-engine suite (one engine per config)."""

from __future__ import annotations

# Four ragged prompts (token ids of the 12-token vocabulary; 0 and 1 are <mask>/<eos>).
PROMPTS = [
    [2, 3, 4, 5],
    [7, 7, 8],
    [9, 10, 11, 2, 3, 4, 5, 6],
    [5, 3, 9, 2, 6, 11, 7, 8, 4, 10, 3, 2],
]
N_NEW = 24
# Longer than the DDTREE engine's --chunked-prefill-size (16): prefilled in 3 chunks.
LONG_PROMPT = [((i * 7) % 10) + 2 for i in range(40)]
CHUNK = 16
# Context-limit case: --context-length 64; prompts + max_new_tokens reach the limit.
HEADROOM_CONTEXT = 64
HEADROOM_PROMPTS = [
    [3, 5, 7, 9, 11, 2, 4, 6, 8, 10, 3, 5, 7, 9, 11, 2, 4, 6, 8, 10, 3, 5, 7, 9, 11, 2, 4, 6, 8, 10],
    [6, 2],
    [4, 8, 2, 6, 10, 4, 8, 2, 6, 10, 4, 8, 2, 6, 10, 4, 8, 2, 6, 10, 4, 8, 2, 6, 10, 4, 8, 2],
    [11, 9],
]


def headroom_max_new(prompt) -> int:
    # The most SGLang schedules for one request: max_req_len = context_len - 1 (managers/tp_worker.py:421)
    # and max_new_tokens <= max_req_len - input_len - 1 (managers/scheduler.py:2714), so
    # prompt + new = context - 2. Asking for more is capped there, before any worker runs.
    return HEADROOM_CONTEXT - len(prompt) - 2


# prompt -> number of greedy tokens the plain engine computes once for every case.
PLAIN_REFERENCE = {tuple(p): N_NEW for p in PROMPTS}
PLAIN_REFERENCE[tuple(LONG_PROMPT)] = N_NEW
for _p in HEADROOM_PROMPTS:
    PLAIN_REFERENCE[tuple(_p)] = headroom_max_new(_p)


def greedy(n: int, **extra) -> dict:
    return dict(max_new_tokens=n, temperature=0.0, ignore_eos=True, **extra)


def engine_kwargs(name: str, models: dict) -> dict:
    base = dict(
        model_path=str(models["target"]), device="cpu", dtype="float32",
        attention_backend="triton", disable_cuda_graph=True, max_total_tokens=4096,
        max_running_requests=8, context_length=256, random_seed=0, log_level="warning",
        skip_server_warmup=True,
    )
    spec = dict(speculative_draft_model_path=str(models["draft"]),
                speculative_draft_attention_backend="triton")
    ddtree = dict(spec, speculative_algorithm="DDTREE")
    # The tiny target's vocabulary has 12 tokens, below the default top-K cap min(B, 32) at B >= 16:
    # those engines cap K at 8 (every depth's top 8 of 12 tokens), as the default did before.
    cap8 = dict(speculative_ddtree_topk_cap=8)
    configs = {
        "plain": {},
        "dflash": dict(spec, speculative_algorithm="DFLASH"),
        # The main DDTREE engine: debug metrics on, small prefill chunks.
        "ddtree16": dict(ddtree, speculative_ddtree_budget=16, speculative_ddtree_debug_metrics=True, **cap8,
                         chunked_prefill_size=CHUNK),
        "ddtree64": dict(ddtree, speculative_ddtree_budget=64, **cap8),
        # --speculative-ddtree-budget auto: each step picks B from 3/7/15/31 (block 4: the widths
        # 4/8/16/32 keep the interpreted verify cheap); debug metrics report each step's tree size.
        "ddtree-auto": dict(ddtree, speculative_ddtree_budget="auto", speculative_dflash_block_size=4,
                            speculative_ddtree_debug_metrics=True, **cap8),
        # The synchronous scheduler (overlap off, the one switch users have): B = 16 as ddtree16.
        "ddtree16-sync": dict(ddtree, speculative_ddtree_budget=16, disable_overlap_schedule=True, **cap8),
        # B >= depth = block_size - 1 is required: B=1 and B=4 run the drafter at block 2 / 5.
        "ddtree1": dict(ddtree, speculative_ddtree_budget=1, speculative_dflash_block_size=2),
        "ddtree4": dict(ddtree, speculative_ddtree_budget=4, speculative_dflash_block_size=5),
        # Top-K cap 2 at depth 7: the largest tree is sum_d 2**d = 254 nodes; B = that maximum.
        "ddtree254": dict(ddtree, speculative_ddtree_budget=254, speculative_ddtree_topk_cap=2),
        "sampling": dict(ddtree, speculative_ddtree_budget=16, random_seed=7, **cap8),
        # Request features (test_08): the plain reference runs custom logit processors (opt-in at
        # launch); DDTREE refuses that flag (patch ddtree-server-args). Grammar: SGLang's default (xgrammar).
        "features-plain": dict(enable_custom_logit_processor=True),
        "features": dict(ddtree, speculative_ddtree_budget=16, **cap8),
        "headroom": dict(ddtree, speculative_ddtree_budget=16, context_length=HEADROOM_CONTEXT, **cap8,
                         max_running_requests=4),
    }
    return dict(base, **configs[name])
