"""The offline engine's target sampler: counter-based Gumbel noise and the Gumbel-max sample.

The offline reference engine (``python -m ddtree_offline``) samples the target with noise that
depends only on (request seed, absolute position, token), so target-only decoding and a
speculative run that verifies the same position draw the same token: its T > 0 runs are then
comparable token for token. SGLang's serving path does not use this (its T > 0 verify is the
target-sample walk of ``eagle_utils.sample_tree_target_tokens``, patch
ddtree-verify-input-and-walk); these functions lived in ``ddtree_utils.py`` until the series
kept only serving code there (issue 24).
"""

from __future__ import annotations

from typing import Optional

import torch

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 x in [0, 2**32) and a 32-bit constant, overflow free."""
    lo = torch.bitwise_and(x, 0xFFFF)
    hi = torch.bitwise_right_shift(x, 16)
    c_lo = c & 0xFFFF
    return torch.bitwise_and(
        lo * c + torch.bitwise_left_shift(torch.bitwise_and(hi * c_lo, 0xFFFF), 16),
        _M32,
    )


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32) on int64 tensors holding uint32 values."""
    x = torch.bitwise_xor(x, torch.bitwise_right_shift(x, 16))
    x = _mul32(x, 0x7FEB352D)
    x = torch.bitwise_xor(x, torch.bitwise_right_shift(x, 15))
    x = _mul32(x, 0x846CA68B)
    x = torch.bitwise_xor(x, torch.bitwise_right_shift(x, 16))
    return x


def positional_gumbel(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counter-based Gumbel(0, 1) noise: float32 [bs, N, vocab].

    ``noise[b, i, v]`` is a deterministic function of ``(seeds[b], positions[b, i], v)`` only:
    a tree node at absolute position p sees exactly the noise that target-only decoding sees at
    p, so ``argmax(logits / T + noise)`` gives the same tokens with and without speculation.
    The 24-bit uniforms come from an integer hash evaluated with int64 arithmetic that cannot
    overflow, so they are bit-identical on CPU and GPU; the ``-log(-log(u))`` transform is
    float32 (an ulp of difference between backends is possible there).
    """
    if positions.dim() != 2 or seeds.shape != positions.shape[:1]:
        raise ValueError(f"seeds [bs] and positions [bs, N] expected; got {tuple(seeds.shape)}, {tuple(positions.shape)}")
    device = positions.device
    s = seeds.to(device=device, dtype=torch.int64)
    s_lo = torch.bitwise_and(s, _M32)
    s_hi = torch.bitwise_and(torch.bitwise_right_shift(s, 32), _M32)
    h = _mix32(torch.bitwise_xor(_mix32(torch.bitwise_xor(s_lo, 0x9E3779B9)), s_hi))  # [bs]
    p = torch.bitwise_and(positions.to(torch.int64), _M32)
    h = _mix32(torch.bitwise_xor(_mix32(torch.bitwise_xor(h.unsqueeze(1), p)), 0x85EBCA6B))  # [bs, N]
    tok = torch.arange(vocab, device=device, dtype=torch.int64)
    x = _mix32(torch.bitwise_xor(h.unsqueeze(2), _mix32(tok + 0x27D4EB2F)))  # [bs, N, V]
    u = (torch.bitwise_right_shift(x, 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u))


def sample_target_tokens(logits: torch.Tensor, temperature: float, gumbel: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The target's token at every tree node: int64 [bs, N].

    ``argmax(logits)`` at ``temperature == 0``; otherwise ``argmax(logits / T + gumbel)`` (the
    Gumbel-max trick, an exact sample of softmax(logits / T)). ``gumbel`` [bs, N, V] is usually
    ``positional_gumbel(...)``; when omitted, fresh noise is drawn from torch's generator.
    """
    if float(temperature) <= 0.0:
        return torch.argmax(logits, dim=-1)
    z = logits.to(torch.float32) / float(temperature)
    if gumbel is None:
        gumbel = -torch.log(torch.empty_like(z).exponential_())
    return torch.argmax(z + gumbel.to(z.dtype), dim=-1)
