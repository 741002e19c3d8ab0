"""spec_accept_rate for DDTREE (patch ddtree-debug-metrics), through SGLang's own per-request metric code.

Run in a subprocess with PYTHONPATH = a patched sglang tree. REAL: the patched
``TokenizerManager._calculate_spec_decoding_metrics`` (srt/managers/tokenizer_manager.py), the
method that writes spec_accept_rate / spec_accept_length / spec_num_proposed_drafts into a
response's meta_info. STOOD IN: the TokenizerManager instance (object.__new__: its __init__
launches the tokenizer and IPC; the method reads no instance field), the detokenizer's batch
output (a namespace with the per-request counters the scheduler accumulates:
spec_verify_ct, spec_num_correct_drafts, completion_tokens, the histogram), and
``get_spec()`` (tokenizer_manager.py:167 import; the published spec config bag, which needs a
resolved server launch) as a namespace with the three fields the method reads, set as
DDTREE's server-args hook sets them (0003: num_steps = block_size - 1, num_draft_tokens = B + 1).

The per-step accepted-draft counts are scripted here; the expected rate is computed from that
script independently: sum(accepted) / (steps x (block_size - 1)).
"""

from __future__ import annotations

import json
import types


def main() -> None:
    from sglang.srt.managers import tokenizer_manager as tm

    out = []
    for algo, block_size, budget, steps in [
        ("DDTREE", 16, 64, [15, 3, 0, 7, 15, 9]),
        ("DDTREE", 8, 32, [7, 7, 7, 7]),
        ("DFLASH", 16, None, [15, 3, 0, 7]),
    ]:
        num_draft_tokens = budget + 1 if algo == "DDTREE" else block_size
        tm.get_spec = lambda: types.SimpleNamespace(
            speculative_algorithm=algo,
            speculative_num_steps=block_size - 1,
            speculative_num_draft_tokens=num_draft_tokens,
        )
        tm._ragged_verify_cap_accept = lambda: False
        recv = types.SimpleNamespace(
            spec_verify_ct=[len(steps)],
            spec_num_correct_drafts=[sum(steps)],
            completion_tokens=[sum(steps) + len(steps)],
            spec_correct_drafts_histogram=None,
        )
        meta: dict = {}
        tm.TokenizerManager._calculate_spec_decoding_metrics(
            object.__new__(tm.TokenizerManager), meta, recv, 0)
        out.append({"algo": algo, "block_size": block_size, "budget": budget,
                    "steps": steps, "meta": meta})
    print("REPORT " + json.dumps({"cases": out}))


if __name__ == "__main__":
    main()
