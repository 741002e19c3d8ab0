"""DDTREE's start-up memory accounting (issue 9): the sampling pre-warm's shape and the tree
builder's capture plan; print one JSON report.

argv: fixtures dir (config.json-only target/ and draft/ models). Run with PYTHONPATH = a complete
patched sglang tree. See test_memory_accounting.py for what is real and what is stood in.
"""

from __future__ import annotations

import json
import sys
import types

import _graphs_harness
import torch

VOCAB = 50
BLOCK = 8          # drafter block size b
BUDGET = 16        # B: B + 1 = 17 verify rows per request
GRAPH_MAX_BS = 4   # SGLang's largest decode graph batch (max_decode_logits_rows = 4 * (B + 1))
MAX_RUNNING = 6


def prewarm_shape(failing_walk=None) -> dict:
    """DDTreeWorkerV2.prewarm_sampling on a stood-in CUDA device: which logits shape it
    rehearses and what headroom it records."""
    from sglang.srt import utils as sgl_utils
    from sglang.srt.model_executor.model_runner import SamplingPrewarmResult
    from sglang.srt.speculative import ddtree_worker_v2 as W
    from sglang.srt.speculative import dflash_worker_v2 as DW
    from sglang.srt.speculative import eagle_utils as EU

    seen = []
    # --- stand-ins: a CUDA device and its memory statistics (none here) ------------------
    sgl_utils.is_cuda = lambda: True
    DW.is_cuda = lambda: True
    DW.is_dflash_sampling_verify_available = lambda: True
    DW._get_or_create_chain_verify_buffers = lambda **kw: None
    peak = {"bytes": 0}
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.reset_peak_memory_stats = lambda *a, **k: None
    torch.cuda.memory_stats = lambda *a, **k: {"allocated_bytes.all.current": 0,
                                               "allocated_bytes.all.peak": peak["bytes"]}

    # DFLASH's chain sampler is a CUDA kernel: record its input shape only.
    def dflash_sampler(*, candidates, next_token_logits, **kw):
        seen.append(("dflash_chain", tuple(next_token_logits.shape)))
        peak["bytes"] = 3 * next_token_logits.numel() * 4

    DW.compute_dflash_sampling_correct_drafts_and_bonus = dflash_sampler
    # DDTREE's walk sampler (eagle_utils.sample_tree_target_tokens): its renorms are the
    # CUDA kernels (flashinfer) once is_cuda() is true; record its inputs only.
    def walk_sampler(logits, sampling_info, *, batch_size, draft_token_num):
        seen.append(("ddtree_walk", tuple(logits.shape), batch_size, draft_token_num,
                     [bool(sampling_info.need_top_k_sampling), bool(sampling_info.need_top_p_sampling),
                      bool(sampling_info.need_min_p_sampling)]))
        peak["bytes"] = 3 * logits.numel() * 4
        return torch.zeros((batch_size, draft_token_num), dtype=torch.int64)

    EU.sample_tree_target_tokens = failing_walk or walk_sampler

    # --- the worker: attributes its __init__ sets (the real __init__ loads two models) -----
    w = object.__new__(W.DDTreeWorkerV2)
    runner = types.SimpleNamespace(
        # SGLang's ModelRunner.max_decode_logits_rows (model_runner.py:905): the largest
        # decode graph batch x logits rows per request (B + 1 under DDTREE).
        max_decode_logits_rows=lambda: GRAPH_MAX_BS * (BUDGET + 1),
        max_running_requests=MAX_RUNNING,
        sampling_prewarm_result=SamplingPrewarmResult(),
        prewarm_sampling=lambda: SamplingPrewarmResult(),
    )
    w.__dict__.update(block_size=BLOCK, ddtree_budget=BUDGET, verify_width=BUDGET + 1,
                      device="cpu", model_runner=runner,
                      model_config=types.SimpleNamespace(vocab_size=VOCAB),
                      _target_worker=types.SimpleNamespace(model_runner=runner))
    # The builder capture (patch ddtree-worker) runs first in prewarm_sampling; tested elsewhere.
    w.capture_ddtree_builder_graphs = lambda: []
    result = w.prewarm_sampling()
    shape = getattr(w, "_sampling_prewarm_shape", None)
    return {
        "seen": seen,
        "shape": list(shape()) if shape else None,
        "headroom": result.sampling_headroom_bytes,
        "input_bytes": result.sampling_input_bytes,
        "recorded": runner.sampling_prewarm_result == result,
    }


def prewarm_out_of_memory() -> dict:
    """prewarm_sampling when the rehearsal's allocation fails (as on an 80 GB H100 with
    --speculative-ddtree-budget auto, bench/engine-h200/flashinfer-step-h100-2026-12-06/): the
    error the server stops with. Stood in: the failing allocation (the walk sampler raises
    torch's OutOfMemoryError, as torch.empty does on the GPU) and torch.cuda.mem_get_info."""
    def failing_walk(logits, sampling_info, *, batch_size, draft_token_num):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.32 GiB.")

    torch.cuda.mem_get_info = lambda *a, **k: (617 << 20, 80 << 30)
    try:
        prewarm_shape(failing_walk)
    except BaseException as e:  # noqa: BLE001 -- the error is the result
        return {"type": type(e).__name__, "message": str(e), "cause": type(e.__cause__).__name__}
    return {"type": None}


def prewarm_input_out_of_memory() -> dict:
    """prewarm_sampling when the rehearsal's own input, the [bs x (B + 1), vocab] float32 logits
    matrix, does not fit: the same start-up error. Stood in: that one allocation (torch.zeros of
    that shape raises torch's OutOfMemoryError, as on the GPU) and torch.cuda.mem_get_info."""
    real_zeros = torch.zeros
    rows = min(GRAPH_MAX_BS, MAX_RUNNING) * (BUDGET + 1)

    def zeros(*size, **kw):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        if shape == (rows, VOCAB) and kw.get("dtype") == torch.float32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.32 GiB.")
        return real_zeros(*size, **kw)

    torch.cuda.mem_get_info = lambda *a, **k: (617 << 20, 80 << 30)
    torch.zeros = zeros
    try:
        prewarm_shape()
    except BaseException as e:  # noqa: BLE001 -- the error is the result
        return {"type": type(e).__name__, "message": str(e), "cause": type(e.__cause__).__name__}
    finally:
        torch.zeros = real_zeros
    return {"type": None}


def capture_plan(fx: str) -> dict:
    """DDTreeWorkerV2.ddtree_builder_capture_plan after SGLang's full DDTREE ServerArgs
    resolution on a mocked Hopper (tests/sglang/_graphs_harness.py's stand-ins)."""
    from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.runtime_context import create_context, get_exec, use_context
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative import ddtree_worker_v2 as W

    out = {}
    for name, extra, max_running, rows in (
        ("max_running_48", ["--max-running-requests", "48"], 48, 49),
        ("max_running_5", ["--max-running-requests", "5"], 5, 6),
        ("req_rows_below", ["--max-running-requests", "48"], 48, 20),
        ("graph_bs_given", ["--max-running-requests", "48", "--cuda-graph-bs-decode", "1", "3", "9", "64"],
         48, 49),
    ):
        argv = ["--model-path", f"{fx}/target", "--device", "cuda",
                "--speculative-algorithm", "DDTREE",
                "--speculative-draft-model-path", f"{fx}/draft",
                "--speculative-dflash-block-size", "16", "--attention-backend", "triton"] + extra
        try:
            sa = prepare_server_args(argv)
            sa.resolve_once()
            cfg = resolved_view(sa)
            w = object.__new__(W.DDTreeWorkerV2)
            w.server_args = sa
            w._target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
                max_running_requests=max_running,
                req_to_token_pool=types.SimpleNamespace(size=rows)))
            with use_context(create_context(sa, role="harness")):
                plan = w.ddtree_builder_capture_plan()
                decode = get_exec().graph.cuda_graph_config.decode
                ladder = generate_decode_cuda_graph_batch_sizes(sa, min(max_running, rows))
            out[name] = {"plan": plan, "decode_bs": decode.bs, "decode_backend": str(decode.backend),
                         "ladder": ladder, "max_running": cfg.max_running_requests}
        except Exception as e:  # noqa: BLE001
            import traceback

            out[name] = {"error": f"{type(e).__name__}: {e}", "where": traceback.format_exc()[-800:]}
    return out


def main() -> None:
    fx = sys.argv[1]
    _graphs_harness.mock_cuda_platform((9, 0))  # a Hopper (H200)
    report = {"plan": capture_plan(fx)}
    try:
        report["prewarm"] = prewarm_shape()
    except BaseException as e:  # noqa: BLE001 -- reported, the test names it
        import traceback

        report["prewarm"] = {"error": f"{type(e).__name__}: {e}"[:400],
                             "where": traceback.format_exc()[-1500:]}
    report["prewarm_oom"] = prewarm_out_of_memory()
    report["prewarm_input_oom"] = prewarm_input_out_of_memory()
    print("REPORT " + json.dumps(report, default=str))


if __name__ == "__main__":
    main()
    sys.exit(0)
