"""Target models for the offline engine.

* :func:`tiny_target` builds a small random-weight causal LM (Llama or Qwen3 architecture) from a
  config, deterministically from a seed. Nothing is downloaded.
* :func:`load_checkpoint` loads a real Hugging Face checkpoint from LOCAL files only.

``SyntheticDrafter`` lives in :mod:`ddtree_offline.drafters` and is re-exported here (the
contract names ``ddtree_offline.models.SyntheticDrafter``).
"""

from __future__ import annotations

import torch

__all__ = ["tiny_target", "load_checkpoint", "model_summary"]


def tiny_target(
    seed: int = 0,
    vocab: int = 512,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    arch: str = "llama",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
    init_std: float = 0.2,
    max_positions: int = 8192,
):
    """Build a tiny random-weight causal LM, deterministic in ``seed``.

    ``init_std`` is larger than the usual 0.02 so that next-token distributions are peaked enough
    to make greedy/sampled continuations non-trivial (with 0.02 a 2-layer model is near-uniform).
    ``arch`` is ``"llama"`` (LlamaConfig) or ``"qwen3"`` (Qwen3Config, adds q/k norms).
    The global RNG state is restored afterwards.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_std,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if arch == "llama":
        cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen3":
        cfg, cls = Qwen3Config(head_dim=hidden // heads, **common), Qwen3ForCausalLM
    else:
        raise ValueError(f"unknown arch {arch!r} (llama|qwen3)")
    cfg._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(cfg)
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    return model


def load_checkpoint(
    path: str,
    dtype: torch.dtype | str = torch.bfloat16,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
):
    """Load a real causal-LM checkpoint from a local directory (never the network).

    DDTree verification passes a custom 4-D additive mask, so the attention implementation must
    accept one: ``sdpa`` (default) or ``eager``; flash-attention backends do not.
    """
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=dtype, attn_implementation=attn_implementation
    )
    return model.to(device).eval().requires_grad_(False)


def model_summary(model) -> dict:
    """A small JSON-able description of a model (for run metadata)."""
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "model_type": getattr(cfg, "model_type", None),
        "vocab_size": int(cfg.vocab_size),
        "hidden_size": int(cfg.hidden_size),
        "num_hidden_layers": int(cfg.num_hidden_layers),
        "num_parameters": int(n_params),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
    }


def __getattr__(name):  # lazy re-export, avoids an import cycle with drafters
    if name == "SyntheticDrafter":
        from .drafters import SyntheticDrafter

        return SyntheticDrafter
    raise AttributeError(name)
