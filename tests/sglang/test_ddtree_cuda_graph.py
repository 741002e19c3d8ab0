"""Issue 12 (CUDA graphs for DDTREE, patches ddtree-server-args and ddtree-cuda-graph): --speculative-ddtree-cuda-graph, on CPU.

Through the WHOLE ServerArgs resolution on a mocked sm90 / sm100 / sm120 CUDA platform
(_ddtree_cuda_graph_harness.py says what is real and what is stood in):
- the decode graph backend stays ON ('full') with the flag, and without it when the target's
  backend is triton or flashinfer (the default since the GPU checks: triton on the H200,
  flashinfer on the lent H100); off with --no-speculative-ddtree-cuda-graph and with
  --disable-cuda-graph; other backends (fa3, torch_native) are refused for DDTREE on CUDA;
- the target decode graph runner captures TARGET_VERIFY B + 1 tokens per request with a
  DDTreeVerifyInput dummy that carries the runner's custom-mask buffer (so the backend bakes
  its static mask buffer into the graph); the draft runner captures the b-token DFlash block;
- the Triton backend's verify-mask buffer (its own init_cuda_graph_state) holds a FULL_MASK
  tree of B + 1 tokens for every captured request at the full context length, and the capture
  metadata reads that buffer with max_extend_len = B + 1.
Capture and replay themselves need a GPU: the lead runs them on the H200.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps

CAPS = ["9.0", "10.0", "12.0"]


@pytest.fixture(scope="module", params=CAPS)
def rep(request, patched_site, model_fixtures, harness):
    return harness(patched_site, "_ddtree_cuda_graph_harness.py", str(model_fixtures),
                   request.param, timeout=400)


def _ok(rep, name):
    c = rep[name]
    assert "error" not in c, c
    return c


def test_flag_keeps_decode_graphs_on(rep):
    # the explicit flag with any custom-mask backend; with triton, the default (no flag) too
    for name in ("flag_triton", "flag_flashinfer", "flag_default_backend", "flag_triton_b255",
                 "noflag_triton", "noflag_flashinfer"):
        c = _ok(rep, name)
        assert c["decode"] == "full", c
        assert c["disable_cuda_graph"] is False, c
        assert c["attention_backend"] in ("flashinfer", "triton"), c
        # Overlap scheduling stays on with graphs (patch ddtree-server-args).
        assert c["disable_overlap_schedule"] is False, c
    assert _ok(rep, "flag_triton")["num_draft_tokens"] == 65
    assert _ok(rep, "flag_triton_b255")["num_draft_tokens"] == 256


def test_graphs_off_with_no_flag_and_other_backends_refused(rep):
    # --no-speculative-ddtree-cuda-graph is eager with a checked backend too
    c = _ok(rep, "no_flag_triton")
    assert c["decode"] == "disabled" and c["disable_cuda_graph"] is True, c
    # a backend without the per-request ancestor mask is refused where it enters,
    # naming the two that work (so no unchecked backend ever reaches graph capture)
    for name in ("noflag_fa3", "noflag_torch_native"):
        err = rep[name].get("error", "")
        assert err.startswith("ValueError: DDTREE: attention backend"), (name, rep[name])
        assert "use --attention-backend flashinfer or triton" in err, err
    # no backend given: the rule follows whatever SGLang resolved (triton on this mocked platform)
    c = _ok(rep, "noflag_default_backend")
    assert c["decode"] == ("full" if c["attention_backend"] == "triton" else "disabled"), c
    # --disable-cuda-graph still means every graph off, flag or not
    for name in ("flag_disable_cuda_graph", "noflag_triton_disable_cuda_graph"):
        c = _ok(rep, name)
        assert c["decode"] == "disabled" and c["prefill"] == "disabled", c
        assert c["disable_cuda_graph"] is True, c


@pytest.mark.parametrize("name,budget", [("flag_triton", 64), ("flag_triton_b255", 255)])
def test_target_runner_captures_b_plus_1_tokens_with_a_ddtree_mask_dummy(rep, name, budget):
    s = _ok(rep, name)["shapes"]
    t = s["target"]
    n = budget + 1
    assert t["width"] == n, t
    assert t["dummy"] == "DDTreeVerifyInput", t
    assert t["dummy_input_type"] == "EAGLE_VERIFY", t
    assert t["dummy_num_tokens_per_req"] == n, t
    # A non-None custom mask at capture is what makes the backend use its mask buffer.
    assert t["dummy_mask_is_runner_buffer"] and not t["dummy_mask_none"], t
    assert t["dummy_capture_hidden"] == "FULL", t  # the drafter needs the target's hidden states
    assert t["dummy_max_tree_depth"] == 16, t      # accept_index is [bs, block_size]
    assert t["runner_mask_numel"] >= t["capture_mask_numel_needed"], t


@pytest.mark.parametrize("name", ["flag_triton", "flag_triton_b255"])
def test_draft_runner_captures_the_b_token_block(rep, name):
    d = _ok(rep, name)["shapes"]["draft"]
    assert d["width"] == 16, d
    assert d["dummy"] == "DFlashVerifyInput" and d["dummy_input_type"] == "DFLASH_VERIFY", d
    assert d["dummy_num_tokens_per_req"] == 16 and d["dummy_mask_none"], d


@pytest.mark.parametrize("name,budget", [("flag_triton", 64), ("flag_triton_b255", 255)])
def test_triton_verify_mask_buffer_sized_for_b_plus_1(rep, name, budget):
    s = _ok(rep, name)["shapes"]
    tr = s["triton"]
    n, max_bs, ctx = budget + 1, s["capture_bs_max"], tr["context_len"]
    assert tr["verify_mask_mode"] == "FULL_MASK" == tr["verify_tree_mask_mode"], tr
    assert tr["verify_mask_max_bs"] == max_bs, tr
    # FULL_MASK: N rows of (context + N) cells per request, every captured request.
    assert tr["verify_mask_numel"] == max_bs * n * (ctx + n), tr
    assert tr["target_verify_num_tokens_per_req"] == n, tr
    assert tr["capture_custom_mask_is_verify_buffer"], tr
    assert tr["capture_max_extend_len"] == n, tr


def test_eager_fallback_is_logged_with_its_reason(rep):
    """With decode graphs captured, a verify that ran eagerly is logged once per batch size
    with the reason; with graphs off (no runner) nothing is logged."""
    f = rep["fallback_log"]
    assert "error" not in f, f
    on = f["graphs_on"]
    assert len(on) == 2, on  # bs 4 replayed; bs 12 twice -> once; bs 3 once
    assert "batch size 12 > the largest captured batch size 8" in on[0], on
    assert "cannot replay this batch (size 3)" in on[1], on
    assert f["graphs_off"] == [], f
