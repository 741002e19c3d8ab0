"""Drafters for the offline engine.

A drafter answers one question per decode round: given the committed context (prompt + emitted
tokens, whose last token is the round's root / bonus token), what are its per-depth
distributions q_1..q_D over the next D = block_size - 1 tokens? It returns full-vocabulary
log-probabilities ``[D, V]``, like a DFlash drafter's logits through the target's ``lm_head``.

:class:`SyntheticDrafter` stands in for a trained DFlash drafter (whose weights cannot be
downloaded here). It computes the "oracle" future, the continuation the target itself would
emit from the current context (greedy at T=0; at T>0 sampled with the same positional Gumbel
noise the engine uses, so it is exactly the target's own sample), and mixes, at depth d,
probability mass ``q_d`` on the oracle token with ``1 - q_d`` of a peaked random noise
distribution (deterministic in (seed, absolute position)). Acceptance curves therefore respond to
the quality knob the way they would for a real drafter: q = 1 accepts the full depth every round,
q = 0 accepts (almost) nothing, and in between the oracle token is often not the top-1 but ranks
2..K, which is exactly where a tree beats a linear draft.

Cost caveat: computing the oracle runs the target D times per round, so wall-clock times that
include the ``draft`` stage are NOT representative of a real drafter (one small forward).
The engine reports ``stage_times`` so the draft stage can be excluded.

Hook for a real drafter (out of scope here): any object with
``propose(context_ids: list[int], depth: int, temperature: float, seed: int) -> Tensor[depth, V]``
(log-probs, on the engine's device) and ``reset()`` plugs into :class:`~ddtree_offline.engine.OfflineEngine`.
A DFlash ``HFDrafter`` would run the drafter once over ``[root, MASK x (b-1)]`` with the target's
hidden states of the context and return ``log_softmax(lm_head(h))[-(b-1):]``; it additionally
needs the target's hidden states from the verify forward, which the engine would have to pass
in (``output_hidden_states=True``). Not implemented.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import torch


class Drafter(Protocol):
    """The drafter interface the engine uses."""

    def propose(self, context_ids: list[int], depth: int, temperature: float, seed: int) -> torch.Tensor:
        """Return full-vocab log-probs ``[depth, V]`` for the ``depth`` tokens after ``context_ids``."""
        ...

    def reset(self) -> None:
        """Forget any per-sequence state (called at the start of each ``generate``)."""
        ...


def quality_schedule(quality: float | Sequence[float], depth: int, decay: float = 1.0) -> list[float]:
    """Per-depth oracle masses q_1..q_depth.

    A float ``q`` gives ``q * decay**(d-1)``; a sequence is used as given (its last value repeats
    if it is shorter than ``depth``). Values are clamped to [0, 1].
    """
    if isinstance(quality, (int, float)):
        qs = [float(quality) * (decay ** d) for d in range(depth)]
    else:
        qs = [float(x) for x in quality]
        if not qs:
            raise ValueError("empty quality schedule")
        qs = (qs + [qs[-1]] * depth)[:depth]
    return [min(1.0, max(0.0, q)) for q in qs]


class SyntheticDrafter:
    """Oracle-plus-noise drafter over a target model (see module docstring).

    Args:
        target: the HF causal LM being decoded (its continuation is the oracle).
        quality: float q (q_d = q * decay**(d-1)) or per-depth list [q_1, ...].
        k: unused by the distributions themselves (they are full-vocab); kept for the contract
           signature and recorded in metadata as the suggested top-k.
        seed: noise seed; the noise at absolute position p depends only on (seed, p).
        decay: per-depth decay of a float quality.
        noise_sharpness: std of the random logits of the noise distribution (larger = peakier noise,
           so wrong tokens get confident mass, as in a real drafter).
        jitter: per-position spread of the oracle mass: the mass actually used at absolute
           position p is ``sigmoid(logit(q_d) + jitter * z_p)``, z_p ~ N(0, 1) from (seed, p).
           Without it every q_d > ~0.5 would make the oracle the top-1 everywhere (linear drafts
           already perfect); with it, some positions are "hard" and the oracle drops to rank 2..K.
           q_d = 1 and q_d = 0 are unaffected (perfect / useless drafter).
        mode: ``"calibrated"`` (default): the row is ``q*onehot(top slot) + (1-q)*noise`` over
           slots, and the oracle token is placed in a slot drawn from that row with probability q
           (uniformly otherwise), so the drafter is roughly calibrated (its top-1 is right about
           as often as it claims when q is high) and q = 0 puts the oracle at a uniformly random
           rank. ``"mass"``: literally put mass q on the oracle token and (1-q) of noise elsewhere
           (the oracle is then always the top-1 when q > ~0.6: an underconfident drafter).
    """

    def __init__(
        self,
        target,
        quality: float | Sequence[float] = 0.8,
        k: int | None = None,
        seed: int = 0,
        decay: float = 1.0,
        noise_sharpness: float = 3.0,
        jitter: float = 1.5,
        mode: str = "calibrated",
    ):
        self.target = target
        self.quality = quality
        self.k = k
        self.seed = int(seed)
        self.decay = float(decay)
        self.noise_sharpness = float(noise_sharpness)
        self.jitter = float(jitter)
        if mode not in ("calibrated", "mass"):
            raise ValueError("mode must be 'calibrated' or 'mass'")
        self.mode = mode
        self.vocab = int(target.config.vocab_size)
        self.reset()

    # -- per-sequence oracle cache -------------------------------------------------------------
    def reset(self) -> None:
        """Drop the oracle's KV cache."""
        self._cache = None
        self._cache_ids: list[int] = []  # tokens whose KV is in self._cache

    def _device(self):
        return next(self.target.parameters()).device

    @torch.inference_mode()
    def oracle(self, context_ids: list[int], depth: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
        """The target's own next ``depth`` tokens after ``context_ids`` (greedy or seeded sample)."""
        from transformers import DynamicCache

        from .core import ddtree_utils

        du = ddtree_utils()
        dev = self._device()
        ctx = list(context_ids)
        # Reuse the longest common prefix of the cached sequence (always re-feed >= 1 token).
        common = 0
        for a, b in zip(self._cache_ids, ctx):
            if a != b:
                break
            common += 1
        common = min(common, len(ctx) - 1)
        if self._cache is None or common == 0:
            self._cache = DynamicCache(config=self.target.config)
            self._cache_ids = []
            common = 0
        elif common < len(self._cache_ids):
            self._cache.crop(-(len(self._cache_ids) - common))
            self._cache_ids = self._cache_ids[:common]
        feed = ctx[common:]
        out_tokens: list[int] = []
        pos0 = common
        seeds = torch.tensor([seed], device=dev, dtype=torch.long)
        for _ in range(depth):
            ids = torch.tensor([feed], device=dev, dtype=torch.long)
            positions = torch.arange(pos0, pos0 + len(feed), device=dev).unsqueeze(0)
            logits = self.target(
                input_ids=ids, position_ids=positions, past_key_values=self._cache, use_cache=True
            ).logits[:, -1:, :]
            gumbel = None
            if temperature > 0:
                gumbel = du.positional_gumbel(seeds, positions[:, -1:], logits.shape[-1])
            tok = int(du.sample_target_tokens(logits, temperature, gumbel)[0, 0])
            self._cache_ids.extend(feed)
            pos0 += len(feed)
            out_tokens.append(tok)
            feed = [tok]
        return out_tokens

    def _row(self, position: int, q: float, oracle_token: int, device) -> torch.Tensor:
        """Log-probs ``[V]`` of depth row at absolute ``position``; pure in (seed, position, q, oracle)."""
        V = self.vocab
        g = torch.Generator(device="cpu")
        g.manual_seed((self.seed * 1_000_003 + position * 7_919 + 17) % (2**63 - 1))
        z = torch.randn(V + 1, generator=g, dtype=torch.float64)
        noise = torch.softmax(z[:V] * self.noise_sharpness, dim=-1)
        if 0.0 < q < 1.0 and self.jitter > 0:
            lq = math.log(q) - math.log1p(-q) + self.jitter * float(z[V])
            q = 1.0 / (1.0 + math.exp(-lq))
        if self.mode == "mass":
            probs = noise * (1.0 - q)
            probs[oracle_token] += q
            return torch.log(probs.clamp_min(1e-30)).to(torch.float32).to(device)
        # "calibrated": a distribution over V slots, then the oracle token is put into a slot drawn
        # from that distribution (with prob q) or uniformly (prob 1 - q); other tokens fill the
        # remaining slots in a random order.
        slots = noise * (1.0 - q)
        slots[int(torch.argmax(noise))] += q
        u = float(torch.rand((), generator=g, dtype=torch.float64))
        if u < q:
            j = int(torch.multinomial(slots, 1, generator=g))
        else:
            j = int(torch.randint(V, (), generator=g))
        perm = torch.randperm(V, generator=g)  # perm[slot] = token
        i = int((perm == oracle_token).nonzero()[0, 0])
        perm[i], perm[j] = perm[j].clone(), perm[i].clone()
        logq = torch.empty(V, dtype=torch.float64)
        logq[perm] = torch.log(slots.clamp_min(1e-30))
        return logq.to(torch.float32).to(device)

    @torch.inference_mode()
    def propose(self, context_ids: list[int], depth: int, temperature: float = 0.0, seed: int = 0) -> torch.Tensor:
        """Per-depth full-vocab log-probs ``[depth, V]`` (float32, on the target's device)."""
        dev = self._device()
        oracle = self.oracle(context_ids, depth, temperature, seed)
        qs = quality_schedule(self.quality, depth, self.decay)
        start = len(context_ids)  # absolute position of the depth-1 token
        return torch.stack([self._row(start + d, qs[d], oracle[d], dev) for d in range(depth)])

    def describe(self) -> dict:
        """JSON-able parameters (for run metadata)."""
        q = self.quality if isinstance(self.quality, (int, float)) else list(self.quality)
        return {"kind": "synthetic", "quality": q, "decay": self.decay, "seed": self.seed,
                "noise_sharpness": self.noise_sharpness, "jitter": self.jitter, "mode": self.mode, "k": self.k}
