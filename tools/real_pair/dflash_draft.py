"""A DFlash drafter in plain torch, in the z-lab checkpoint layout, with a training forward.

Layout (what SGLang 0.5.23's ``srt/models/dflash.py`` and the z-lab / DDTree reference loaders read):
``layers.<i>.self_attn.{q,k,v,o}_proj.weight``, ``layers.<i>.self_attn.{q,k}_norm.weight``,
``layers.<i>.mlp.{gate,up,down}_proj.weight``, ``layers.<i>.{input,post_attention}_layernorm.weight``,
``norm.weight``, ``fc.weight``, ``hidden_norm.weight``; no embedding and no lm head (the target's are used).

The math is the reference's (liranringel/ddtree ``model/dflash.py``, z-lab ``dflash/model.py``):
context features = ``hidden_norm(fc(cat(target hidden states of target_layer_ids)))``; in every layer the
block's queries come from the block's normed hidden states, its keys and values from the context features
(not normed by the layer) and from the block, ``q_norm`` / ``k_norm`` per head, rotary positions on both,
no causal mask inside the block.

Training (the DFlash objective): pick anchor positions ``s`` in a sequence; the block is the token at ``s``
followed by ``block_size - 1`` mask tokens at positions ``s .. s + block_size - 1``; the block sees the context
features of positions ``< s`` and itself; block slot ``k >= 1`` is trained to predict the token at ``s + k``
through the target's (frozen) lm head, with weight ``exp(-(k - 1) / gamma)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [..., head_dim] for integer positions (Qwen3's default rotary embedding)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        attn = nn.Module()
        attn.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        attn.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        attn.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        attn.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        attn.q_norm = RMSNorm(head_dim, eps)
        attn.k_norm = RMSNorm(head_dim, eps)
        self.self_attn = attn
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(hidden, inter, bias=False)
        mlp.up_proj = nn.Linear(hidden, inter, bias=False)
        mlp.down_proj = nn.Linear(inter, hidden, bias=False)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, cos_q, sin_q, cos_k, sin_k, mask) -> torch.Tensor:
        """x [B, Q, H] block states; ctx [B, C, H] context features; mask [B, 1, Q, C + Q] (True = attend)."""
        a = self.self_attn
        bsz, q_len, _ = x.shape
        h = self.input_layernorm(x)
        q = a.q_norm(a.q_proj(h).view(bsz, q_len, self.heads, self.head_dim))
        kv_in = torch.cat([ctx, h], dim=1)
        k = a.k_norm(a.k_proj(kv_in).view(bsz, kv_in.shape[1], self.kv_heads, self.head_dim))
        v = a.v_proj(kv_in).view(bsz, kv_in.shape[1], self.kv_heads, self.head_dim)
        q = _rotate(q, cos_q[:, :, None], sin_q[:, :, None]).transpose(1, 2)
        k = _rotate(k, cos_k[:, :, None], sin_k[:, :, None]).transpose(1, 2)
        v = v.transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        x = x + a.o_proj(o.transpose(1, 2).reshape(bsz, q_len, -1))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class DFlashDraft(nn.Module):
    def __init__(
        self,
        *,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        inter: int,
        layers: int,
        n_features: int,
        eps: float = 1e-6,
        rope_theta: float = 10000.0,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(hidden, heads, kv_heads, head_dim, inter, eps) for _ in range(layers))
        self.norm = RMSNorm(hidden, eps)
        self.fc = nn.Linear(n_features * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.head_dim, self.rope_theta = head_dim, rope_theta

    def forward(self, block_embeds, block_pos, feats, ctx_pos, mask) -> torch.Tensor:
        """block_embeds [B, Q, H], block_pos [B, Q], feats [B, C, F*H], ctx_pos [B, C], mask [B, 1, Q, C+Q]."""
        ctx = self.hidden_norm(self.fc(feats))
        cos_q, sin_q = rope(block_pos, self.head_dim, self.rope_theta)
        cos_k, sin_k = rope(torch.cat([ctx_pos, block_pos], dim=1), self.head_dim, self.rope_theta)
        x = block_embeds
        for layer in self.layers:
            x = layer(x, ctx, cos_q, sin_q, cos_k, sin_k, mask)
        return self.norm(x)


def training_batch(tokens: torch.Tensor, n_anchors: int, block: int, mask_id: int, gen: torch.Generator):
    """Anchors, block token ids, block positions, labels and the attention mask for a [B, L] token batch.

    Anchors are drawn without replacement from ``1 .. L - block`` (at least one context position, a full
    block of labels). Returns (block_ids [B, A*block], block_pos, labels [B, A, block-1], mask [B,1,Q,L+Q]).
    """
    bsz, length = tokens.shape
    dev = tokens.device
    scores = torch.rand(bsz, length - block, generator=gen, device="cpu")[:, 1:]
    anchors = (scores.topk(n_anchors, dim=1).indices + 1).sort(dim=1).values.to(dev)  # [B, A]
    offs = torch.arange(block, device=dev)
    pos = anchors[:, :, None] + offs  # [B, A, block]
    block_ids = torch.full_like(pos, mask_id)
    block_ids[:, :, 0] = tokens.gather(1, anchors)
    labels = tokens.gather(1, pos[:, :, 1:].reshape(bsz, -1)).view(bsz, n_anchors, block - 1)
    q = n_anchors * block
    q_anchor = anchors[:, :, None].expand(bsz, n_anchors, block).reshape(bsz, q)
    ctx_ok = torch.arange(length, device=dev)[None, None, :] < q_anchor[:, :, None]  # [B, Q, L]
    blk = torch.arange(q, device=dev) // block
    self_ok = (blk[:, None] == blk[None, :]).expand(bsz, q, q)
    mask = torch.cat([ctx_ok, self_ok], dim=2)[:, None]
    return block_ids.view(bsz, q), pos.view(bsz, q), labels, mask


def position_weights(block: int, gamma: float, device) -> torch.Tensor:
    k = torch.arange(1, block, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    return w / w.sum() * (block - 1)


def draft_loss(
    draft: DFlashDraft, embed: nn.Embedding, lm_head: nn.Linear, tokens, feats, *, n_anchors, block, mask_id, gamma, gen
):
    """Weighted cross entropy of block slots 1..block-1 and the per-slot top-1 accuracy."""
    block_ids, block_pos, labels, mask = training_batch(tokens, n_anchors, block, mask_id, gen)
    bsz, length = tokens.shape
    ctx_pos = torch.arange(length, device=tokens.device).expand(bsz, length)
    out = draft(embed(block_ids), block_pos, feats, ctx_pos, mask)
    out = out.view(bsz, n_anchors, block, -1)[:, :, 1:]
    logits = lm_head(out).float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    ce = ce.view(bsz, n_anchors, block - 1)
    w = position_weights(block, gamma, tokens.device)
    loss = (ce * w).mean()
    acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
    return loss, acc


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
