"""The patched modules import, and DDTREE server args resolve through SGLang's own code.

One subprocess (sglang imported once) under PYTHONPATH = the complete patched tree:
``prepare_server_args([...])`` (SGLang's CLI parser, flags generated from the new fields), then
``handle_speculative_decoding`` (SGLang's pipeline step, which dispatches to ``_handle_ddtree``),
read back through ``resolving_view``. Model paths are config.json-only dirs (no weights).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps


@pytest.fixture(scope="module")
def report(patched_site, model_fixtures, harness):
    return harness(patched_site, "_args_harness.py", str(model_fixtures))


def test_patched_modules_import(report):
    bad = {m: v for m, v in report["imports"].items() if v != "ok"}
    assert not bad, bad
    assert "sglang.srt.speculative.ddtree_worker_v2" in report["imports"]


def test_dispatch(report):
    d = report["dispatch"]
    assert "error" not in d, d
    # DDTREE has its own predicate and joins the DFlash family; upstream's is_dflash() keeps
    # meaning linear DFlash (issue 24: widening it changed 13 upstream call sites unseen).
    assert d["name"] == "DDTREE" and d["is_ddtree"] and d["is_dflash_family"] and not d["is_dflash"]
    assert d["draft_layout_as_dflash"] is True, d
    assert d["dflash_is_ddtree"] is False
    assert d["supports_mixed_chunk"] is False
    assert d["worker"] == "sglang.srt.speculative.ddtree_worker_v2.DDTreeWorkerV2"
    assert d["worker_is_dflash_v2"] and d["dflash_worker"] == "DFlashWorkerV2"


def _ok(report, name):
    c = report["cases"][name]
    assert "ok" in c, c
    return c["ok"]


@pytest.mark.parametrize("name,b,k,budget", [
    ("default_from_draft_config", 16, 32, 64),   # block size read from the drafter config
    ("explicit_b16", 16, 32, 64),
    ("budget128_k16_debug", 16, 16, 128),
    ("budget4_default_cap", 4, 4, 4),           # default cap = min(budget, 32)
    ("triton_backend", 16, 32, 64),
    ("explicit_consistent_eagle_fields", 16, 32, 64),
    ("hybrid_unsafe", 16, 32, 64),
    ("max_running_requests_kept", 16, 32, 64),
])
def test_derived_shape(report, name, b, k, budget):
    r = _ok(report, name)
    assert r["speculative_algorithm"] == "DDTREE"
    assert r["speculative_dflash_block_size"] == b
    assert r["speculative_num_steps"] == b - 1
    assert r["speculative_eagle_topk"] == k
    assert r["speculative_num_draft_tokens"] == budget + 1
    assert r["page_size"] == 1
    # CUDA graphs stay on with triton and flashinfer (patch ddtree-server-args's default since the GPU checks)
    assert r["disable_cuda_graph"] is False, r
    # Overlap scheduling stays on (SGLang's default) under DDTREE since patch ddtree-server-args.
    assert r["disable_overlap_schedule"] is False, r
    assert r["attention_backend"] in ("flashinfer", "triton")


def test_overlap_schedule_can_still_be_turned_off(report):
    r = _ok(report, "overlap_off_by_flag")
    assert r["speculative_algorithm"] == "DDTREE" and r["disable_overlap_schedule"] is True, r


def test_auto_budget_resolves_to_the_largest_of_its_budgets(report):
    """Issue 20 (patch ddtree-server-args): --speculative-ddtree-budget auto keeps the word (the worker reads it)
    and sizes everything static for the largest budget it may pick, 8b - 1: the verify width, KV
    reserve and the top-K cap (min(127, 32))."""
    r = _ok(report, "budget_auto")
    assert r["speculative_ddtree_budget"] == "auto", r
    assert r["speculative_num_draft_tokens"] == 128 and r["speculative_eagle_topk"] == 32, r
    assert r["speculative_num_steps"] == 15 and r["disable_overlap_schedule"] is False, r
    r = _ok(report, "budget_auto_b8")
    assert r["speculative_num_draft_tokens"] == 64 and r["speculative_eagle_topk"] == 32, r
    assert report["budget_arg_error"] == (
        "ArgumentTypeError: expected a number of tree nodes (e.g. 64) or 'auto', got 'lots'"), report


def test_defaults_and_flags(report):
    r = _ok(report, "default_from_draft_config")
    assert r["speculative_ddtree_budget"] == 64 and r["speculative_ddtree_topk_cap"] is None
    assert r["speculative_ddtree_allow_hybrid_unsafe"] is False
    assert r["speculative_ddtree_debug_metrics"] is False
    assert r["attention_backend"] == "flashinfer" and r["max_running_requests"] == 32
    assert _ok(report, "budget128_k16_debug")["speculative_ddtree_debug_metrics"] is True
    assert _ok(report, "hybrid_unsafe")["speculative_ddtree_allow_hybrid_unsafe"] is True
    assert _ok(report, "triton_backend")["attention_backend"] == "triton"
    assert _ok(report, "max_running_requests_kept")["max_running_requests"] == 7


@pytest.mark.parametrize("name,needle", [
    ("err_budget_zero", "--speculative-ddtree-budget must be >= 1"),
    ("err_budget_too_big", "must be <= 1024"),
    ("err_budget_lt_depth", "must be >= the drafter block size - 1 (15)"),
    ("err_topk_zero", "--speculative-ddtree-topk-cap must be >= 1"),
    ("err_topk_gt_budget", "exceeds --speculative-ddtree-budget"),
    ("err_budget_gt_capacity", "exceeds the largest tree of depth 2"),
    ("err_block_size_one", "block size must be >= 2"),
    ("err_page_size", "--page-size 1"),
    ("err_attention_backend", "'fa3' cannot verify a DDTree"),
    ("err_decode_backend", "'trtllm_mha' cannot verify a DDTree"),
    ("err_hybrid", "--speculative-ddtree-allow-hybrid-unsafe"),
    ("err_conflicting_num_steps", "--speculative-num-steps=3 conflicts"),
    ("err_conflicting_topk", "--speculative-eagle-topk=2 conflicts"),
    ("err_conflicting_draft_tokens", "--speculative-num-draft-tokens=16 conflicts"),
    ("err_draft_window", "--speculative-draft-window-size"),
    ("err_rejection_sampling", "--speculative-use-rejection-sampling"),
    ("err_pp", "--pp-size 1"),
    ("err_cpu_device", "only supported on CUDA"),
    ("err_auto_tp2", "--speculative-ddtree-budget auto needs --tp-size 1"),
])
def test_invalid_combination_refused(report, name, needle):
    c = report["cases"][name]
    assert "error" in c, c
    assert c["error"].startswith("ValueError: DDTREE: "), c
    assert needle in c["error"], c


def test_linear_dflash_unchanged(report):
    r = _ok(report, "dflash_unchanged")
    assert (r["speculative_num_steps"], r["speculative_eagle_topk"],
            r["speculative_num_draft_tokens"]) == (1, 1, 16)
    assert r["disable_cuda_graph"] is False and r["disable_overlap_schedule"] is False
    assert r["max_running_requests"] == 48


def test_verify_input_layout(report):
    u = report["units"]
    assert u["full_mask_alloc"] and u["full_mask_buffer"] and u["qlen_only"], u
    assert u["eagle_fields"], u
    # tree_topk -1 (irregular), accept_index width = block size, N = B + 1, EAGLE_VERIFY.
    assert u["shape"][:4] == [-1, 5, 11, 11] and u["shape"][5] is True
    assert u["dummy"] == [15, 8, 65, 64, 16]
    assert all(0.0 <= x <= 10.0 for x in u["predicted_accept"])
    assert u["bitpacking_refused"] and "FULL_MASK and QLEN_ONLY" in u["bitpacking_refused"]


def test_metrics_log_interval_is_an_envs_knob(report):
    """SGLANG_DDTREE_METRICS_LOG_INTERVAL is an entry of SGLang's envs registry (issue 24)."""
    u = report["units"]
    assert u["metrics_interval_registered"] is True, u
    assert (u["metrics_interval_default"], u["metrics_interval_env"]) == (100, 7), u


def test_t_gt_0_walk_sampler_matches_target_distribution(report):
    # 4000 draws per node: the empirical frequencies of the per-node target samples
    # match softmax(logits / T) (per-request temperatures 1.0 and 0.5).
    assert report["units"]["walk_sampler_max_abs_err"] < 0.04


@pytest.mark.parametrize("cap", ["9.0", "10.0", "12.0"])
def test_ddtree_decode_cuda_graphs_full_resolution(patched_site, harness, model_fixtures, cap):
    """CUDA graphs through the WHOLE ServerArgs resolution (resolve_once) on a mocked sm90 /
    sm100 / sm120 CUDA platform. On triton and flashinfer the decode graphs stay on (patch ddtree-server-args:
    triton since the H200 check, issue 12; flashinfer since the H100 check, issue 22).
    --no-speculative-ddtree-cuda-graph ends with the decode graph backend disabled (issue 9:
    flipping only disable_cuda_graph left it 'full', cuda_graph_config is resolved from the
    boolean before the speculative hook runs). --disable-cuda-graph keeps meaning every phase
    off. Prefill graphs stay what SGLang picks for DFLASH (breakable: the prefill is linear
    DFlash's, no tree mask)."""
    rep = harness(patched_site, "_graphs_harness.py", str(model_fixtures), cap)
    assert rep["ddtree_flashinfer"].get("decode") == "full", rep["ddtree_flashinfer"]
    assert rep["ddtree_triton"].get("decode") == "full", rep["ddtree_triton"]
    assert rep["ddtree_flashinfer_eager"].get("decode") == "disabled", rep["ddtree_flashinfer_eager"]
    for name in ("ddtree_flashinfer", "ddtree_triton", "ddtree_flashinfer_eager"):
        assert rep[name]["prefill"] == rep["dflash_default"]["prefill"], rep
    assert rep["ddtree_disable_cuda_graph"]["decode"] == "disabled", rep
    assert rep["ddtree_disable_cuda_graph"]["prefill"] == "disabled", rep
    assert rep["dflash_default"]["decode"] != "disabled", rep  # the mock really is CUDA


@pytest.mark.parametrize("cap", ["9.0", "10.0", "12.0"])
def test_ddtree_unset_attention_backend_reads_a_tree_mask(patched_site, harness,
                                                          model_fixtures, cap):
    """Issue 9 (default backend): with no --attention-backend, the full resolution on
    sm90 / sm100 / sm120 picks a backend that reads an arbitrary ancestor mask (flashinfer
    when installed, else triton). Before the fix Hopper resolved to fa3 (the topk-one default
    runs before DDTREE derives its topk) and DDTREE was refused."""
    rep = harness(patched_site, "_graphs_harness.py", str(model_fixtures), cap)
    assert rep["ddtree_default"].get("attention_backend") in ("flashinfer", "triton"), rep
    backend = rep["ddtree_default"]["attention_backend"]
    assert rep["ddtree_default"]["decode"] == "full", (backend, rep)


def test_ddtree_req_to_token_row_headroom_covers_decode_reserve(patched_site, harness,
                                                                model_fixtures):
    """Issue 9 (KV row headroom): req_to_token rows are context_len + extra wide, and a DDTREE
    decode reserves committed + 2 * max(b, B + 1) slots (dflash_decode_window, patch ddtree-kv-reserve).
    extra was 4 + (B + 1): near the context limit a request wrote into the next row."""
    rep = harness(patched_site, "_graphs_harness.py", str(model_fixtures), "12.0")
    for name in ("ddtree_triton", "ddtree_b16_budget4"):
        c = rep[name]
        assert c["row_extra"] >= 2 * max(c["block"], c["num_draft_tokens"]), c
