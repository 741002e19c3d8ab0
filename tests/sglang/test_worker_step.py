"""DDTreeWorkerV2's decode step (patch ddtree-worker) on the CPU, against a reference walk.

What is REAL (the patched SGLang code, imported under its real dependencies):
  ``DDTreeWorkerV2.forward_batch_generation`` -> ``_forward_ddtree_decode`` (the whole step as
  shipped), ``DDTreeDraftHead`` (the lm_head projection through a real dense lm_head module,
  ``topk_logprobs_from_logits``' CPU path, ``ddtree_guard_topk``),
  ``build_ddtree_tree_from_topk`` (the core, patch ddtree-tree-builder), ``DDTreeVerifyInput.from_tree`` and
  ``ddtree_verify_mask`` (FULL_MASK layout, the one the GPU backends read),
  ``make_draft_input_v2`` / ``DFlashDraftInputV2``, ``GenerationBatchResult``, the accepted-path
  compaction ``eagle_worker_common._compact_accept_to_front`` and ``DDTreeDebugMetrics``.

What is STOOD IN (needs a GPU, model weights or a launched server):
  * the drafter forward (``_run_draft_block``): hidden states built to favour the target's
    greedy continuation at rank 1-3 (through the identity lm_head they are the logits);
  * ``run_eagle_verify``: a stand-in that runs a fake target model whose per-node logits are
    a deterministic function of the node's full context, where the context is READ FROM THE
    VERIFY INPUT'S CUSTOM MASK (so a wrong mask or wrong positions give wrong tokens), then
    the greedy tree walk as a line-by-line Python port of SGLang's Triton
    ``verify_tree_greedy_kernel_triton``, then SGLang's own ``_compact_accept_to_front``;
    the KV move and the attention kernels do not run;
  * ``assign_extend_cache_locs_func`` (Triton/sgl_kernel) as a torch gather, the draft-KV
    writer ``_append_target_hidden_to_draft_kv_by_loc`` as a spy, the id translation as
    identity, ``get_parallel()`` as TP = 1, ``Tensor.record_stream`` as a no-op.

Two settings. (1) A hash-defined target (logits a pseudo-random function of the whole context)
and a drafter favouring the target's continuation at rank 1-3. (2) The OFFLINE REFERENCE ENGINE
(tools/ddtree_offline): its tiny random-weight HF Llama target (as the stand-in target forward,
full recompute per node context) and its SyntheticDrafter (as the stand-in drafter: its
full-vocab log-probs are the hidden states through the identity lm_head); the engine runs each
prompt alone (batch 1, HF KV cache, tree attention mask), the worker runs the 3 prompts as one
batch; per-round acceptance lengths and tokens must be identical.

Reference for (1): the heap-oracle tree (``build_ddtree_tree_heap``) from log_softmax top-K of the
same drafter hidden states, target tokens from explicit root-to-node paths, ``ddtree_accept``;
and target-only greedy decoding. Several budgets / caps (including the K = 1 chain), 3
requests of different lengths, 6 chained decode steps each.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps


@pytest.fixture(scope="module")
def report(patched_site, harness):
    return harness(patched_site, "_worker_step_harness.py")


def test_step_matches_reference_walk(report):
    assert len(report["cases"]) == 4
    for case in report["cases"]:
        assert case["steps"] == 6
        assert case["same_tree"], case
        assert case["mismatch"] == [], case


def test_end_to_end_lossless_vs_target_only(report):
    for case in report["cases"]:
        assert case["lossless"], case
        # The trees do get accepted beyond the bonus token sometimes.
        assert max(case["taus"]) >= 2, case


def test_debug_metrics_in_meta_info(report):
    case = report["cases"][0]
    assert case["customized_info_keys"] == [
        "ddtree_accept_length", "ddtree_predicted_accept_length",
        "ddtree_tree_depth", "ddtree_tree_size"]
    s = case["metrics_summary"]
    assert s["request_steps"] == 18 and s["steps"] == 6
    assert sum(s["accept_length_histogram"]) == 18
    assert abs(s["mean_accept_length"] - sum(case["taus"]) / 18) < 1e-9
    assert len(s["per_depth_acceptance"]) == 5
    assert s["per_depth_acceptance"] == sorted(s["per_depth_acceptance"], reverse=True)
    assert sum(s["tree_depth_histogram"]) == 18


def test_draft_kv_append_projects_only_committable_rows(report):
    """Issue 9 (memory accounting, patch ddtree-worker): the draft-KV append gathers the first
    w = min(b, B + 1) rows of each request's compacted verify block (at most b are committed)
    before the drafter's projections, instead of projecting all bs * (B + 1) rows; the
    accepted rows, their positions and draft cache slots are unchanged (checked per step in
    the harness: case["mismatch"])."""
    wide = 0
    for case in report["cases"]:
        assert case["kv_rows_projected"] == case["kv_rows_expected"], case
        assert case["mismatch"] == [], case
        wide += case["budget"] + 1 > 6  # B + 1 > b: the gather drops rows
    assert wide >= 3


def test_builder_graphs_captured_at_startup_never_in_a_step(report):
    """Issue 9 (patch ddtree-worker): the worker captures the tree builder's graphs at start-up
    (capture_ddtree_builder_graphs, largest first) and its decode steps only replay them: the
    batch of 3 pads into the size-4 graph, the trees and tokens are unchanged. The control is the
    builder the worker made before the fix: it captured inside the first decode step.
    (CUDA graphs are stood in on the CPU: see run_graphed in the harness.)"""
    g = report["graphed"]
    worker, legacy = g["worker"], g["legacy"]
    for case in (worker, legacy):
        assert case["mismatch"] == [] and case["lossless"] and case["same_tree"], case
    assert worker["captured"] == [1, 2, 4], worker
    assert [e for e in worker["events"] if e[1] == "capture"] == [
        ["startup", "capture", 4], ["startup", "capture", 2], ["startup", "capture", 1]], worker
    assert worker["events"][3:] == [["forward", "replay", 4]] * 6, worker
    assert ["forward", "capture", 3] in legacy["events"], legacy  # the detector works


def test_tree_taken_from_the_draft_graph_replay(report):
    """Issue 20 (patch ddtree-worker): with decode CUDA graphs the per-depth top-K and the tree builder
    are a capture tail hook of the draft runner (DDTreeDraftHead), registered by the worker
    right before the draft graphs are captured, so a graphed step takes its tree from the draft
    graph's replay (static buffers; a batch of 3 padded into the size-4 graph, garbage padding
    rows) instead of running the top-K and the builder after it. The stand-in replay hands the
    worker no hidden states, so a step that recomputed the tree would fail. The builder's own
    graphs are then not captured at start-up. (CUDA graphs stood in: see run_graphed.)"""
    g = report["graphed"]["draft-graph"]
    assert g["mismatch"] == [] and g["lossless"] and g["same_tree"], g
    assert g["sampler"] == "None", g  # no linear-DFlash greedy head in the draft graph
    assert g["draft_events"] == [["startup", 4], ["startup", 2], ["startup", 1]] + [["forward", 4]] * 6, g
    assert g["builder_graphs_at_startup"] == [], g


def test_auto_budget_steps_verify_the_subtree_of_the_chosen_budget(report):
    """Issue 20 (patch ddtree-worker): with ``--speculative-ddtree-budget auto`` the worker builds the largest
    budget's tree and each step verifies the subtree of the budget its controller picks (a new
    batch size runs every candidate once, smallest first). Every step's verified tree equals the
    heap oracle's tree for that budget, the tokens equal the reference walk and target-only greedy,
    the debug metrics' tree size is the verified tree's, and meta_info's ``ddtree_budget`` says
    which budget each request-step ran."""
    a = report["auto"]
    assert a["mismatch"] == [] and a["lossless"] and a["same_tree"], a
    assert a["budgets_run"][:3] == [5, 11, 23], a["budgets_run"]  # the cold start
    assert set(a["budgets_run"]) == {5, 11, 23} and len(a["budgets_run"]) == 8, a
    assert a["customized_budgets"] == [[b] * 3 for b in a["budgets_run"]], a
    assert a["metrics_summary"]["request_steps"] == 24, a


def test_step_matches_offline_engine(report):
    assert len(report["offline"]) == 2
    for case in report["offline"]:
        assert case["mismatch"] == [], case
        assert case["same_taus"], case
        assert case["same_tokens"], case
        assert max(max(t) for t in case["worker_taus"]) >= 3, case


def test_verify_mask_layout_is_the_target_backends(patched_site, harness):
    """Issue 9 (mask layout): the worker lays the ancestor mask out the way the attention
    backend it feeds reads it, not by the process-wide default. Under SGLANG_USE_CPU_ENGINE
    the default is intel_amx's QLEN_ONLY while Triton's eager TARGET_VERIFY reads FULL_MASK;
    taking the default gave every node a wrong mask on the CPU engine."""
    rep = harness(patched_site, "_mask_layout_harness.py")
    assert rep["default_mode"] == "QLEN_ONLY", rep  # the divergence this guards is present
    be = rep["backends"]
    for name in ("triton", "hybrid_linear(triton)"):
        assert be[name]["mode"] == "FULL_MASK", rep
        assert be[name]["is_full_layout"] and not be[name]["is_qlen_layout"], rep
    assert be["intel_amx"]["mode"] == "QLEN_ONLY", rep
    assert be["intel_amx"]["is_qlen_layout"], rep
    if "flashinfer" in be:
        assert be["flashinfer"]["mode"] == "FULL_MASK" and be["flashinfer"]["is_full_layout"], rep


def test_builder_input_logprobs_refused_above_zero_and_nan(patched_site, harness):
    """Issue 9 (smaller): the worker clamps the tree builder's log-probs to <= 0 and sends NaN
    to -inf (last), so the best-first builder never ranks a NaN or a > 0 value first."""
    lp = harness(patched_site, "_mask_layout_harness.py")["boundary_logprobs"]
    assert lp[0] == 0.0 and all(x <= 0.0 for x in lp) and lp[-1] == float("-inf"), lp
