"""Import the patched SGLang modules and resolve DDTREE server args; print one JSON report.

Run in a subprocess with PYTHONPATH = a complete patched sglang tree, argv[1] = a fixtures
dir holding target/, hybrid/ and draft/ model configs (config.json only). SGLang is imported
once; every check is batched into this one process.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback

MODULES = [
    "sglang",
    "sglang.srt.server_args",
    "sglang.srt.arg_groups.speculative_hook",
    "sglang.srt.arg_groups.fields.spec",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.ddtree_utils",
    "sglang.srt.speculative.ddtree_info",
    "sglang.srt.speculative.ddtree_metrics",
    "sglang.srt.speculative.dflash_info",
    "sglang.srt.speculative.dflash_info_v2",
    "sglang.srt.speculative.dflash_worker_v2",
    "sglang.srt.speculative.ddtree_worker_v2",
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.speculative.eagle_worker_common",
    "sglang.srt.speculative.spec_sampling_mask",
    "sglang.srt.models.dflash",
]

FIELDS = [
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "speculative_dflash_block_size", "page_size", "attention_backend", "disable_cuda_graph",
    "disable_overlap_schedule", "max_running_requests", "speculative_ddtree_budget",
    "speculative_ddtree_topk_cap", "speculative_ddtree_allow_hybrid_unsafe",
    "speculative_ddtree_debug_metrics", "speculative_algorithm",
]


def main() -> None:
    fx = sys.argv[1]
    report: dict = {"imports": {}, "cases": {}, "dispatch": {}}
    for m in MODULES:
        try:
            importlib.import_module(m)
            report["imports"][m] = "ok"
        except Exception as e:  # noqa: BLE001
            report["imports"][m] = f"{type(e).__name__}: {e}"

    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def parse(extra, model="target", algo="DDTREE"):
        argv = ["--model-path", f"{fx}/{model}", "--device", "cuda",
                "--speculative-algorithm", algo,
                "--speculative-draft-model-path", f"{fx}/draft"] + extra
        return prepare_server_args(argv)

    def case(name, extra, model="target", algo="DDTREE"):
        try:
            sa = parse(extra, model, algo)
            handle_speculative_decoding(sa)  # SGLang's own pipeline step (-> _handle_ddtree)
            cfg = resolving_view(sa)
            report["cases"][name] = {"ok": {f: getattr(cfg, f) for f in FIELDS}}
        except Exception as e:  # noqa: BLE001
            report["cases"][name] = {"error": f"{type(e).__name__}: {e}"}

    bs16 = ["--speculative-dflash-block-size", "16"]
    case("default_from_draft_config", [])
    case("explicit_b16", bs16)
    case("budget128_k16_debug", bs16 + ["--speculative-ddtree-budget", "128",
                                        "--speculative-ddtree-topk-cap", "16",
                                        "--speculative-ddtree-debug-metrics"])
    case("budget4_default_cap", ["--speculative-dflash-block-size", "4",
                                 "--speculative-ddtree-budget", "4"])
    case("triton_backend", bs16 + ["--attention-backend", "triton"])
    case("explicit_consistent_eagle_fields", bs16 + ["--speculative-num-steps", "15",
                                                     "--speculative-eagle-topk", "32",
                                                     "--speculative-num-draft-tokens", "65"])
    case("hybrid_unsafe", bs16 + ["--speculative-ddtree-allow-hybrid-unsafe"], model="hybrid")
    case("max_running_requests_kept", bs16 + ["--max-running-requests", "7"])
    case("overlap_off_by_flag", bs16 + ["--disable-overlap-schedule"])
    case("budget_auto", bs16 + ["--speculative-ddtree-budget", "auto"])
    case("budget_auto_b8", ["--speculative-dflash-block-size", "8", "--speculative-ddtree-budget", "AUTO"])
    case("err_auto_tp2", bs16 + ["--speculative-ddtree-budget", "auto", "--tp-size", "2"])
    from sglang.srt.arg_groups.fields.spec import _ddtree_budget_arg

    try:
        _ddtree_budget_arg("lots")
        report["budget_arg_error"] = None
    except Exception as e:  # noqa: BLE001  (argparse prints it as "error: argument ...: <msg>")
        report["budget_arg_error"] = f"{type(e).__name__}: {e}"
    # Invalid combinations.
    case("err_budget_zero", bs16 + ["--speculative-ddtree-budget", "0"])
    case("err_budget_too_big", bs16 + ["--speculative-ddtree-budget", "5000"])
    case("err_budget_lt_depth", bs16 + ["--speculative-ddtree-budget", "4"])
    case("err_topk_zero", bs16 + ["--speculative-ddtree-topk-cap", "0"])
    case("err_topk_gt_budget", bs16 + ["--speculative-ddtree-budget", "8",
                                       "--speculative-ddtree-topk-cap", "9"])
    case("err_budget_gt_capacity", ["--speculative-dflash-block-size", "3",
                                    "--speculative-ddtree-budget", "7",
                                    "--speculative-ddtree-topk-cap", "2"])
    case("err_block_size_one", ["--speculative-dflash-block-size", "1"])
    case("err_page_size", bs16 + ["--page-size", "16"])
    case("err_attention_backend", bs16 + ["--attention-backend", "fa3"])
    case("err_decode_backend", bs16 + ["--decode-attention-backend", "trtllm_mha"])
    case("err_hybrid", bs16, model="hybrid")
    case("err_conflicting_num_steps", bs16 + ["--speculative-num-steps", "3"])
    case("err_conflicting_topk", bs16 + ["--speculative-eagle-topk", "2"])
    case("err_conflicting_draft_tokens", bs16 + ["--speculative-num-draft-tokens", "16"])
    case("err_draft_window", bs16 + ["--speculative-draft-window-size", "64"])
    case("err_rejection_sampling", bs16 + ["--speculative-use-rejection-sampling"])
    case("err_pp", bs16 + ["--pp-size", "2"])
    case("err_cpu_device", bs16 + ["--device", "cpu"])
    # The linear DFlash path is untouched by the series.
    case("dflash_unchanged", [], algo="DFLASH")

    try:
        algo = SpeculativeAlgorithm.from_string("DDTREE")
        sa = parse(bs16)
        worker_cls = algo.create_worker(sa)
        report["dispatch"] = {
            "name": algo.name,
            "is_ddtree": algo.is_ddtree(),
            "is_dflash": algo.is_dflash(),
            "is_dflash_family": algo.is_dflash_family(),
            "dflash_is_ddtree": SpeculativeAlgorithm.DFLASH.is_ddtree(),
            "supports_mixed_chunk": algo.supports_mixed_chunk(),
            "worker": f"{worker_cls.__module__}.{worker_cls.__name__}",
            "dflash_worker": SpeculativeAlgorithm.DFLASH.create_worker(sa).__name__,
        }
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        report["dispatch"]["worker_is_dflash_v2"] = issubclass(worker_cls, DFlashWorkerV2)
        # The drafter's parallel layout (draft_parallel.py): DDTREE runs DFlash's drafter.
        from sglang.srt.speculative.draft_parallel import legacy_draft_parallel_spec

        report["dispatch"]["draft_layout_as_dflash"] = str(legacy_draft_parallel_spec(algo)) == str(
            legacy_draft_parallel_spec(SpeculativeAlgorithm.DFLASH)
        )
    except Exception:  # noqa: BLE001
        report["dispatch"] = {"error": traceback.format_exc()}
    report["units"] = units()
    print("REPORT " + json.dumps(report, default=str))


def units() -> dict:
    """Torch-level checks of the verify input against brute force."""
    import types

    import torch

    from sglang.srt.speculative.ddtree_info import DDTreeVerifyInput, ddtree_verify_mask
    from sglang.srt.speculative.ddtree_utils import build_ddtree_tree_from_topk
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    out = {}
    g = torch.Generator().manual_seed(0)
    bs, depth, k, budget = 3, 4, 3, 10
    lp = torch.log_softmax(torch.randn(bs, depth, 50, generator=g), -1)
    v, i = lp.topk(k, -1)
    seq = torch.tensor([5, 0, 7])
    tree = build_ddtree_tree_from_topk(i, v, torch.tensor([1, 2, 3]), seq, budget)
    n = budget + 1
    ref = torch.cat([
        torch.cat([torch.ones(n, int(seq[b]), dtype=torch.bool), tree.tree_mask[b]], 1).reshape(-1)
        for b in range(bs)])
    vi = DDTreeVerifyInput.from_tree(
        tree, seq_lens=seq, block_size=depth + 1, topk=k, budget=budget,
        mask_mode=TreeMaskMode.FULL_MASK, seq_lens_sum=int(seq.sum()), with_debug=True)
    out["full_mask_alloc"] = bool(torch.equal(vi.custom_mask, ref))
    buf = torch.zeros(ref.numel() + 37, dtype=torch.bool)
    ddtree_verify_mask(tree.tree_mask, seq, TreeMaskMode.FULL_MASK, out=buf)
    out["full_mask_buffer"] = bool(torch.equal(buf[: ref.numel()], ref))
    q = ddtree_verify_mask(tree.tree_mask, seq, TreeMaskMode.QLEN_ONLY)
    out["qlen_only"] = bool(torch.equal(q, tree.tree_mask.reshape(-1)))
    out["eagle_fields"] = bool(
        torch.equal(vi.draft_token, tree.draft_tokens.reshape(-1))
        and torch.equal(vi.positions, tree.positions.reshape(-1))
        and torch.equal(vi.retrieve_next_token, tree.retrive_next_token)
        and torch.equal(vi.retrieve_next_sibling, tree.retrive_next_sibling)
        and torch.equal(vi.retrieve_index, tree.retrive_index))
    out["shape"] = [vi.tree_topk, vi.max_tree_depth, vi.draft_token_num,
                    vi.num_tokens_per_req, int(vi.spec_input_type), vi.target_sample_walk]
    out["predicted_accept"] = [round(float(x), 6) for x in vi.predicted_accept]
    d = DDTreeVerifyInput.create_dummy(custom_mask=None, block_size=16, topk=8,
                                       draft_token_num=65)
    out["dummy"] = [d.spec_steps, d.topk, d.draft_token_num, d.budget, d.max_tree_depth]
    try:
        ddtree_verify_mask(tree.tree_mask, seq, TreeMaskMode.QLEN_ONLY_BITPACKING)
        out["bitpacking_refused"] = False
    except NotImplementedError as e:
        out["bitpacking_refused"] = str(e)
    # T > 0 walk sampler (patch ddtree-verify-input-and-walk): one target sample per node from softmax(logits / T)
    # (temperature only: top-k / top-p renorm are flashinfer kernels, absent on a CPU).
    from sglang.srt.speculative.eagle_utils import sample_tree_target_tokens

    torch.manual_seed(0)
    logits = torch.randn(2 * 2, 6)
    temps = torch.tensor([[1.0], [0.5]])
    # top-k / top-p / min-p "off" as SGLang's SamplingBatchInfo holds them (TOP_K_ALL, 1.0, 0.0).
    si = types.SimpleNamespace(temperatures=temps, need_top_k_sampling=False,
                               need_top_p_sampling=False, need_min_p_sampling=False)
    draws = 4000
    counts = torch.zeros(4, 6)
    for _ in range(draws // 100):
        big = logits.repeat(100, 1)  # 100 batches of 2 requests x 2 nodes
        si.temperatures = temps.repeat(100, 1)
        si.top_ks = torch.full((200,), 1 << 30, dtype=torch.int32)
        si.top_ps = torch.ones(200)
        si.min_ps = torch.zeros(200)
        toks = sample_tree_target_tokens(big, si, batch_size=200, draft_token_num=2)
        for row in range(4):
            b, node = divmod(row, 2)
            counts[row] += torch.bincount(toks.view(100, 2, 2)[:, b, node], minlength=6)
    emp = counts / counts.sum(1, keepdim=True)
    ref = torch.softmax(logits / torch.repeat_interleave(temps, 2, 0), -1)
    out["walk_sampler_max_abs_err"] = float((emp - ref).abs().max())
    # The metrics' log interval: SGLang's envs registry entry, read when the metrics are made.
    import os

    from sglang.srt.environ import envs
    from sglang.srt.speculative.ddtree_metrics import DDTreeDebugMetrics

    out["metrics_interval_registered"] = "SGLANG_DDTREE_METRICS_LOG_INTERVAL" in vars(type(envs))
    out["metrics_interval_default"] = DDTreeDebugMetrics(depth=3, budget=4).log_interval
    os.environ["SGLANG_DDTREE_METRICS_LOG_INTERVAL"] = "7"
    try:
        out["metrics_interval_env"] = DDTreeDebugMetrics(depth=3, budget=4).log_interval
    finally:
        del os.environ["SGLANG_DDTREE_METRICS_LOG_INTERVAL"]
    return out


if __name__ == "__main__":
    main()
