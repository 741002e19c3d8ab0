"""Drafters for the offline engine.

A drafter answers one question per decode round: given the committed context (prompt + emitted
tokens, whose last token is the round's root / bonus token), what are its per-depth
distributions q_1..q_D over the next D = block_size - 1 tokens? It returns full-vocabulary
log-probabilities ``[D, V]``, like a DFlash drafter's logits through the target's ``lm_head``.

:class:`SyntheticDrafter` stands in for a trained DFlash drafter (whose weights cannot be
downloaded here). It computes the "oracle" future, the continuation the target itself will
emit from the current context (greedy at T=0; at T>0 sampled with the same positional Gumbel
noise the engine uses, so it is exactly the target's own sample), and builds, for each depth d, a
row of probabilities with quality q_d (q_d = mass of the row's top slot, before a per-position
jitter). In the default ``calibrated`` mode the oracle token is then placed at a rank drawn from
that very row, so the drafter is calibrated (its predicted acceptance matches the measured one,
the regime in which DDTree's tree is optimal); in ``mass`` mode the oracle token simply gets mass
q_d. Rows are deterministic in (seed, position, the continuation tokens there), identical for all
methods decoding the same sequence. Acceptance curves therefore respond to the quality knob the
way they would for a real drafter: q = 1 accepts the full depth every round, q = 0 accepts
(almost) nothing, and in between the oracle token is often not the top-1 but ranks 2..K, which is
exactly where a tree beats a linear draft.

Cost caveat: computing the oracle runs the target (memoized: about one forward per emitted
token, plus the CPU-side row construction), so wall-clock times that include the ``draft`` stage
are NOT representative of a real drafter (one small forward per round).
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
        qs = [float(quality) * (decay**d) for d in range(depth)]
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
        seed: noise seed; the row at absolute position p depends only on (seed, p, the tokens at
           p-1 and p of the target's continuation, q), so every method sees the same rows.
        decay: per-depth decay of a float quality.
        noise_sharpness: std of the random logits of the noise distribution (larger = peakier noise,
           so wrong tokens get confident mass, as in a real drafter).
        jitter: per-position spread of the oracle mass: the mass actually used at absolute
           position p is ``sigmoid(logit(q_d) + jitter * z_p)``, z_p ~ N(0, 1) drawn from the row's generator.
           Without it every q_d > ~0.5 would make the oracle the top-1 everywhere (linear drafts
           already perfect); with it, some positions are "hard" and the oracle drops to rank 2..K.
           q_d = 1 and q_d = 0 are unaffected (perfect / useless drafter).
        mode: ``"calibrated"`` (default): the row is ``q*onehot(top slot) + (1-q)*noise`` over
           slots (noise logits scaled by ``noise_sharpness*sqrt(q)``), and the oracle token is
           placed in a slot drawn from that row, so the drafter is calibrated (the oracle is its
           rank-r token with exactly the probability it assigns to rank r: the regime the DDTree
           optimality argument assumes). q = 0 gives a flat row, the oracle at a uniform rank.
           ``"mass"``: literally put mass q on the oracle token and (1-q) of noise elsewhere
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
        """Drop the oracle's state (KV cache and the memoized continuation)."""
        self._cache = None
        self._seq: list[int] = []  # context + the target's own continuation computed so far
        self._fed = 0  # tokens of self._seq whose KV is in self._cache
        self._key = None  # (temperature, seed) the continuation was computed for

    def _device(self):
        return next(self.target.parameters()).device

    @torch.inference_mode()
    def oracle(self, context_ids: list[int], depth: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
        """The target's own next ``depth`` tokens after ``context_ids`` (greedy, or the seeded sample).

        Memoized: the engine's emitted tokens ARE the target's continuation, so the next round's
        context is normally a prefix of ``context + previous oracle``; only the missing tail is
        computed (about one target forward per emitted token). Any other context restarts.
        """
        from transformers import DynamicCache

        from .sampling import positional_gumbel, sample_target_tokens

        ctx = [int(t) for t in context_ids]
        key = (float(temperature), int(seed))
        if key != self._key or len(self._seq) < len(ctx) or self._seq[: len(ctx)] != ctx:
            self._cache = DynamicCache(config=self.target.config)
            self._seq, self._fed, self._key = list(ctx), 0, key
        need = len(ctx) + depth - len(self._seq)
        if need > 0:
            dev = self._device()
            seeds = torch.tensor([seed], device=dev, dtype=torch.long)
            for _ in range(need):
                feed = self._seq[self._fed :]
                ids = torch.tensor([feed], device=dev, dtype=torch.long)
                positions = torch.arange(self._fed, len(self._seq), device=dev).unsqueeze(0)
                logits = self.target(input_ids=ids, position_ids=positions, past_key_values=self._cache, use_cache=True).logits[
                    :, -1:, :
                ]
                gumbel = None
                if temperature > 0:
                    gumbel = positional_gumbel(seeds, positions[:, -1:], logits.shape[-1])
                self._fed = len(self._seq)
                self._seq.append(int(sample_target_tokens(logits, temperature, gumbel)[0, 0]))
        return self._seq[len(ctx) : len(ctx) + depth]

    def _row(self, position: int, q: float, prev_token: int, oracle_token: int, device) -> torch.Tensor:
        """Log-probs ``[V]`` of the row at absolute ``position``.

        A pure function of (seed, position, previous token, oracle token, q): identical for every
        method decoding the same sequence (they all emit the same tokens), but not repeated across
        prompts that merely share a position.
        """
        V = self.vocab
        g = torch.Generator(device="cpu")
        h = self.seed * 1_000_003 + 17
        for x in (position, prev_token, oracle_token):
            h = (h * 1_000_033 + int(x) + 1) % (2**61 - 1)
        g.manual_seed(h)
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
        # from that same distribution (a perfectly calibrated drafter); the other tokens fill the
        # remaining slots in a random order.
        # Noise sharpness scales with sqrt(q): q = 0 gives a flat row (oracle at a uniform rank).
        noise = torch.softmax(z[:V] * (self.noise_sharpness * math.sqrt(q)), dim=-1)
        slots = noise * (1.0 - q)
        slots[int(torch.argmax(noise))] += q
        j = int(torch.multinomial(slots, 1, generator=g))
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
        prev = [int(context_ids[-1])] + oracle[:-1]
        return torch.stack([self._row(start + d, qs[d], prev[d], oracle[d], dev) for d in range(depth)])

    def describe(self) -> dict:
        """JSON-able parameters (for run metadata)."""
        q = self.quality if isinstance(self.quality, (int, float)) else list(self.quality)
        return {
            "kind": "synthetic",
            "quality": q,
            "decay": self.decay,
            "seed": self.seed,
            "noise_sharpness": self.noise_sharpness,
            "jitter": self.jitter,
            "mode": self.mode,
            "k": self.k,
        }
