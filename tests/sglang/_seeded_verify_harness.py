"""Which T > 0 verify a DDTREE batch takes with and without per-request seeds (patch ddtree-verify-input-and-walk's
routing in ``eagle_utils.eagle_sample``), on the CPU; print one JSON report.

Run in a subprocess with PYTHONPATH = a patched sglang tree. REAL: ``eagle_sample`` (the patched
function, every line of it), ``_seeded_verify_coins`` (SGLang's murmur-hash coins, its Triton
kernel under the Triton interpreter), ``sampling_softmax``, ``apply_min_p_filter``,
``SamplingBatchInfo``, ``DDTreeVerifyInput.target_sample_walk``.

STOOD IN: ``eagle_utils._is_cpu`` is False for the CUDA cases (``_verify_uses_greedy`` sends
every CPU verify to the argmax walk, so the sampled branches only run off-CPU; the last case keeps
the real CPU value); the CUDA kernels ``tree_speculative_sampling_target_only`` and
``verify_tree_greedy_func`` record their inputs; ``murmur_hash32``'s CPU branch (an ``sgl_kernel`` op)
is replaced by its own Triton kernel, the CUDA branch's, under the interpreter (this is about which branch runs and what it is
fed, not the kernels' arithmetic); ``sample_tree_target_tokens`` is wrapped to record that it ran
(then runs, on the CPU's torch-sampler branch); ``get_spec`` / ``get_parallel`` /
``is_dp_attention_enabled`` answer for a TP = 1 server with default speculative flags (no
runtime context exists outside a server).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # SGLang's murmur-hash coins are a Triton kernel

import json  # noqa: E402
import types  # noqa: E402

import torch  # noqa: E402

V, N = 12, 5  # vocabulary, verify width B + 1


def main() -> None:
    from sglang.srt import runtime_context
    from sglang.srt.layers import dp_attention
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative import eagle_utils as EU
    from sglang.srt.speculative.ddtree_info import DDTreeVerifyInput

    calls = []
    EU.get_spec = lambda: types.SimpleNamespace(
        speculative_use_rejection_sampling=False, speculative_use_block_verification=False,
        speculative_accept_threshold_single=1.0, speculative_accept_threshold_acc=1.0)
    group = types.SimpleNamespace(world_size=1)
    runtime_context.get_parallel = lambda: types.SimpleNamespace(tp_group=group, attn_tp_group=group)
    dp_attention.is_dp_attention_enabled = lambda: False

    def target_only(**kw):
        calls.append({"kernel": "tree_speculative_sampling_target_only",
                      "coins": kw["uniform_samples"].tolist(),
                      "final_coins": kw["uniform_samples_for_final_sampling"].tolist(),
                      "draft_probs_zero": bool((kw["draft_probs"] == 0).all()),
                      "target_probs": kw["target_probs"].tolist()})

    def greedy_walk(**kw):
        calls.append({"kernel": "verify_tree_greedy", "target_predict": kw["target_predict"].tolist()})
        return kw["predicts"], kw["accept_index"], kw["accept_token_num"].zero_()

    # murmur_hash32 calls the sgl_kernel CPU op for CPU tensors (murmur_hash.py:112-117), which
    # has no build here: run SGLang's own Triton kernel (its CUDA path) under the interpreter.
    from sglang.kernels.ops.sampling import murmur_hash as MH

    def murmur_triton(seed, positions, col_indices):
        n, m = seed.shape[0], col_indices.shape[0]
        hashed = torch.empty((n, m), dtype=torch.uint32)
        MH.murmur_hash32_kernel[(n, (m + 1023) // 1024)](
            seed, positions, col_indices, hashed, n, m, BLOCK_SIZE=1024)
        return hashed

    MH.murmur_hash32 = murmur_triton
    real_walk = EU.sample_tree_target_tokens

    def walk(*a, **kw):
        calls.append({"kernel": "sample_tree_target_tokens"})
        return real_walk(*a, **kw)

    EU.tree_speculative_sampling_target_only = target_only
    EU.verify_tree_greedy_func = greedy_walk
    EU.sample_tree_target_tokens = walk

    logits_all = torch.randn(3 * N, V, generator=torch.Generator().manual_seed(5)) * 2

    def run(seeds, seq_lens, rows, on_cpu=False, min_p=0.2):
        bs = len(seq_lens)
        EU._is_cpu = on_cpu
        info = SamplingBatchInfo(
            temperatures=torch.full((bs, 1), 0.8), top_ps=torch.ones(bs),
            top_ks=torch.full((bs,), 1 << 30, dtype=torch.int32), min_ps=torch.full((bs,), min_p),
            is_all_greedy=False, is_any_greedy=False, need_top_p_sampling=False,
            need_top_k_sampling=False, need_min_p_sampling=min_p > 0, vocab_size=V,
            sampling_seed=None if seeds is None else torch.tensor(seeds, dtype=torch.int64))
        vi = types.SimpleNamespace(
            target_sample_walk=DDTreeVerifyInput.target_sample_walk,
            draft_token=torch.arange(bs * N) % V, draft_token_num=N, max_tree_depth=3, tree_topk=2,
            retrieve_index=torch.arange(bs * N).view(bs, N),
            retrieve_next_token=torch.full((bs, N), -1), retrieve_next_sibling=torch.full((bs, N), -1),
            draft_probs=None)
        batch = types.SimpleNamespace(device="cpu", seq_lens=torch.tensor(seq_lens),
                                      sampling_info=info, return_logprob=False,
                                      forward_mode=types.SimpleNamespace(is_idle=lambda: False))
        logits = torch.cat([logits_all[r * N:(r + 1) * N] for r in rows]).clone()
        del calls[:]
        EU.eagle_sample(vi, batch, types.SimpleNamespace(next_token_logits=logits))
        return list(calls)

    rep = {
        "seeded": run([7, 9], [10, 20], [0, 1]),
        "seeded_again": run([7, 9], [10, 20], [0, 1]),
        "seeded_alone": run([9], [20], [1]),              # request 2 of the batch, alone
        "seeded_other_len": run([7, 9], [11, 20], [0, 1]),
        "seeded_other_seed": run([8, 9], [10, 20], [0, 1]),
        "unseeded": run(None, [10, 20], [0, 1]),
        "cpu_seeded": run([7, 9], [10, 20], [0, 1], on_cpu=True),
        "cpu_unseeded": run(None, [10, 20], [0, 1], on_cpu=True),
    }
    # The target distribution the seeded kernel must be fed: softmax(logits / T) with min-p.
    probs = torch.softmax(logits_all[: 2 * N] / 0.8, dim=-1)
    probs = probs.masked_fill(probs < probs.max(-1, keepdim=True).values * 0.2, 0.0)
    rep["expected_target_probs"] = (probs / probs.sum(-1, keepdim=True)).view(2, N, V).tolist()
    print("REPORT " + json.dumps(rep))


if __name__ == "__main__":
    main()
