"""Comparisons shared by the real-engine tests, and the reference they compare with."""

from __future__ import annotations

from pathlib import Path


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_tokens(label: str, got: list[list[int]], want: list[list[int]], prompts) -> None:
    bad = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            d = first_diff(g, w)
            bad.append(
                f"  request {i} (prompt len {len(prompts[i])}): first difference at token {d}\n    engine: {g}\n    {label}: {w}"
            )
    assert len(got) == len(want), f"{len(got)} outputs for {len(want)} prompts"
    assert not bad, f"engine output != {label}:\n" + "\n".join(bad)


def assert_greedy(outs, prompts, n, hf, plain_ids) -> None:
    got = [o["output_ids"] for o in outs]
    for o in outs:
        assert o["meta_info"].get("completion_tokens") == len(o["output_ids"]), o["meta_info"]
    assert_tokens("transformers greedy generate()", got, [hf(p, n) for p in prompts], prompts)
    assert_tokens("the plain engine", got, plain_ids, prompts)


def assert_overlap(eng, on: bool = True) -> None:
    """The engine resolved overlap scheduling as expected (``--disable-overlap-schedule`` is the
    only way off for DDTREE since patch ddtree-server-args; on is SGLang's default, also on the CPU engine for
    the DFlash family)."""
    got = eng.server_args.get("disable_overlap_schedule")
    assert got == str(not on), f"{eng.name}: disable_overlap_schedule={got!r}, expected {not on}"


class HFGreedy:
    """transformers' greedy ``generate()`` on the same target checkpoint (float32, CPU)."""

    def __init__(self, target: Path):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        self.model.generation_config.eos_token_id = None  # every case sets its own stop
        self.cache: dict = {}

    def __call__(self, prompt, n: int) -> list[int]:
        key = tuple(prompt)
        have = self.cache.get(key)
        if have is None or len(have) < n:
            with self.torch.no_grad():
                out = self.model.generate(self.torch.tensor([list(prompt)]), do_sample=False, max_new_tokens=n, pad_token_id=0)
            have = out[0, len(prompt) :].tolist()
            self.cache[key] = have
        return have[:n]
