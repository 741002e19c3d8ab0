"""An abort landing on a speculative accept run never emits more than max_new_tokens (patch spec-abort-caps-max-new-tokens).

Run in a subprocess with PYTHONPATH = a patched sglang tree. REAL: ``Req.update_finish_state``
and ``Req.output_ids_through_stop`` (what the batch result processor emits: ``finished_len``,
``managers/scheduler_components/batch_result_processor.py:215``) and ``FINISH_ABORT``. STOOD IN:
the request itself, made with ``object.__new__(Req)`` and only the fields those two read
(``output_ids``, ``finished_reason``, ``finished_len``, ``to_finish``, ``vocab_size``, ``sampling_params`` with
``max_new_tokens``, ``ignore_eos`` and no stop conditions): a real ``Req`` needs a resolved server
launch; the methods read no other field on these paths.
"""

from __future__ import annotations

import json
import types


def _req(output_ids, max_new, to_finish):
    from sglang.srt.managers.schedule_batch import Req

    r = object.__new__(Req)
    r.output_ids, r.finished_reason, r.finished_len, r.to_finish = list(output_ids), None, None, to_finish
    r.vocab_size = 1000
    r.sampling_params = types.SimpleNamespace(max_new_tokens=max_new, ignore_eos=True, stop_strs=[],
                                              stop_token_ids=None, stop_regex_strs=[])
    return r


def main() -> None:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    cases = []
    for name, n_out, accepted, max_new, abort in [
        ("abort, the run crosses the cap", 5, 3, 4, True),
        ("abort, inside the cap", 3, 2, 4, True),
        ("no abort, the run crosses the cap", 5, 3, 4, False),
    ]:
        r = _req(range(10, 10 + n_out), max_new, FINISH_ABORT() if abort else None)
        try:
            r.update_finish_state(accepted)
            emitted = list(r.output_ids_through_stop)
            cases.append({"name": name, "max_new": max_new, "emitted": len(emitted),
                          "finish": r.finished_reason.to_json() if r.finished_reason else None})
        except Exception as e:  # noqa: BLE001  (reported: the control case may read more fields)
            cases.append({"name": name, "error": f"{type(e).__name__}: {e}"})
    print("REPORT " + json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()
