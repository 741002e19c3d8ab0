"""DDTREE with --speculative-ddtree-cuda-graph: full ServerArgs resolution on a mocked CUDA
platform, then what the decode graph runners and the Triton backend would capture; one JSON report.

argv: fixtures dir, then the compute capability "major.minor" (9.0 Hopper, 10.0, 12.0).

REAL: SGLang's prepare_server_args + resolve_once (every resolution pass, the series'
_handle_ddtree); ModelRunner.decode_num_tokens_per_req (the capture width of each decode graph
runner, srt/model_executor/model_runner.py:876); DecodeCudaGraphRunner.get_spec_info (the
capture dummy, srt/model_executor/runner/decode_cuda_graph_runner.py:2069 + patch ddtree-cuda-graph);
DecodeInputBuffers.create (the runner's static custom-mask buffer); TritonAttnBackend.__init__,
init_cuda_graph_state and _build_cuda_graph_forward_metadata (the verify-mask buffer and the
TARGET_VERIFY metadata baked into a graph); ModelConfig from the fixture's config.json.

STOOD IN (cannot exist here): the CUDA device and sgl_kernel, exactly as _graphs_harness.py
(torch.cuda queries answer for an sm<major><minor> H200/B200/RTX card, plus
get_device_properties for the SM count TritonAttnBackend.__init__ reads; sgl_kernel names import
and raise if called, except sgl_kernel.utils.is_arch_support_pdl, which answers False: a launch
option, triton_backend.py:340); the ModelRunner / runner objects whose methods are called unbound: a
namespace holding only the attributes those methods read (spec_algorithm, is_draft_worker,
server_args, buffers, the pools' sizes, the value-head width, device "cpu"), because building a
real ModelRunner loads weights onto a GPU. The methods under test run unchanged; capture and
replay themselves need a GPU (the lead runs them on the H200).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch
from _graphs_harness import mock_cuda_platform  # run as a script: its folder is on sys.path

BLOCK = 16
MAX_CTX = 512  # --context-length for the fixture target (keeps the CPU buffers small)


def _mock_cuda(cap) -> None:
    mock_cuda_platform(cap)
    import sgl_kernel.utils  # the stand-in

    # TritonAttnBackend.__init__ asks whether the arch supports programmatic dependent
    # launch (a kernel launch option; it sizes no buffer): answer no instead of raising.
    sgl_kernel.utils.is_arch_support_pdl = lambda *a, **k: False
    # TritonAttnBackend.__init__ reads the SM count (get_device_core_count).
    torch.cuda.get_device_properties = lambda *a, **k: SimpleNamespace(
        multi_processor_count=132, major=cap[0], minor=cap[1], name="mocked")


def _capture_shapes(sa, fx, budget):
    """Inside the resolved context: what the decode graph runners and Triton would capture."""
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.model_executor.runner_utils.buffers import DecodeInputBuffers
    from sglang.srt.runtime_context import get_exec, get_spec
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    cfg = resolved_view(sa)
    algo = SpeculativeAlgorithm.from_string(cfg.speculative_algorithm)
    spec = get_spec()
    capture_bs = list(get_exec().graph.cuda_graph_config.decode.bs)
    max_bs = min(max(capture_bs), int(cfg.max_running_requests))
    out = {"capture_bs_max": max_bs}
    model_config = ModelConfig.from_server_args(sa)
    for role, is_draft in (("target", False), ("draft", True)):
        mr = SimpleNamespace(spec_algorithm=algo, is_draft_worker=is_draft, server_args=sa)
        width = ModelRunner.decode_num_tokens_per_req(
            mr, num_draft_tokens=spec.speculative_num_draft_tokens)
        bufs = DecodeInputBuffers.create(
            device=torch.device("cpu"), max_bs=max_bs, max_num_token=max_bs * width,
            hidden_size=8, next_token_logits_buffer=torch.zeros(1), dtype=torch.float32,
            num_dp_ranks=1, pp_size=1, is_encoder_decoder=False, require_mlp_tp_gather=False,
            seq_len_fill_value=1, encoder_len_fill_value=0, num_tokens_per_req=width,
            cache_loc_dtype=torch.int64, enable_mamba_track=False)
        runner = SimpleNamespace(
            model_runner=SimpleNamespace(spec_algorithm=algo, is_draft_worker=is_draft,
                                         attn_backend=object(), model_config=model_config,
                                         dtype=torch.float32, device="cpu"),
            buffers=bufs, captured_req_width=width,
            speculative_num_steps=spec.speculative_num_steps,
            speculative_num_draft_tokens=spec.speculative_num_draft_tokens,
            _capture_ragged_verify_layout=lambda n: None)
        dummy = DecodeCudaGraphRunner.get_spec_info(runner, max_bs * width)
        # The capture-time mask this dummy implies: N * (fill + N) cells per request.
        need = max_bs * width * (1 + width)
        out[role] = {
            "width": width,
            "dummy": type(dummy).__name__,
            "dummy_input_type": dummy.spec_input_type.name,
            "dummy_num_tokens_per_req": dummy.num_tokens_per_req,
            "dummy_mask_is_runner_buffer": dummy.custom_mask is bufs.custom_mask,
            "dummy_mask_none": dummy.custom_mask is None,
            "dummy_capture_hidden": dummy.capture_hidden_mode.name,
            "runner_mask_numel": bufs.custom_mask.numel(),
            "capture_mask_numel_needed": need,
        }
        if not is_draft:
            out[role]["dummy_topk"] = getattr(dummy, "topk", None)
            out[role]["dummy_max_tree_depth"] = getattr(dummy, "max_tree_depth", None)
            # The Triton backend of the target runner, built by its own __init__ over a
            # runner namespace (the pools are sized, never used here).
            pool = SimpleNamespace(size=max_bs, req_to_token=torch.zeros((max_bs, MAX_CTX + 64),
                                                                         dtype=torch.int32))
            kv = SimpleNamespace(start_layer=0, get_value_buffer=lambda i: torch.zeros(1, 2, 16),
                                 get_v_head_dim=lambda: 16)
            tmr = SimpleNamespace(
                spec_algorithm=algo, is_draft_worker=False, server_args=sa,
                req_to_token_pool=pool, sliding_window_size=None, token_to_kv_pool=kv,
                token_to_kv_pool_allocator=None, kv_index_translator=None,
                model_config=model_config, kv_cache_dtype=torch.bfloat16, device="cpu",
                gpu_id=0)
            tmr.decode_num_tokens_per_req = (
                lambda *, num_draft_tokens=None: ModelRunner.decode_num_tokens_per_req(
                    tmr, num_draft_tokens=num_draft_tokens))
            triton = TritonAttnBackend(tmr)
            triton.init_cuda_graph_state(max_bs, max_bs * width)
            vm = triton.verify_mask
            md = triton._build_cuda_graph_forward_metadata(max_bs, ForwardMode.TARGET_VERIFY,
                                                           dummy)
            out["triton"] = {
                "verify_mask_numel": vm.buffer.numel() if vm else None,
                "verify_mask_mode": vm.mode.name if vm else None,
                "verify_mask_max_bs": vm.max_bs if vm else None,
                "verify_tree_mask_mode": triton.verify_tree_mask_mode.name,
                "context_len": int(model_config.context_len),
                "target_verify_num_tokens_per_req": triton.target_verify_num_tokens_per_req,
                "capture_custom_mask_is_verify_buffer": (
                    md.custom_mask is not None and vm is not None
                    and md.custom_mask.data_ptr() == vm.buffer.data_ptr()),
                "capture_max_extend_len": md.max_extend_len,
            }
    out["budget"] = budget
    return out


def _fallback_log() -> dict:
    """DDTreeWorkerV2._log_verify_graph_fallback on a worker object whose target model
    runner holds a decode graph runner captured up to batch 8 (a namespace: only max_bs is
    read) or none (graphs off)."""
    import logging

    from sglang.srt.speculative.ddtree_worker_v2 import DDTreeWorkerV2

    records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = logging.getLogger("sglang.srt.speculative.ddtree_worker_v2")
    log.addHandler(_Keep())
    out = {}
    for name, runner, calls in (
        ("graphs_on", SimpleNamespace(max_bs=8), [(4, True), (12, False), (12, False), (3, False)]),
        ("graphs_off", None, [(12, False)]),
    ):
        w = object.__new__(DDTreeWorkerV2)
        w._target_worker = SimpleNamespace(
            model_runner=SimpleNamespace(decode_cuda_graph_runner=runner))
        records.clear()
        for bs, ran in calls:
            w._log_verify_graph_fallback(bs, ran)
        out[name] = list(records)
    return out


def main() -> None:
    fx, cap = sys.argv[1], tuple(int(x) for x in sys.argv[2].split("."))
    _mock_cuda(cap)
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import prepare_server_args

    report = {}

    def case(name, extra, *, shapes=False, budget=64):
        argv = ["--model-path", f"{fx}/target", "--device", "cuda",
                "--speculative-algorithm", "DDTREE",
                "--speculative-draft-model-path", f"{fx}/draft",
                "--speculative-dflash-block-size", str(BLOCK),
                "--speculative-ddtree-budget", str(budget),
                "--context-length", str(MAX_CTX)] + extra
        try:
            sa = prepare_server_args(argv)
            sa.resolve_once()  # the whole resolution pipeline, as the launchers run it
            cfg = resolved_view(sa)
            cg = cfg.cuda_graph_config
            rec = {"decode": str(cg.decode.backend), "prefill": str(cg.prefill.backend),
                   "decode_bs_max": max(cg.decode.bs or [0]),
                   "disable_cuda_graph": cfg.disable_cuda_graph,
                   "num_draft_tokens": cfg.speculative_num_draft_tokens,
                   "block": cfg.speculative_dflash_block_size,
                   "attention_backend": cfg.attention_backend,
                   "disable_overlap_schedule": cfg.disable_overlap_schedule}
            if shapes:
                with use_context(create_context(sa, role="harness")):
                    rec["shapes"] = _capture_shapes(sa, fx, budget)
            report[name] = rec
        except Exception as e:  # noqa: BLE001
            import traceback

            report[name] = {"error": f"{type(e).__name__}: {e}",
                            "where": traceback.format_exc()[-1500:]}

    flag = ["--speculative-ddtree-cuda-graph"]
    case("flag_triton", flag + ["--attention-backend", "triton"], shapes=True)
    case("flag_triton_b255", flag + ["--attention-backend", "triton"], shapes=True, budget=255)
    case("flag_flashinfer", flag + ["--attention-backend", "flashinfer"])
    case("flag_default_backend", flag)
    case("flag_disable_cuda_graph", flag + ["--attention-backend", "triton",
                                            "--disable-cuda-graph"])
    case("noflag_triton", ["--attention-backend", "triton"], shapes=True)
    case("noflag_flashinfer", ["--attention-backend", "flashinfer"])
    case("noflag_fa3", ["--attention-backend", "fa3"])
    case("noflag_torch_native", ["--attention-backend", "torch_native"])
    case("noflag_default_backend", [])
    case("noflag_triton_disable_cuda_graph", ["--attention-backend", "triton", "--disable-cuda-graph"])
    case("no_flag_triton", ["--no-speculative-ddtree-cuda-graph", "--attention-backend", "triton"])
    try:
        report["fallback_log"] = _fallback_log()
    except Exception as e:  # noqa: BLE001
        report["fallback_log"] = {"error": f"{type(e).__name__}: {e}"}
    print("REPORT " + json.dumps(report, default=str))


if __name__ == "__main__":
    main()
