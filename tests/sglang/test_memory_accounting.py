"""DDTREE's start-up memory accounting (issue 9, patch ddtree-worker), on the CPU.

What is REAL: the patched SGLang modules under their real dependencies;
``DDTreeWorkerV2.prewarm_sampling`` / ``_sampling_prewarm_shape`` (patch ddtree-worker) with DFlash's
``_prewarm_batch_size``, SGLang's graph-pool borrow switches and ``SamplingPrewarmResult``;
``DDTreeWorkerV2.ddtree_builder_capture_plan`` (patch ddtree-worker) after SGLang's FULL DDTREE
``ServerArgs`` resolution (``prepare_server_args`` + ``resolve_once``) read through SGLang's
runtime context (``create_context``/``get_exec``), and SGLang's own
``generate_decode_cuda_graph_batch_sizes`` as the reference ladder.

What is STOOD IN (``_memory_accounting_harness.py``): the CUDA device (``is_cuda()`` true; a mocked
Hopper for the argument resolution, as in ``_graphs_harness.py``, with its ``sgl_kernel`` stand-in),
``torch.cuda``'s memory statistics (no device here), the two samplers' CUDA kernels (DFLASH's chain
sampler, the flashinfer renorms of DDTREE's walk sampler: their input shapes are recorded, which is
what these tests are about), and the model runner's ``max_decode_logits_rows()`` (SGLang's
``model_runner.py:905``: the largest decode graph batch x logits rows per request, 4 x (B + 1) here)
plus the worker attributes its ``__init__`` sets (the real one loads two models).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps


@pytest.fixture(scope="module")
def report(patched_site, harness, model_fixtures):
    return harness(patched_site, "_memory_accounting_harness.py", str(model_fixtures))


def test_sampling_prewarm_covers_bs_times_budget_plus_one_rows(report):
    """(a) DDTREE samples every tree node at T > 0: bs x (B + 1) logits rows. DFLASH's pre-warm
    (what DDTREE inherited) rehearsed its chain sampler on bs x b rows with bs = rows // b
    (here 6 x 8 = 48 rows instead of 4 x 17 = 68)."""
    p = report["prewarm"]
    assert "error" not in p, p
    budget, block, graph_max_bs, max_running = 16, 8, 4, 6
    bs = min(graph_max_bs * (budget + 1) // (budget + 1), max_running)
    assert p["shape"] == [bs, budget + 1], p
    rehearsed = [s for s in p["seen"] if s[0] == "ddtree_walk"]
    assert rehearsed and all(s[1] == [bs * (budget + 1), 50] for s in rehearsed), p
    assert all(s[2:4] == [bs, budget + 1] for s in rehearsed), p
    assert all(s[4] == [True, True, True] for s in rehearsed), p  # top-k, top-p, min-p all on
    assert not [s for s in p["seen"] if s[0] == "dflash_chain"], p
    assert p["input_bytes"] == bs * (budget + 1) * 50 * 4, p
    assert p["headroom"] >= 2 * p["input_bytes"] and p["recorded"], p
    assert bs * (budget + 1) > min(graph_max_bs * (budget + 1) // block, max_running) * block


def test_a_rehearsal_that_does_not_fit_stops_start_up_with_the_flags_that_make_room(report):
    """On an 80 GB H100, `--speculative-ddtree-budget auto` with SGLang's default
    --mem-fraction-static died at start-up in this rehearsal with torch's bare "CUDA out of
    memory" (bench/engine-h200/flashinfer-step-h100-2026-12-06/). The server must say what the
    rehearsal needed and which flags make room."""
    for where in ("prewarm_oom", "prewarm_input_oom"):  # the sampler's passes, and its input matrix
        e = report[where]
        assert e["type"] == "RuntimeError" and e["cause"] == "OutOfMemoryError", (where, e)
        m = e["message"]
        assert "4 requests x 17 tree rows (B + 1) x 50 vocabulary entries" in m, m  # min(4 x 17 // 17, 6)
        assert "0.60 GiB was free" in m, m  # 617 MiB
        for flag in ("--mem-fraction-static", "--max-running-requests", "--speculative-ddtree-budget"):
            assert flag in m, (flag, m)


def test_builder_capture_plan_is_sglangs_decode_batch_sizes(report):
    """(b) The tree builder's graphs are captured for SGLang's decode CUDA-graph batch sizes
    (the same sizes the target's decode graphs are captured for: with triton DDTREE keeps them
    on, patch ddtree-server-args) up to the largest decode batch, plus that batch, so every decode batch pads
    into a captured graph."""
    plan = report["plan"]
    for name, case in plan.items():
        assert "error" not in case, (name, case)
        assert case["decode_backend"].lower().endswith("full"), case
    c = plan["max_running_48"]
    assert c["plan"] == c["decode_bs"] == c["ladder"], c  # SGLang's speculative ladder
    assert c["plan"][:8] == [1, 2, 3, 4, 5, 6, 7, 8] and c["plan"][-1] == 48, c
    assert plan["max_running_5"]["plan"] == [1, 2, 3, 4, 5], plan["max_running_5"]
    # Fewer req_to_token rows than max_running_requests: the rows bound the batch.
    assert plan["req_rows_below"]["plan"] == [b for b in c["ladder"] if b <= 20], plan
    # --cuda-graph-bs-decode given: those sizes (<= 48) plus 48.
    assert plan["graph_bs_given"]["plan"] == [1, 3, 9, 48], plan["graph_bs_given"]
