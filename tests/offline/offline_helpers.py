"""Helpers for the offline engine tests (a uniquely named module: several test dirs have a conftest)."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def make_engine(target, quality=0.85, block_size=8, seed=1, **kw):
    from ddtree_offline.drafters import SyntheticDrafter
    from ddtree_offline.engine import OfflineEngine

    return OfflineEngine(target, SyntheticDrafter(target, quality=quality, seed=seed, **kw), block_size=block_size)


def prompts(n, vocab, seed=0, lo=4, hi=24):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(torch.randint(lo, hi, (), generator=g)),), generator=g).tolist() for _ in range(n)]
