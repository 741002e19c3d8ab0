"""The series changes nothing for the algorithms users already run (issue 23): plain decoding and linear
DFLASH give the same tokens, and DFLASH the same acceptance per request, on the patched tree as on the
unpatched pinned wheel (the verified snapshot, `ddtree-deploy snapshot path`), the same engine config on
both. The series edits files those paths share (the DFlash worker, the attention backends, the decode
graph runner, the scheduler's hooks), so this is what a user needs to see before pushing it to a host
that also serves them.

Not covered here: EAGLE. It runs on this CPU engine with two more shimmed ops (each SGLang's own Triton
kernel under the interpreter), but its tokens are not greedy's, on the unpatched wheel as on the patched one:
EAGLE lays out its tree mask by ``eagle_utils.default_tree_mask_mode()`` (pinned wheel :132-135), which is
intel_amx's QLEN_ONLY whenever ``is_cpu()``, while the Triton backend's eager TARGET_VERIFY reads FULL_MASK
(``triton_backend.py`` :1051-1057; forcing FULL_MASK made all 5 prompts greedy-equal). The series fixes that
only for DDTREE (patch ddtree-verify-mask-layout). Comparing EAGLE needs the GPU engine (FULL_MASK there), or a shim that changes
EAGLE's own choice, which this suite does not make.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import re_cases as cases
from re_checks import assert_tokens

PROMPTS = cases.PROMPTS + [cases.LONG_PROMPT]


def _run(eng) -> list[dict]:
    return eng.generate(PROMPTS, cases.greedy(cases.N_NEW))


@pytest.mark.parametrize("name", ["plain", "dflash"])
def test_same_tokens_on_the_patched_and_the_unpatched_wheel(name, engines, re_site):
    from ddtree_deploy.pin import snapshot

    worker = Path("sglang/srt/speculative/ddtree_worker_v2.py")
    assert (re_site / worker).is_file() and not (snapshot.ensure_snapshot() / worker).exists()
    try:
        if name == "plain":  # the plain engine's greedy tokens, computed once for the whole suite
            patched = [{"output_ids": ids} for ids in engines.plain(PROMPTS, cases.N_NEW)]
        else:
            patched = _run(engines.get(name))
        pristine_eng = engines.pristine(name)
        assert pristine_eng.server_args["speculative_algorithm"] == ("None" if name == "plain" else "DFLASH")
        pristine = _run(pristine_eng)
    finally:
        engines.stop()
    assert_tokens("the unpatched wheel", [o["output_ids"] for o in patched],
                  [o["output_ids"] for o in pristine], PROMPTS)
    if name == "dflash":
        for a, b in zip(patched, pristine):
            for key in ("spec_verify_ct", "spec_accept_length"):
                assert a["meta_info"].get(key) == b["meta_info"].get(key), (key, a["meta_info"], b["meta_info"])
