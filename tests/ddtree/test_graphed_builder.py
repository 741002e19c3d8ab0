"""``GraphedTreeBuilder``: the builder replayed from CUDA graphs, equal to the eager builder.

On this CPU machine the class must fall back to the eager builder (checked here, bit for bit);
its CUDA path (capture, replay, a new shape, LRU eviction) needs a GPU and is checked by
``tools/gpu_kernels/gpu_suite.py`` on an H200 (result committed in ``bench/gpu_suite-h200.log``) and by the
CUDA test below wherever one is present.
"""

from __future__ import annotations

import pytest
import torch

FIELDS = ("draft_tokens", "parents", "depths", "positions", "tree_mask", "retrive_index",
          "retrive_next_token", "retrive_next_sibling", "node_logprobs", "ranks")


def _inputs(du, bs, depth, k, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, depth, 50, generator=g) * 3
    ids, lps = du.topk_logprobs_from_logits(logits, k)
    root = torch.randint(0, 50, (bs,), generator=g)
    start = torch.randint(0, 100, (bs,), generator=g)
    return tuple(x.to(device) for x in (ids, lps, root, start))


def _same(a, b):
    return all(torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu()) for f in FIELDS) and a.max_depth == b.max_depth


@pytest.mark.parametrize("bs,depth,k,budget", [(1, 15, 8, 64), (3, 6, 4, 32), (2, 3, 2, 100)])
def test_cpu_falls_back_to_the_eager_builder(du, bs, depth, k, budget):
    builder = du.GraphedTreeBuilder(budget)
    for seed in range(3):
        x = _inputs(du, bs, depth, k, seed)
        assert _same(builder(*x), du.build_ddtree_tree_from_topk(*x, budget))
    assert builder.num_graphs == 0 and builder.failed is None


def test_disabled_by_environment(du, monkeypatch):
    monkeypatch.setenv(du.GRAPH_BUILDER_ENV, "0")
    assert du.GraphedTreeBuilder(16).enabled is False
    monkeypatch.setenv(du.GRAPH_BUILDER_ENV, "1")
    assert du.GraphedTreeBuilder(16).enabled is True
    assert du.GraphedTreeBuilder(16, enabled=False).enabled is False


def test_bad_inputs_are_refused_like_the_builder(du):
    builder = du.GraphedTreeBuilder(8)
    ids, lps, root, start = _inputs(du, 2, 4, 3, 0)
    with pytest.raises(ValueError):
        builder(ids, lps[:, :, :2], root, start)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run by tools/gpu_kernels/gpu_suite.py on an H200)")
def test_cuda_replay_equals_eager_across_shapes_and_eviction(du):
    builder = du.GraphedTreeBuilder(64, max_graphs=2)
    shapes = [(1, 15, 8), (4, 15, 8), (1, 15, 8), (2, 5, 3), (4, 15, 8)]
    for i, (bs, depth, k) in enumerate(shapes):
        x = _inputs(du, bs, depth, k, 100 + i, "cuda")
        assert _same(builder(*x), du.build_ddtree_tree_from_topk(*x, 64))
    assert builder.failed is None and builder.num_graphs == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run by tools/gpu_kernels/gpu_suite.py on an H200)")
def test_cuda_startup_capture_pads_and_never_captures_on_a_call(du):
    builder = du.GraphedTreeBuilder(64, capture_on_call=False)
    assert builder.capture([1, 2, 4], depth=15, topk=8, device="cuda") == [1, 2, 4]
    assert builder.num_graphs == 3 and builder.graph_bytes > 0
    for i, bs in enumerate([1, 3, 4, 2, 3, 6]):  # 3 -> graph 4; 6 -> eager
        x = _inputs(du, bs, 15, 8, 200 + i, "cuda")
        assert _same(builder(*x), du.build_ddtree_tree_from_topk(*x, 64))
    assert builder.num_graphs == 3 and builder.failed is None


# ------------------------------------------------------------------------------------------
# Start-up capture (issue 9): the capture plan and "never capture mid-step", on the CPU.
#
# STAND-IN: CUDA graphs do not exist here. ``_graphs_usable`` is made to accept CPU tensors and
# ``_capture`` records the call and returns an object whose ``replay()`` re-runs the eager builder
# into the captured output buffers from the captured static inputs (what a replay of the graph
# does: same buffers in, same buffers out). ``torch.cuda.synchronize`` / ``memory_reserved`` /
# ``graph_pool_handle`` (called by ``capture`` around the captures) become no-ops. The code under
# test -- ``capture``'s plan and order, ``__call__``'s bucket choice, padding, slicing, eager
# fallback and its once-only log -- is ddtree_utils' own, unchanged.
# ------------------------------------------------------------------------------------------


class _FakeGraph:
    def __init__(self, budget, static_inputs, out, log):
        self.budget, self.static_inputs, self.out, self.log = budget, static_inputs, out, log

    def replay(self):
        self.log.append(("replay", self.static_inputs[0].shape[0]))
        # the capture's output buffers, rewritten from the static inputs
        self.out_result = self._du.build_ddtree_tree_from_topk(*self.static_inputs, self.budget,
                                                               out=self.out)


@pytest.fixture
def fake_graphs(du, monkeypatch):
    log = []
    _FakeGraph._du = du

    def fake_capture(self, inputs, device, pool=None):
        log.append(("capture", inputs[0].shape[0]))
        static = tuple(x.detach().clone() for x in inputs)
        out = du.build_ddtree_tree_from_topk(*static, self.budget)
        return _FakeGraph(self.budget, static, out, log), static, out

    monkeypatch.setattr(du.GraphedTreeBuilder, "_capture", fake_capture)
    monkeypatch.setattr(du.GraphedTreeBuilder, "_graphs_usable",
                        lambda self, device: self.enabled and self.failed is None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: 0)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    return log


def test_capture_sizes_plan(du):
    # SGLang's decode graph batch sizes up to the largest decode batch, plus that batch.
    assert du.ddtree_builder_capture_sizes([1, 2, 4, 8, 16, 32], 12) == [1, 2, 4, 8, 12]
    assert du.ddtree_builder_capture_sizes([], 5) == [5]
    assert du.ddtree_builder_capture_sizes([4, 2, 2, 1], 4) == [1, 2, 4]
    with pytest.raises(ValueError):
        du.ddtree_builder_capture_sizes([1, 2], 0)


def test_startup_capture_then_calls_never_capture(du, fake_graphs, caplog):
    builder = du.GraphedTreeBuilder(32, capture_on_call=False)
    assert builder.capture([4, 1, 2], depth=6, topk=4, device="cpu") == [1, 2, 4]
    assert fake_graphs == [("capture", 4), ("capture", 2), ("capture", 1)]  # largest first
    assert builder.captured_batch_sizes == [1, 2, 4] and builder.num_graphs == 3
    del fake_graphs[:]
    with caplog.at_level("WARNING"):
        for i, bs in enumerate([3, 1, 4, 2, 3, 6, 6, 5]):
            x = _inputs(du, bs, 6, 4, 300 + i)
            got = builder(*x)
            assert _same(got, du.build_ddtree_tree_from_topk(*x, 32)), bs
    # 3 -> graph 4 (padded, first 3 rows returned); 6 and 5 -> eager; never a capture.
    assert fake_graphs == [("replay", 4), ("replay", 1), ("replay", 4), ("replay", 2),
                           ("replay", 4)]
    eager_logs = [r for r in caplog.records if "no tree-builder CUDA graph" in r.getMessage()]
    assert len(eager_logs) == 2  # once per uncaptured shape (6 and 5), not per call
    # Another depth / K than captured: eager too, never captured.
    x = _inputs(du, 2, 5, 3, 9)
    assert _same(builder(*x), du.build_ddtree_tree_from_topk(*x, 32))
    assert [e for e in fake_graphs if e[0] == "capture"] == []


def test_builder_without_startup_capture_captures_on_first_call(du, fake_graphs):
    """The detector of the test above works: the default builder (what DDTreeWorkerV2 used
    before issue 9's fix) captures on the first sight of a batch size, i.e. mid-step."""
    builder = du.GraphedTreeBuilder(32)
    x = _inputs(du, 3, 6, 4, 1)
    assert _same(builder(*x), du.build_ddtree_tree_from_topk(*x, 32))
    assert fake_graphs[0] == ("capture", 3)
    frozen = du.GraphedTreeBuilder(32, capture_on_call=False)  # no capture() yet: eager
    assert _same(frozen(*x), du.build_ddtree_tree_from_topk(*x, 32))
    assert fake_graphs == [("capture", 3), ("replay", 3)]


def test_capture_refuses_bad_plans(du, fake_graphs):
    builder = du.GraphedTreeBuilder(8, capture_on_call=False)
    for sizes, depth, k in (([], 4, 2), ([0, 1], 4, 2), ([1], 0, 2), ([1], 4, 0)):
        with pytest.raises(ValueError):
            builder.capture(sizes, depth=depth, topk=k, device="cpu")
    assert fake_graphs == []


def test_capture_is_a_no_op_where_graphs_cannot_run(du):
    builder = du.GraphedTreeBuilder(8, capture_on_call=False)
    assert builder.capture([1, 2], depth=4, topk=2, device="cpu") == []  # real CPU: no graphs
    disabled = du.GraphedTreeBuilder(8, enabled=False)
    assert disabled.capture([1], depth=4, topk=2, device="cuda") == []
    assert builder.num_graphs == 0 and disabled.capture_on_call is False
