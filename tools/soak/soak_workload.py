"""The soak's request stream: deterministic from a seed, plain data (JSON in, JSON out).

Every request draws, from its own seeded generator:

- a prompt of random length (token ids outside the special ids), a share of them right at the
  context limit (prompt + max_new_tokens = context_length - 2, the most SGLang schedules, with the
  prompt at most context_length - 7: SGLang takes inputs shorter than context_length - 6,
  ``managers/tp_worker.py:572``) and a smaller share past it (longer than the context: the server
  must answer with an error and keep serving);
- ``max_new_tokens`` in [1, max_new_tokens];
- greedy (T = 0, compared with target-only) or sampled (T = 1 with a random top-k / top-p /
  min-p, or none of them);
- streaming or not;
- for a share of them, an abort: a streaming request is aborted once it has streamed a random
  number of tokens, a non-streaming one after a random delay.

``clients`` client loops take requests from one queue, so at most that many are in flight and
requests arrive while others finish.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Mix:
    """Shares of the request kinds (each in [0, 1])."""

    greedy: float = 0.5
    abort: float = 0.15
    at_limit: float = 0.1
    over_limit: float = 0.02
    stream: float = 0.5


@dataclass
class SoakRequest:
    index: int
    input_ids: list[int]
    sampling_params: dict
    stream: bool
    kind: str  # "normal" | "at_limit" | "over_limit"
    abort_after_tokens: int | None = None  # streaming: abort once this many tokens streamed
    abort_after_s: float | None = None  # non-streaming: abort after this delay
    tags: list[str] = field(default_factory=list)

    @property
    def greedy(self) -> bool:
        return float(self.sampling_params.get("temperature", 1.0)) == 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> SoakRequest:
        return cls(**d)


def _sampling(rng: random.Random, greedy: bool, max_new: int) -> tuple[dict, list[str]]:
    sp: dict = {"max_new_tokens": max_new, "ignore_eos": rng.random() < 0.5}
    if greedy:
        sp["temperature"] = 0.0
        return sp, ["T0"]
    sp["temperature"] = 1.0
    pick = rng.choice(["plain", "top_k", "top_p", "min_p", "all"])
    if pick in ("top_k", "all"):
        sp["top_k"] = rng.randint(1, 8)
    if pick in ("top_p", "all"):
        sp["top_p"] = round(rng.uniform(0.3, 0.95), 2)
    if pick in ("min_p", "all"):
        sp["min_p"] = round(rng.uniform(0.02, 0.3), 2)
    return sp, ["T1", pick]


def make_workload(
    n: int,
    *,
    vocab: int,
    special_ids: tuple[int, ...],
    context_length: int,
    max_new_tokens: int,
    seed: int,
    mix: Mix = Mix(),
    max_prompt: int | None = None,
) -> list[SoakRequest]:
    """``n`` requests (see the module docstring). ``max_prompt`` bounds the ordinary prompts
    (default: a quarter of the context)."""
    if n < 1:
        raise ValueError(f"the soak needs at least one request (got {n})")
    if context_length < max_new_tokens + 8:
        raise ValueError(f"context_length {context_length} leaves no room for prompts next to max_new_tokens {max_new_tokens}")
    tokens = [t for t in range(vocab) if t not in special_ids]
    if not tokens:
        raise ValueError(f"no ordinary tokens in a vocabulary of {vocab} without {special_ids}")
    max_prompt = max_prompt or max(2, context_length // 4)
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}:{i}")
        max_new = rng.randint(1, max_new_tokens)
        u = rng.random()
        kind = "over_limit" if u < mix.over_limit else "at_limit" if u < mix.over_limit + mix.at_limit else "normal"
        plen = _prompt_len(rng, kind, context_length, max_new, max_prompt)
        greedy = rng.random() < mix.greedy
        sp, tags = _sampling(rng, greedy, max_new)
        stream = rng.random() < mix.stream
        req = SoakRequest(
            index=i, input_ids=[rng.choice(tokens) for _ in range(plen)], sampling_params=sp, stream=stream, kind=kind, tags=tags
        )
        if kind != "over_limit" and rng.random() < mix.abort:
            _add_abort(rng, req)
        out.append(req)
    if n >= COVER_MIN:
        _cover_every_kind(out, context_length=context_length, tokens=tokens, seed=seed)
    return out


COVER_MIN = 8  # from this many requests on, every kind below occurs at least once


def _prompt_len(rng: random.Random, kind: str, context_length: int, max_new: int, max_prompt: int) -> int:
    """A prompt length for ``kind``: past the context, at its limit, or ordinary."""
    if kind == "over_limit":
        return context_length + rng.randint(1, 8)
    if kind == "at_limit":
        return min(context_length - max_new - 2, context_length - 7)
    return rng.randint(1, max_prompt)


def _add_abort(rng: random.Random, req: SoakRequest) -> None:
    """Abort ``req``: once it has streamed a random number of tokens, or after a random delay."""
    if req.stream:
        req.abort_after_tokens = rng.randint(1, req.sampling_params["max_new_tokens"])
    else:
        req.abort_after_s = round(rng.uniform(0.0, 2.0), 3)
    req.tags.append("abort")


# kind -> (the workload has one, a plain request that can carry it)
_COVERED = {
    "over_limit": (lambda r: r.kind == "over_limit", lambda r: True),
    "at_limit": (lambda r: r.kind == "at_limit", lambda r: True),
    "abort_stream": (lambda r: r.abort_after_tokens is not None, lambda r: r.stream),
    "abort_delay": (lambda r: r.abort_after_s is not None, lambda r: not r.stream),
}


def _cover_every_kind(out: list[SoakRequest], *, context_length: int, tokens: list[int], seed: int) -> None:
    """A short soak still exercises every path: a prompt at the context limit, one past it, an
    abort while streaming and one after a delay. Each kind the draw left out is given to the last
    plain request (normal, no abort) that can carry it, re-drawn from its own seeded generator and
    tagged ``covered``; a workload that has every kind already is left as drawn."""
    for kind, (present, carries) in _COVERED.items():
        if any(present(r) for r in out):
            continue
        plain = [r for r in out if r.kind == "normal" and "abort" not in r.tags and "covered" not in r.tags and carries(r)]
        if not plain:
            continue
        r = plain[-1]
        rng = random.Random(f"{seed}:{r.index}:{kind}")
        if kind in ("over_limit", "at_limit"):
            plen = _prompt_len(rng, kind, context_length, r.sampling_params["max_new_tokens"], 0)
            r.kind, r.input_ids = kind, [rng.choice(tokens) for _ in range(plen)]
        else:
            _add_abort(rng, r)
        r.tags.append("covered")
