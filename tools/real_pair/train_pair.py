"""Train a small real target + DFlash drafter pair on Python source text (issue 21).

What it writes under ``--out`` (everything a CPU test, the H200 harness and the DDTree reference need):
- ``target/``: a ``Qwen3ForCausalLM`` (transformers ``save_pretrained``, bfloat16 safetensors) and its
  byte-level BPE tokenizer (``tokenizer.json``; ``<mask>`` = id 0 for DFlash, ``<|endoftext|>`` = id 1 = EOS);
- ``draft/``: a ``DFlashDraftModel`` in the z-lab layout (``dflash_draft.py``), block 16, bfloat16;
- ``heldout_prompts.json``: prompts cut from files kept out of tokenizer and model training;
- ``train_log.jsonl``: one line per logged step (phase, step, loss, lr, elapsed); ``summary.json``: the
  configuration, corpus statistics, step counts, held-out losses and the drafter's offline acceptance.

The corpus is every ``.py`` file under ``--corpus-root`` (default: this interpreter's standard library),
sorted by path; a file is held out when the SHA-256 of its relative path ends in a byte < 6 (about 2%).
Seeds are fixed. Step counts are fixed by ``--target-steps`` / ``--draft-steps``, lowered to what fits
``--*-budget-s`` after timing the first 10 steps (the step count run is logged, so a rerun with that count
repeats the run on the same machine and software).

Usage on the GPU machine: ``python3 tools/real_pair/train_pair.py --out $OUT/pair --device cuda``;
here, a seconds-long CPU smoke: ``--device cpu --size tiny``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from dflash_draft import DFlashDraft, cosine_lr, draft_loss  # the script's own folder is sys.path[0]

MASK, EOS = "<mask>", "<|endoftext|>"
SIZES = {
    # all weights together in bfloat16: target ~10.5 MiB, drafter ~3.6 MiB (issue 21: <= 24 MiB)
    "full": dict(
        vocab=4096,
        hidden=256,
        inter=768,
        layers=4,
        heads=4,
        kv_heads=2,
        head_dim=64,
        draft_layers=2,
        seq=512,
        batch=64,
        draft_batch=32,
        anchors=32,
    ),
    # the CPU-trainable sibling (minutes on 2 cores), the same recipe
    "small": dict(
        vocab=2048,
        hidden=128,
        inter=384,
        layers=3,
        heads=2,
        kv_heads=1,
        head_dim=64,
        draft_layers=1,
        seq=256,
        batch=16,
        draft_batch=8,
        anchors=16,
    ),
    "tiny": dict(
        vocab=512,
        hidden=64,
        inter=128,
        layers=2,
        heads=2,
        kv_heads=1,
        head_dim=32,
        draft_layers=1,
        seq=128,
        batch=8,
        draft_batch=4,
        anchors=4,
    ),
}
BLOCK = 16


def collect(roots: list[Path], max_bytes: int) -> tuple[list[str], list[tuple[str, str]], dict]:
    files = []
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            if "site-packages" in p.parts and root.name != "site-packages" or not p.is_file():
                continue
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if 200 <= len(text) <= 200_000:
                files.append((f"{root.name}/{p.relative_to(root)}", text))
    train, held = [], []
    for rel, text in files:
        (held if hashlib.sha256(rel.encode()).digest()[-1] < 6 else train).append((rel, text))
    # a deterministic subset when the corpus is larger than max_bytes (ordered by path hash)
    train.sort(key=lambda rt: hashlib.sha256(rt[0].encode()).hexdigest())
    kept, size = [], 0
    for rel, text in train:
        if size + len(text) > max_bytes:
            continue
        kept.append(text)
        size += len(text)
    stats = {"files_seen": len(files), "train_files": len(kept), "train_bytes": size, "heldout_files": len(held)}
    return kept, held, stats


def train_tokenizer(texts: list[str], vocab: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[MASK, EOS], show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(MASK) == 0 and tok.token_to_id(EOS) == 1
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS,
                "pad_token": MASK,
                "model_max_length": 2048,
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": EOS, "pad_token": MASK}))
    return tok


def encode(tok, texts: list[str]) -> np.ndarray:
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(1)
    return np.asarray(ids, dtype=np.int16)


def windows(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq] for s in starts.tolist()]).long()


def target_config(s: dict):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["inter"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
        initializer_range=0.02,
        architectures=["Qwen3ForCausalLM"],
        torch_dtype="bfloat16",
    )


class Log:
    def __init__(self, path: Path) -> None:
        self.f = path.open("w")
        self.t0 = time.perf_counter()

    def __call__(self, **kw) -> None:
        kw["elapsed_s"] = round(time.perf_counter() - self.t0, 2)
        self.f.write(json.dumps(kw) + "\n")
        self.f.flush()
        print(json.dumps(kw), flush=True)


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def run_steps(step_fn, max_steps: int, budget_s: float, dev: str, log: Log, phase: str) -> int:
    """20 timed steps (after 10 warm-up steps), then as many as fit the budget (at most max_steps); returns the total run."""
    total = max_steps
    step = 0
    t0 = 0.0
    while step < total:
        if step == 10:  # steps 10-29 are timed: the first ones include one-off kernel builds and warm-up
            _sync(dev)
            t0 = time.perf_counter()
        loss, extra = step_fn(step, total)
        if step == 29:
            _sync(dev)
            per = (time.perf_counter() - t0) / 20
            total = max(40, min(max_steps, int(budget_s / per)))
            log(phase=phase, event="timed", s_per_step=round(per, 4), steps=total)
        if step % 50 == 0 or step == total - 1:
            log(phase=phase, step=step, loss=round(float(loss), 4), **extra)
        step += 1
    return total


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, seq: int, dev: str, n: int = 64) -> float:
    gen = torch.Generator().manual_seed(7)
    x = windows(stream, n, seq, gen).to(dev)
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
        logits = model(x[:, :-1]).logits.float()
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)))


@torch.no_grad()
def offline_dflash_tau(target, draft, layer_ids, prompts, new_tokens: int, dev: str) -> dict:
    """Greedy linear DFlash, the reference's loop without caches: mean accepted tokens per step (incl. bonus)."""
    emb, head = target.model.embed_tokens, target.lm_head
    taus, per_depth = [], np.zeros(BLOCK - 1)
    for p in prompts:
        seq = torch.tensor([p], device=dev)
        n0 = seq.shape[1]
        seq = torch.cat([seq, target(seq).logits[:, -1:].argmax(-1)], dim=1)  # the pending (bonus) token
        while seq.shape[1] < n0 + new_tokens:
            s = seq.shape[1] - 1  # position of the pending token: the block's anchor
            hs = target(seq[:, :s], output_hidden_states=True).hidden_states
            feats = torch.cat([hs[i + 1] for i in layer_ids], dim=-1).float()
            blk = torch.zeros(1, BLOCK, dtype=torch.long, device=dev)
            blk[0, 0] = seq[0, s]
            pos = torch.arange(s, s + BLOCK, device=dev)[None]
            mask = torch.ones(1, 1, BLOCK, s + BLOCK, dtype=torch.bool, device=dev)
            d = draft(emb(blk).float(), pos, feats, torch.arange(s, device=dev)[None], mask)
            blk[0, 1:] = head(d[:, 1:]).argmax(-1)[0]
            cand = torch.cat([seq[:, :s], blk], dim=1)
            post = target(cand).logits[0, s : s + BLOCK].argmax(-1)  # post[j]: the target's token at s + j + 1
            acc = int((blk[0, 1:] == post[:-1]).long().cumprod(0).sum())
            per_depth[:acc] += 1
            seq = torch.cat([cand[:, : s + acc + 1], post[acc : acc + 1][None]], dim=1)
            taus.append(acc + 1)
    return {
        "tau": round(float(np.mean(taus)), 3),
        "steps": len(taus),
        "accept_rate_by_depth": [round(float(x) / len(taus), 3) for x in per_depth],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--corpus-root", type=Path, action="append")
    ap.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="full",
        help="full: the H200 pair; small: a sibling a CPU trains in minutes; tiny: a smoke of the script",
    )
    ap.add_argument("--max-bytes", type=int, default=40_000_000)
    ap.add_argument("--target-steps", type=int, default=4000)
    ap.add_argument("--draft-steps", type=int, default=3000)
    ap.add_argument("--target-budget-s", type=float, default=200)
    ap.add_argument("--draft-budget-s", type=float, default=170)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    s = SIZES[args.size]
    tiny = args.size == "tiny"
    dev = args.device
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = args.out
    (out / "target").mkdir(parents=True, exist_ok=True)
    (out / "draft").mkdir(parents=True, exist_ok=True)
    log = Log(out / "train_log.jsonl")
    summary: dict = {"sizes": s, "block": BLOCK, "device": dev, "torch": torch.__version__, "seed": args.seed}
    if dev == "cuda":
        summary["gpu"] = torch.cuda.get_device_name()
        torch.backends.cuda.matmul.allow_tf32 = True

    roots = args.corpus_root or [Path(sysconfig.get_paths()["stdlib"])]
    texts, held, stats = collect(roots, args.max_bytes if not tiny else 300_000)
    summary["corpus"] = {**stats, "roots": [str(r) for r in roots]}
    tok = train_tokenizer(texts, s["vocab"], out / "target")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / "draft" / f).write_bytes((out / "target" / f).read_bytes())
    train_ids = torch.from_numpy(encode(tok, texts).astype(np.int64))
    held_ids = torch.from_numpy(encode(tok, [t for _, t in held]).astype(np.int64))
    summary["corpus"].update(train_tokens=train_ids.numel(), heldout_tokens=held_ids.numel())
    log(phase="data", **summary["corpus"])

    # ---- target
    from transformers import Qwen3ForCausalLM

    cfg = target_config(s)
    target = Qwen3ForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(target.parameters(), lr=1.5e-3, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed + 1)

    def target_step(step, total):
        lr = cosine_lr(step, total, 1.5e-3, 100)
        for g in opt.param_groups:
            g["lr"] = lr
        x = windows(train_ids, s["batch"], s["seq"] + 1, gen).to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = target(x[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        return loss.detach(), {"lr": round(lr, 6)}

    steps = run_steps(target_step, args.target_steps if not tiny else 30, args.target_budget_s, dev, log, "target")
    target.eval()
    summary["target"] = {
        "steps": steps,
        "batch": s["batch"],
        "seq": s["seq"],
        "params": sum(p.numel() for p in target.parameters()),
        "heldout_loss": round(heldout_loss(target, held_ids, s["seq"], dev), 4),
        "train_loss": round(heldout_loss(target, train_ids, s["seq"], dev), 4),
    }
    log(phase="target", event="done", **summary["target"])
    target.to(torch.bfloat16).save_pretrained(out / "target", safe_serialization=True)
    target.float()
    for p in target.parameters():
        p.requires_grad_(False)

    # ---- drafter (target layers: every layer but the last, whose HF hidden state is after the final norm)
    layer_ids = list(range(s["layers"] - 1))
    draft = DFlashDraft(
        hidden=s["hidden"],
        heads=s["heads"],
        kv_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        inter=s["inter"],
        layers=s["draft_layers"],
        n_features=len(layer_ids),
    ).to(dev)
    for name, p in draft.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    dopt = torch.optim.AdamW(draft.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    dgen = torch.Generator().manual_seed(args.seed + 2)

    def draft_step(step, total):
        lr = cosine_lr(step, total, 1e-3, 100)
        for g in dopt.param_groups:
            g["lr"] = lr
        x = windows(train_ids, s["draft_batch"], s["seq"], dgen).to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            with torch.no_grad():
                hs = target(x, output_hidden_states=True).hidden_states
                feats = torch.cat([hs[i + 1] for i in layer_ids], dim=-1)
            loss, acc = draft_loss(
                draft,
                target.model.embed_tokens,
                target.lm_head,
                x,
                feats,
                n_anchors=s["anchors"],
                block=BLOCK,
                mask_id=0,
                gamma=7.0,
                gen=dgen,
            )
        dopt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        dopt.step()
        return loss.detach(), {
            "lr": round(lr, 6),
            "acc_d1": round(float(acc[0]), 3),
            "acc_d8": round(float(acc[min(7, BLOCK - 2)]), 3),
        }

    dsteps = run_steps(draft_step, args.draft_steps if not tiny else 30, args.draft_budget_s, dev, log, "draft")
    draft.eval()
    summary["draft"] = {
        "steps": dsteps,
        "batch": s["draft_batch"],
        "anchors": s["anchors"],
        "target_layer_ids": layer_ids,
        "params": sum(p.numel() for p in draft.parameters()),
    }
    from safetensors.torch import save_file

    save_file(
        {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in draft.state_dict().items()},
        str(out / "draft" / "model.safetensors"),
    )
    dcfg = json.loads(cfg.to_json_string())
    dcfg.update(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        num_hidden_layers=s["draft_layers"],
        block_size=BLOCK,
        num_target_layers=s["layers"],
        torch_dtype="bfloat16",
        dflash_config={"mask_token_id": 0, "target_layer_ids": layer_ids},
    )
    dcfg.pop("layer_types", None)
    (out / "draft" / "config.json").write_text(json.dumps(dcfg, indent=1))

    # ---- held-out prompts (64 tokens, starting at a line start) and the offline acceptance
    rng = random.Random(args.seed + 3)
    prompts = []
    nl = {i for t, i in tok.get_vocab().items() if "Ċ" in t}
    for rel, text in sorted(held):
        ids = tok.encode(text).ids
        starts = [i + 1 for i, t in enumerate(ids[:-200]) if t in nl]
        if starts:
            st = rng.choice(starts)
            prompts.append({"file": rel, "input_ids": ids[st : st + 64], "text": tok.decode(ids[st : st + 64])})
    rng.shuffle(prompts)
    prompts = prompts[:96]
    (out / "heldout_prompts.json").write_text(json.dumps(prompts, indent=0))
    n_eval = 16 if not tiny else 2
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=False):
        summary["offline_dflash_greedy"] = offline_dflash_tau(
            target, draft, layer_ids, [p["input_ids"] for p in prompts[:n_eval]], 64 if not tiny else 16, dev
        )
    summary["offline_dflash_greedy"]["prompts"] = n_eval
    log(phase="eval", **summary["offline_dflash_greedy"])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    sizes = {p.name: p.stat().st_size for p in out.rglob("*.safetensors")}
    log(phase="done", weights_bytes=sum(sizes.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
