"""Tiny random-weight models the real-engine tests create (nothing is downloaded).

- target: a 3-layer ``Qwen3ForCausalLM`` (hidden 64, vocab 12), seeded random weights with a large
  init range so greedy decoding is not flat, float32 safetensors written by transformers;
- drafter: a 1-layer ``DFlashDraftModel`` in the z-lab checkpoint layout (``layers.0.*``, ``norm``,
  ``fc``, ``hidden_norm``; no embedding / lm head: DFlash uses the target's), ``block_size`` 8,
  ``target_layer_ids`` [0, 1] (``models/dflash.py`` needs max(id) + 1 <= target layers);
- hybrid: a config-only ``Qwen3NextForCausalLM`` (DDTREE refuses it while resolving arguments,
  before any weight is read);
- a WordLevel ``tokenizer.json`` built with ``tokenizers`` in each model dir.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 12
MASK_ID = 0  # "<mask>": the DFlash drafter's mask token
EOS_ID = 1  # "<eos>": the target's EOS; tests pass ignore_eos / their own stop tokens
HIDDEN = 64
BLOCK_SIZE = 8
SEED = 1234

_BASE = dict(
    vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
    rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=EOS_ID,
    pad_token_id=MASK_ID,
)


def _write_tokenizer(d: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<mask>", "<eos>"] + [f"w{i}" for i in range(2, VOCAB)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<mask>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>",
        "pad_token": "<mask>", "unk_token": "<mask>", "model_max_length": 4096,
    }))
    (d / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<eos>", "pad_token": "<mask>", "unk_token": "<mask>"}))


def make_target(d: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    d.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    cfg = Qwen3Config(**_BASE, num_hidden_layers=3, initializer_range=0.25,
                      architectures=["Qwen3ForCausalLM"], torch_dtype="float32")
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    model.save_pretrained(d, safe_serialization=True)
    _write_tokenizer(d)
    return d


def make_drafter(d: Path, target: Path) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    d.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED + 1)
    one = Qwen3ForCausalLM(Qwen3Config(**_BASE, num_hidden_layers=1, initializer_range=0.25))
    sd = {k.removeprefix("model."): v.detach().to(torch.float32).contiguous()
          for k, v in one.state_dict().items()
          if k.startswith("model.layers.") or k == "model.norm.weight"}
    sd["fc.weight"] = (torch.randn(HIDDEN, 2 * HIDDEN) * 0.25).contiguous()
    sd["hidden_norm.weight"] = torch.ones(HIDDEN)
    save_file(sd, str(d / "model.safetensors"))
    cfg = dict(_BASE, architectures=["DFlashDraftModel"], model_type="qwen3", num_hidden_layers=1,
               block_size=BLOCK_SIZE, num_target_layers=3, torch_dtype="float32",
               dflash_config={"mask_token_id": MASK_ID, "target_layer_ids": [0, 1]})
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    _write_tokenizer(d)
    return d


def make_hybrid(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(_BASE, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next",
               num_hidden_layers=4, full_attention_interval=4, linear_num_value_heads=4,
               linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
               linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, shared_expert_intermediate_size=32,
               decoder_sparse_step=1, torch_dtype="float32",
               layer_types=["linear_attention"] * 3 + ["full_attention"])
    (d / "config.json").write_text(json.dumps(cfg))
    _write_tokenizer(d)
    return d


def make_all(root: Path) -> dict[str, Path]:
    target = make_target(root / "target")
    return {"target": target, "draft": make_drafter(root / "draft", target),
            "hybrid": make_hybrid(root / "hybrid")}
