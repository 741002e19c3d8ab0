"""Comparisons shared by the real-engine tests."""

from __future__ import annotations


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
            bad.append(f"  request {i} (prompt len {len(prompts[i])}): first difference at token {d}\n"
                       f"    engine: {g}\n    {label}: {w}")
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
    only way off for DDTREE since patch 0018; on is SGLang's default, also on the CPU engine for
    the DFlash family)."""
    got = eng.server_args.get("disable_overlap_schedule")
    assert got == str(not on), f"{eng.name}: disable_overlap_schedule={got!r}, expected {not on}"
