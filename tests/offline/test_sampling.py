"""The offline engine's target sampler (``ddtree_offline.sampling``): counter-based Gumbel noise,
a deterministic function of (seed, position, token), and the Gumbel-max sample it feeds."""

from __future__ import annotations

import math

import pytest
import torch

from ddtree_offline import sampling


def test_positional_gumbel_is_a_function_of_seed_position_token():
    seeds = torch.tensor([1, 1, 2])
    pos = torch.tensor([[10, 11, 12], [12, 10, 99], [10, 11, 12]])
    g = sampling.positional_gumbel(seeds, pos, 50)
    assert g.shape == (3, 3, 50) and g.dtype == torch.float32
    again = sampling.positional_gumbel(seeds, pos, 50)
    assert torch.equal(g, again)
    # Same (seed, position) in other slots: identical rows.
    assert torch.equal(g[0, 0], g[1, 1])
    assert torch.equal(g[0, 2], g[1, 0])
    # Different position / seed / token: different noise.
    assert not torch.equal(g[0, 0], g[0, 1])
    assert not torch.equal(g[0, 0], g[2, 0])
    assert len(set(g[0, 0].tolist())) == 50
    # A wider vocab extends, never changes, the noise of the first tokens.
    assert torch.equal(sampling.positional_gumbel(seeds, pos, 80)[..., :50], g)


def test_positional_gumbel_is_gumbel_distributed():
    g = sampling.positional_gumbel(torch.tensor([7]), torch.arange(64)[None, :], 4096)
    assert torch.isfinite(g).all()
    assert abs(float(g.mean()) - 0.5772) < 0.02  # Euler-Mascheroni
    assert abs(float(g.var()) - math.pi ** 2 / 6) < 0.05


def test_sample_target_tokens():
    logits = torch.randn(2, 5, 30, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sampling.sample_target_tokens(logits, 0.0), logits.argmax(-1))
    g = sampling.positional_gumbel(torch.tensor([3, 4]), torch.arange(5).expand(2, 5), 30)
    got = sampling.sample_target_tokens(logits, 0.7, g)
    assert torch.equal(got, (logits / 0.7 + g).argmax(-1))
    assert got.shape == (2, 5)
    # Same noise at the same absolute positions -> the same samples (tree vs target-only decoding).
    g2 = sampling.positional_gumbel(torch.tensor([3]), torch.tensor([[2, 3]]), 30)
    assert torch.equal(sampling.sample_target_tokens(logits[:1, 2:4], 0.7, g2), got[:1, 2:4])
    # Without noise given, a real sample: over many draws, more than one token appears.
    many = sampling.sample_target_tokens(torch.zeros(1, 200, 30), 1.0)
    assert len(set(many.flatten().tolist())) > 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_positional_gumbel_same_on_cpu_and_cuda():
    seeds = torch.tensor([0, 123456789012])
    pos = torch.tensor([[0, 1, 2, 4000], [7, 7, 8, 2**31 + 5]])
    cpu = sampling.positional_gumbel(seeds, pos, 1000)
    gpu = sampling.positional_gumbel(seeds.cuda(), pos.cuda(), 1000).cpu()
    assert torch.allclose(cpu, gpu, rtol=0, atol=1e-5)
    assert torch.equal(cpu.argmax(-1), gpu.argmax(-1))


def test_the_offline_sampler_is_not_shipped_in_sglang():
    """Only serving code goes into SGLang (issue 24): the built ddtree_utils has none of it."""
    from ddtree_deploy.build.overlay import import_patched

    du = import_patched("sglang.srt.speculative.ddtree_utils")
    for name in ("positional_gumbel", "sample_target_tokens", "_mix32", "_mul32"):
        assert not hasattr(du, name), name
