"""The offline reference decode loop: target-only, DFlash-style linear drafts, and DDTree.

Batch size 1, pure torch over a Hugging Face causal LM with a :class:`transformers.DynamicCache`.
Every emitted token comes from the target (argmax at T=0; at T>0 ``argmax(logits/T + g)`` with
``g = positional_gumbel(seed, absolute position)``, ``sampling.py``), so all three methods
emit exactly the same tokens for the same (prompt, seed): that is the losslessness property the
tests check.

The record returned by :meth:`OfflineEngine.generate` follows the reference ``benchmark.py``
record (liranringel/ddtree): ``output_ids`` is a CPU LongTensor ``[1, num_input_tokens +
num_output_tokens]`` holding prompt AND generated tokens (use :func:`generated_tokens`),
``time_per_output_token`` = decode time (after prefill) / num_output_tokens, ``acceptance_lengths``
is per round and counts the bonus token (tokens emitted that round), ``stage_times`` maps stage ->
total seconds, ``round_timestamps`` are seconds since decode start at the end of each round.
DDTree adds ``predicted_acceptance`` (per round, the EXPECTED tau = 1 + predicted_accept_length,
comparable with acceptance_lengths), ``tree_sizes`` (draft nodes, root excluded) and
``tree_depths`` (max node depth).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .core import ddtree_utils
from .sampling import positional_gumbel, sample_target_tokens

METHODS = ("target", "dflash", "ddtree")
_ALIASES = {"baseline": "target", "ar": "target", "linear": "dflash"}

REFERENCE_KEYS = (
    "output_ids",
    "num_input_tokens",
    "num_output_tokens",
    "time_to_first_token",
    "time_per_output_token",
    "acceptance_lengths",
    "decode_rounds",
    "stage_times",
    "round_timestamps",
    "round_trees",
)
DDTREE_KEYS = ("predicted_acceptance", "tree_sizes", "tree_depths")
STAGES = ("draft", "tree_build", "verify", "commit")


def generated_tokens(rec: dict) -> list[int]:
    """The generated token ids of a record (``output_ids`` holds the prompt too)."""
    ids = rec["output_ids"]
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1).tolist()
    return [int(t) for t in ids[int(rec["num_input_tokens"]) :]]


def tree_attention_mask(tree_mask: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """4-D additive float mask ``[bs, 1, N, prefix_len + N]`` for one tree-verify forward.

    Every tree node sees the whole committed prefix (the KV cache) and, inside the tree, exactly
    itself and its ancestors (``tree_mask[b, i, j]``); everything else gets ``finfo(dtype).min``.
    """
    bs, n, _ = tree_mask.shape
    neg = torch.finfo(dtype).min
    mask = torch.zeros(bs, 1, n, prefix_len + n, dtype=dtype, device=tree_mask.device)
    mask[:, 0, :, prefix_len:] = torch.where(
        tree_mask,
        torch.zeros((), dtype=dtype, device=tree_mask.device),
        torch.full((), neg, dtype=dtype, device=tree_mask.device),
    )
    return mask


def compact_dynamic_cache(cache, prefix_len: int, keep: torch.Tensor) -> None:
    """Keep the committed prefix plus the tree slots ``keep`` (in order), in consecutive slots.

    After a verify forward over root + B tree nodes the cache holds ``prefix_len + N`` entries per
    layer; the accepted path (``keep`` = node indices, starting with the root 0) is gathered and
    appended to the prefix, so the cache again looks as if the target had decoded the accepted
    tokens one by one (their RoPE positions start + depth are consecutive along a path).
    Uses the per-layer ``keys`` / ``values`` tensors ``[bs, heads, seq, head_dim]`` of
    transformers 5.x ``DynamicCache.layers``.
    """
    idx = keep.to(torch.long).reshape(-1) + prefix_len
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
            raise NotImplementedError(f"KV compaction supports full-attention DynamicLayer only, got {type(layer).__name__}")
        k, v = layer.keys, layer.values
        idx_d = idx.to(k.device)
        layer.keys = torch.cat([k[..., :prefix_len, :], k.index_select(-2, idx_d)], dim=-2)
        layer.values = torch.cat([v[..., :prefix_len, :], v.index_select(-2, idx_d)], dim=-2)


class OfflineEngine:
    """Batch-1 speculative decoding over an HF causal LM (see module docstring).

    Args:
        target_model: HF causal LM (attention implementation ``sdpa`` or ``eager``: DDTree
            passes a custom 4-D mask).
        drafter: an object with ``propose(context_ids, depth, temperature, seed) -> [depth, V]``
            log-probs and ``reset()`` (e.g. :class:`~ddtree_offline.drafters.SyntheticDrafter`);
            only needed for ``dflash`` / ``ddtree``.
        block_size: drafter block size b; the draft depth is b - 1.
        device: where inputs are created; the model is moved there.
    """

    def __init__(self, target_model, drafter=None, block_size: int = 16, device: str | torch.device = "cpu"):
        if block_size < 2:
            raise ValueError("block_size must be >= 2 (draft depth = block_size - 1)")
        self.device = torch.device(device)
        self.target = target_model.to(self.device).eval()
        self.drafter = drafter
        self.block_size = int(block_size)
        self.vocab = int(self.target.config.vocab_size)
        self._cuda = self.device.type == "cuda"

    # -- helpers ------------------------------------------------------------------------------
    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _sample(self, logits: torch.Tensor, positions: torch.Tensor, temperature: float, seed: int) -> torch.Tensor:
        """Target tokens ``[1, n]`` for logits ``[1, n, V]`` at absolute ``positions`` ``[1, n]``."""
        gumbel = None
        if temperature > 0:
            seeds = torch.tensor([seed], dtype=torch.long, device=logits.device)
            gumbel = positional_gumbel(seeds, positions, logits.shape[-1])
        return sample_target_tokens(logits, temperature, gumbel)

    def _forward(self, ids, positions, cache, attention_mask=None):
        return self.target(
            input_ids=ids,
            position_ids=positions,
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
        ).logits

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.target.config)

    # -- public API ---------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        method: str = "target",
        budget: int = 64,
        topk_cap: int | None = None,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        seed: int = 0,
        stop_token_ids: list[int] | None = None,
        save_tree_traces: bool = False,
    ) -> dict[str, Any]:
        """Decode ``max_new_tokens`` tokens after ``prompt_ids`` with ``method``; return the record.

        ``method``: ``target`` (alias ``baseline``), ``dflash`` (linear draft of b-1 tokens, top-1
        per depth), ``ddtree`` (tree of ``budget`` nodes from per-depth top-K, K = min(budget, V,
        topk_cap)). Generation stops at ``max_new_tokens`` or after a token in ``stop_token_ids``.
        """
        method = _ALIASES.get(method, method)
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; one of {METHODS}")
        if method != "target" and self.drafter is None:
            raise ValueError(f"method {method!r} needs a drafter")
        if not prompt_ids:
            raise ValueError("empty prompt")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        du = ddtree_utils()
        if self.drafter is not None:
            self.drafter.reset()
        stops = set(int(t) for t in (stop_token_ids or []))
        dev = self.device
        prompt = [int(t) for t in prompt_ids]
        L = len(prompt)
        D = self.block_size - 1

        stage_times = {s: 0.0 for s in STAGES}
        acceptance_lengths: list[int] = []
        round_timestamps: list[float] = []
        round_trees: list[dict] = []
        predicted: list[float] = []
        tree_sizes: list[int] = []
        tree_depths: list[int] = []

        # Prefill: the first generated token comes from the prompt's last logits.
        cache = self.new_cache()
        t0 = self._now()
        pos = torch.arange(L, device=dev).unsqueeze(0)
        logits = self._forward(torch.tensor([prompt], device=dev), pos, cache)[:, -1:, :]
        first = int(self._sample(logits, pos[:, -1:], temperature, seed)[0, 0])
        gen = [first]
        stopped = first in stops
        ttft = self._now() - t0
        decode_start = self._now()

        while len(gen) < max_new_tokens and not stopped:
            start = L + len(gen) - 1  # position of the root (= last emitted token); cache length
            root = gen[-1]
            if method == "target":
                t = self._now()
                p = torch.tensor([[start]], device=dev)
                lg = self._forward(torch.tensor([[root]], device=dev), p, cache)
                tok = self._sample(lg, p, temperature, seed)
                stage_times["verify"] += self._now() - t
                emitted = [int(tok[0, 0])]
            else:
                t = self._now()
                logq = self.drafter.propose(prompt + gen, D, temperature, seed).to(dev)
                stage_times["draft"] += self._now() - t
                if method == "dflash":
                    emitted = self._linear_round(logq, root, start, cache, temperature, seed, stage_times)
                else:
                    emitted, info = self._tree_round(
                        du,
                        logq,
                        root,
                        start,
                        cache,
                        budget,
                        topk_cap,
                        temperature,
                        seed,
                        stage_times,
                        save_tree_traces,
                    )
                    predicted.append(info["predicted_tau"])
                    tree_sizes.append(info["num_nodes"])
                    tree_depths.append(info["max_depth"])
                    round_trees.append(info["summary"])
            acceptance_lengths.append(len(emitted))
            gen.extend(emitted)
            stopped = any(t in stops for t in emitted)
            round_timestamps.append(self._now() - decode_start)

        # Truncate to max_new_tokens and after the first stop token.
        gen = gen[:max_new_tokens]
        for i, tkn in enumerate(gen):
            if tkn in stops:
                gen = gen[: i + 1]
                break
        total_decode = self._now() - decode_start
        n_out = len(gen)
        rec: dict[str, Any] = {
            "output_ids": torch.tensor([prompt + gen], dtype=torch.long),
            "num_input_tokens": L,
            "num_output_tokens": n_out,
            "time_to_first_token": float(ttft),
            "time_per_output_token": float(total_decode / max(n_out, 1)),
            "acceptance_lengths": acceptance_lengths,
            "decode_rounds": len(acceptance_lengths),
            "stage_times": stage_times,
            "round_timestamps": round_timestamps,
            "round_trees": round_trees,
        }
        if method == "ddtree":
            rec["predicted_acceptance"] = predicted
            rec["tree_sizes"] = tree_sizes
            rec["tree_depths"] = tree_depths
        return rec

    # -- rounds -------------------------------------------------------------------------------
    def _linear_round(self, logq, root, start, cache, temperature, seed, stage_times) -> list[int]:
        """DFlash: draft top-1 per depth, verify root + D tokens causally, accept longest prefix."""
        dev = self.device
        D = logq.shape[0]
        t = self._now()
        draft = logq.argmax(-1)  # [D]
        ids = torch.cat([torch.tensor([root], device=dev), draft]).unsqueeze(0)
        pos = torch.arange(start, start + D + 1, device=dev).unsqueeze(0)
        stage_times["tree_build"] += self._now() - t
        t = self._now()
        lg = self._forward(ids, pos, cache)
        tt = self._sample(lg, pos, temperature, seed)[0]  # [D+1]: token after each input
        stage_times["verify"] += self._now() - t
        t = self._now()
        n = int((draft == tt[:D]).long().cumprod(0).sum())
        emitted = draft[:n].tolist() + [int(tt[n])]
        if D - n > 0:
            cache.crop(-(D - n))  # keep prefix + root + n accepted drafts
        stage_times["commit"] += self._now() - t
        return emitted

    def _tree_round(self, du, logq, root, start, cache, budget, topk_cap, temperature, seed, stage_times, save):
        """DDTree: top-K per depth -> tree -> one masked verify forward -> accept -> compact KV."""
        dev = self.device
        t = self._now()
        V = logq.shape[-1]
        K = min(int(budget), V, int(topk_cap) if topk_cap else V)
        top_lp, top_ids = torch.topk(logq.float(), K, dim=-1)  # sorted descending
        tree = du.build_ddtree_tree_from_topk(
            top_ids.unsqueeze(0),
            top_lp.unsqueeze(0),
            torch.tensor([root], device=dev),
            torch.tensor([start], device=dev),
            int(budget),
        )
        mask = tree_attention_mask(tree.tree_mask, start, self.target.dtype)
        stage_times["tree_build"] += self._now() - t
        t = self._now()
        lg = self._forward(tree.draft_tokens, tree.positions, cache, attention_mask=mask)
        tt = self._sample(lg, tree.positions, temperature, seed)
        stage_times["verify"] += self._now() - t
        t = self._now()
        acc = du.ddtree_accept(tree, tt)
        n = int(acc.accept_length[0])
        path = acc.accepted_nodes[0, : n + 1]
        emitted = tree.draft_tokens[0, path[1:]].tolist() + [int(acc.bonus_tokens[0])]
        compact_dynamic_cache(cache, start, path)
        stage_times["commit"] += self._now() - t
        num_nodes = int(tree.draft_tokens.shape[1]) - 1
        max_depth = int(tree.depths.max())
        pred = float(du.predicted_accept_length(tree)[0])
        summary = {
            "num_nodes": num_nodes,
            "max_depth": max_depth,
            "accept_length": n,
            "accepted_indices": [int(i) for i in path.tolist()],
            "predicted_accept_length": pred,
        }
        if save:
            summary["node_token_ids"] = tree.draft_tokens[0, 1:].tolist()
            summary["parents"] = tree.parents[0, 1:].tolist()
        return emitted, {"predicted_tau": 1.0 + pred, "num_nodes": num_nodes, "max_depth": max_depth, "summary": summary}
