"""DDTREE's decode memory check reserves what DDTREE's decode step allocates (patch ddtree-kv-reserve).

Run in a subprocess with PYTHONPATH = a patched sglang tree. REAL: the patched
``allocation_sizing.get_alloc_len_per_decode`` / ``get_alloc_reserve_per_decode`` (what
ScheduleBatch.check_decode_mem -> _new_tokens_required_next_decode_spec_v2 and the retraction
loop read), ``ScheduleBatch._new_tokens_required_next_decode_spec_v2`` itself,
``dflash_decode_window`` and ``page_aligned_decode_alloc_lens`` (what
DFlashDraftInputV2.prepare_for_decode allocates with reserve = 2 * dflash_decode_window).
STOOD IN: the published config bags (runtime_context.get_spec / get_alloc_page_size /
max_speculative_num_draft_tokens as imported by allocation_sizing.py:3-8 and
dflash_info_v2.py; publishing needs a resolved server launch) as namespaces holding what
DDTREE's server-args hook (patch ddtree-server-args) sets: num_steps = b - 1, eagle_topk = K,
num_draft_tokens = B + 1, dflash_block_size = b; the requests as namespaces with the two KV
lengths the functions read; ScheduleBatch via object.__new__ (the method reads no field).
"""

from __future__ import annotations

import json
import types


def main() -> None:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.mem_cache import allocation_sizing as sz
    from sglang.srt.speculative import dflash_info_v2 as dv2

    cases = []
    for b, budget, k, page in [(16, 64, 32, 1), (16, 15, 8, 1), (8, 128, 16, 1), (16, 64, 32, 16)]:
        spec = types.SimpleNamespace(
            speculative_algorithm="DDTREE", speculative_num_steps=b - 1,
            speculative_eagle_topk=k, speculative_num_draft_tokens=budget + 1,
            speculative_dflash_block_size=b,
        )
        sz.get_spec = dv2.get_spec = lambda: spec
        sz.max_speculative_num_draft_tokens = lambda: budget + 1
        sz.get_alloc_page_size = lambda: page
        reserve = sz.get_alloc_reserve_per_decode()
        alloc_reserve = 2 * dv2.dflash_decode_window(int(spec.speculative_num_draft_tokens))
        reqs = [types.SimpleNamespace(kv=types.SimpleNamespace(
            kv_committed_len=c, kv_allocated_len=a)) for c, a in
            [(100, 100), (37, 60), (500, 700), (1, 1)]]
        _, _, allocated = sz.page_aligned_decode_alloc_lens(
            reqs, reserve=alloc_reserve, page_size=page)
        checked = ScheduleBatch._new_tokens_required_next_decode_spec_v2(
            object.__new__(ScheduleBatch), reqs, page)
        cases.append({"b": b, "B": budget, "K": k, "page": page, "reserve": reserve,
                      "alloc_reserve": alloc_reserve, "check_tokens": checked,
                      "alloc_tokens": allocated})
    print("REPORT " + json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()
