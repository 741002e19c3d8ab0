"""Drive DDTreeWorkerV2's decode step on the CPU; print one JSON report.

Run in a subprocess with PYTHONPATH = a complete patched sglang tree (SGLang's real
import dependencies; imports sglang once). See test_worker_step.py for what is real and
what is stood in.
"""

from __future__ import annotations

import json
import sys
import types
import zlib

import torch

# ---------------------------------------------------------------- config
VOCAB = 40
BS = 3
BLOCK = 6  # drafter block size b -> tree depth limit 5


def hash_target_logits(ctx: tuple) -> torch.Tensor:
    """The stand-in target model: logits as a deterministic function of the whole
    token context (so a wrong ancestor mask gives a wrong token)."""
    g = torch.Generator().manual_seed(zlib.crc32(repr(ctx).encode()) & 0x7FFFFFFF)
    return torch.randn(VOCAB, generator=g) * 3.0


MODEL = {"target": hash_target_logits, "vocab": VOCAB}


def target_logits(ctx: tuple) -> torch.Tensor:
    return MODEL["target"](tuple(ctx))


def target_greedy(ctx: list, n: int) -> list:
    out, c = [], list(ctx)
    for _ in range(n):
        t = int(torch.argmax(target_logits(tuple(c))))
        out.append(t)
        c.append(t)
    return out


def main() -> None:
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative import ddtree_worker_v2 as W
    from sglang.srt.speculative import eagle_worker_common as EWC
    from sglang.srt.speculative.ddtree_info import DDTreeVerifyInput
    from sglang.srt.speculative.ddtree_auto_budget import DDTreeAutoBudget
    from sglang.srt.speculative.ddtree_metrics import DDTreeDebugMetrics
    from ddtree_offline.heap_oracle import build_ddtree_tree_heap
    from sglang.srt.speculative.ddtree_utils import ddtree_accept
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
    from sglang.srt.speculative.dflash_worker_v2 import _DFlashDraftBlock
    from sglang.srt.speculative.eagle_utils import TreeMaskMode
    from sglang.srt.speculative.draft_worker_common import make_draft_input_v2

    report: dict = {"cases": []}

    # --- stand-ins for device-only pieces -------------------------------------------
    torch.Tensor.record_stream = lambda self, stream: None  # CPU tensors: no streams

    def assign_locs(*, req_pool_indices, req_to_token, start_offset, end_offset,
                    batch_size, draft_token_num, device):
        # The Triton/sgl_kernel gather of req_to_token[row, start:end], in torch.
        cols = start_offset.long()[:, None] + torch.arange(draft_token_num)[None, :]
        return req_to_token[req_pool_indices.long()[:, None], cols].reshape(-1).long()

    W.assign_extend_cache_locs_func = assign_locs
    # The published runtime context (TP world) of a launched server: TP = 1 here.
    import sglang.srt.models.dflash as dflash_model

    dflash_model.get_parallel = W.get_parallel = lambda: types.SimpleNamespace(tp_size=1, tp_rank=0)

    def verify_tree_greedy_port(candidates, retrieve_index, retrieve_next_token,
                                retrieve_next_sibling, target_predict, depth_cols):
        """Line-by-line port of SGLang's verify_tree_greedy_kernel_triton."""
        bs, n = candidates.shape
        predicts = torch.zeros(bs * n, dtype=torch.int32)
        accept_index = torch.full((bs, depth_cols), -1, dtype=torch.int32)
        accept_num = torch.zeros(bs, dtype=torch.int32)
        cand = candidates.reshape(-1)
        ri, nt, ns = (x.reshape(-1) for x in (retrieve_index, retrieve_next_token,
                                               retrieve_next_sibling))
        tp = target_predict.reshape(-1)
        for bx in range(bs):
            last = int(ri[bx * n])
            accept_index[bx, 0] = last
            num, cur = 0, 0
            for _ in range(1, depth_cols):
                cur = int(nt[bx * n + cur])
                target_token = int(tp[last])
                found = False
                while cur != -1:
                    if int(cand[bx * n + cur]) == target_token:
                        predicts[last] = target_token
                        num += 1
                        accept_index[bx, num] = int(ri[bx * n + cur])
                        last = int(ri[bx * n + cur])
                        found = True
                        break
                    cur = int(ns[bx * n + cur])
                if not found:
                    break
            accept_num[bx] = num
            predicts[last] = int(tp[last])
        return predicts, accept_index, accept_num

    state: dict = {}

    def fake_run_eagle_verify(batch, *, target_worker, req_to_token_pool,
                              token_to_kv_pool_allocator, plan_stream, plan_stream_ctx,
                              topk, num_draft_tokens, device, metadata_ready_pre_pad,
                              finalize_tree_path, grammar_barrier=None, **_):
        """Stand-in for run_eagle_verify: the target forward reads the verify input's
        custom mask (FULL_MASK layout) to find each node's context; then the greedy
        walk (ported kernel) and SGLang's own _compact_accept_to_front."""
        vi = batch.spec_info
        assert isinstance(vi, DDTreeVerifyInput)
        n = num_draft_tokens
        bs = len(batch.seq_lens)
        tokens = vi.draft_token.view(bs, n)
        mask = vi.custom_mask
        lens = [int(x) for x in batch.seq_lens]
        logits = torch.empty(bs * n, MODEL["vocab"])
        hidden = torch.empty(bs * n, 4)
        off = 0
        for b in range(bs):
            L = lens[b]
            rows = mask[off: off + n * (L + n)].view(n, L + n)
            off += n * (L + n)
            assert bool(rows[:, :L].all()), "prefix cells must be visible"
            for i in range(n):
                vis = [j for j in range(n) if bool(rows[i, L + j])]
                assert vis[-1] == i and 0 in vis
                # Positions: start + depth, depth = number of visible tree tokens - 1.
                assert int(vi.positions.view(bs, n)[b, i]) == L + len(vis) - 1
                ctx = tuple(state["ctx"][b]) + tuple(int(tokens[b, j]) for j in vis)
                logits[b * n + i] = target_logits(ctx)
                hidden[b * n + i] = torch.tensor([b, i, float(tokens[b, i]), L + len(vis) - 1])
        state["verify_calls"] = state.get("verify_calls", 0) + 1
        target_predict = torch.argmax(logits, -1).view(bs, n)
        predict, accept_index, num_correct = verify_tree_greedy_port(
            tokens, vi.retrieve_index, vi.retrieve_next_token, vi.retrieve_next_sibling,
            target_predict, vi.max_tree_depth)
        accept_lens = num_correct + 1
        accept_tokens = predict[accept_index.clamp(min=0).long()]
        bonus = accept_tokens[torch.arange(bs), (accept_lens - 1).long()]
        state["accept_index"] = accept_index.clone()
        if finalize_tree_path and topk > 1:
            predict = EWC._compact_accept_to_front(predict, accept_index, bs, num_draft_tokens=n)
            hidden = EWC._compact_accept_to_front(hidden, accept_index, bs, num_draft_tokens=n)
        return types.SimpleNamespace(
            logits_output=types.SimpleNamespace(hidden_states=hidden, customized_info=None),
            next_token_ids=predict, accept_lens=accept_lens,
            new_seq_lens=batch.seq_lens + accept_lens,
            next_draft_input=types.SimpleNamespace(bonus_tokens=bonus.to(torch.int32)),
            can_run_cuda_graph=False, routed_experts_output=None,
            indexer_topk_output=None, extra_keep_alive_refs=[],
        )

    EWC.run_eagle_verify = fake_run_eagle_verify

    class LmHead(torch.nn.Module):
        """A dense target lm_head (identity embedding: hidden == logits)."""

        def __init__(self, vocab):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.eye(vocab), requires_grad=False)
            self.org_vocab_size = vocab
            self.quant_method = None

    def make_worker(budget, topk, metrics):
        w = object.__new__(W.DDTreeWorkerV2)
        w.__dict__.update(
            block_size=BLOCK, ddtree_budget=budget, ddtree_topk=topk,
            ddtree_depth=BLOCK - 1, verify_width=budget + 1,
            _ddtree_offsets=torch.arange(budget + 1), device="cpu",
            ddtree_builder=W.GraphedTreeBuilder(budget),  # on the CPU: the eager builder
            ddtree_metrics=(DDTreeDebugMetrics(depth=BLOCK - 1, budget=budget,
                                               log_interval=2) if metrics else None),
            draft_parallel_layout=types.SimpleNamespace(tp_group=None),
            ddtree_auto=(DDTreeAutoBudget(AUTO["budgets"], device="cpu", log_enabled=False)
                         if AUTO.get("on") else None),
            _ddtree_verify_states={},
        )
        req_to_token = (torch.arange(8 * 256, dtype=torch.int32) + 1000).view(8, 256)
        translator = types.SimpleNamespace(
            plan=lambda **kw: types.SimpleNamespace(**kw))
        runner = types.SimpleNamespace(
            req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token),
            token_to_kv_pool_allocator=None,
            attn_backend=types.SimpleNamespace(verify_mask=None, max_context_len=256,
                                               verify_tree_mask_mode=TreeMaskMode.FULL_MASK),
            kv_index_translator=translator,
        )
        w._target_worker = types.SimpleNamespace(model_runner=runner)
        w.model_runner = runner
        w._draft_write_ids = lambda plan: plan.write_virtual  # identity id space
        appended = []
        w._append_target_hidden_to_draft_kv_by_loc = lambda **kw: appended.append(kw)
        mode = GRAPHS.get("mode")
        if mode == "worker":
            # The worker's own builder (never captures on a call) and its start-up capture,
            # for a stand-in plan (the real plan: test_memory_accounting.py).
            # (Without the start-up capture the worker has neither: its builder is the legacy one.)
            make = getattr(w, "_make_tree_builder", None)
            w.ddtree_builder = make() if make else W.GraphedTreeBuilder(budget)
            w.ddtree_builder_capture_plan = lambda: [1, 2, 4]
            GRAPHS["phase"] = "startup"
            startup = getattr(w, "capture_ddtree_builder_graphs", None)
            GRAPHS["captured"] = startup() if startup else None
            GRAPHS["phase"] = "forward"
        elif mode == "draft-graph":
            # The head folded into the draft block's graph (patch ddtree-worker): the worker registers
            # it as a capture tail hook of the draft runner right before the draft graphs are
            # captured; here the stand-in "capture" calls the hooks once per captured size
            # (largest first), and drafter_block's stand-in "replay" below re-runs them.
            lm = LmHead(MODEL["vocab"])
            runner.model = types.SimpleNamespace(lm_head=lm)
            w.draft_model_runner = types.SimpleNamespace(capture_tail_hooks=[])
            decode = types.SimpleNamespace(bs=list(DRAFT_GRAPH_BS))
            W.get_exec = lambda: types.SimpleNamespace(
                graph=types.SimpleNamespace(cuda_graph_config=types.SimpleNamespace(decode=decode)))
            GRAPHS["phase"] = "startup"
            GRAPHS["sampler"] = w._maybe_build_draft_sampler()
            GRAPHS["lm_head"] = lm
            GRAPHS["worker"] = w
            for g in sorted(DRAFT_GRAPH_BS, reverse=True):
                replay_draft_hooks(w, torch.zeros(g * BLOCK, MODEL["vocab"]),
                                   torch.zeros(g, BLOCK, dtype=torch.long), torch.ones(g, dtype=torch.long))
            GRAPHS["phase"] = "forward"
        elif mode == "legacy":
            # What DDTreeWorkerV2 built before issue 9's fix: capture on first sight.
            w.ddtree_builder = W.GraphedTreeBuilder(budget)
            GRAPHS["phase"] = "forward"
        return w, appended

    def drafter_block(batch, draft_input, rng):
        """Stand-in drafter forward: hidden states (= logits through the identity
        lm_head) favouring the target's greedy continuation, sometimes at rank 2-3."""
        bs = len(batch.seq_lens)
        hidden = torch.randn(bs, BLOCK, MODEL["vocab"], generator=rng)
        for b in range(bs):
            ctx = list(state["ctx"][b]) + [int(draft_input.bonus_tokens[b])]
            if MODEL.get("drafters"):
                # The offline engine's SyntheticDrafter: full-vocab log-probs [D, V]
                # (through the identity lm_head, hidden == logits).
                hidden[b, 1:] = MODEL["drafters"][b].propose(ctx, BLOCK - 1, 0.0, 0).float()
                continue
            cont = target_greedy(ctx, BLOCK - 1)
            for d in range(1, BLOCK):
                hidden[b, d, cont[d - 1]] += float([4.0, 1.5, 0.8][int(torch.randint(3, (1,), generator=rng))])
        prefix = batch.seq_lens.clone()
        block_ids = torch.full((bs, BLOCK), MODEL["vocab"] - 1, dtype=torch.long)
        block_ids[:, 0] = draft_input.bonus_tokens
        state["draft_hidden"] = hidden
        flat = hidden.reshape(bs * BLOCK, MODEL["vocab"])
        graphed = GRAPHS.get("mode") == "draft-graph"
        if graphed:
            # Stand-in replay of the draft graph of the smallest captured size >= bs: the
            # runner's static inputs hold the batch's rows, then garbage padding rows
            # (SGLang pads seq_lens with its fill value); the hooks run over all of them.
            g = min(x for x in DRAFT_GRAPH_BS if x >= bs)
            pad = g - bs
            replay_draft_hooks(
                w_of_step(),
                torch.cat([flat, torch.randn(pad * BLOCK, MODEL["vocab"], generator=rng) * 9]),
                torch.cat([block_ids, torch.randint(0, MODEL["vocab"], (pad, BLOCK), generator=rng)]),
                torch.cat([prefix, torch.ones(pad, dtype=prefix.dtype)]))
            flat = None  # a graphed step must take the tree from the replay, not recompute it
        return _DFlashDraftBlock(
            embed_module=None, lm_head=GRAPHS.get("lm_head") or LmHead(MODEL["vocab"]), block_size=BLOCK,
            block_ids=block_ids,
            prefix_lens=prefix, positions=(prefix[:, None] + torch.arange(BLOCK)).reshape(-1),
            positions_2d=prefix[:, None] + torch.arange(BLOCK),
            verify_out_cache_loc=None, verify_out_cache_loc_2d=None, kv_loc_plan=None,
            draft_out=types.SimpleNamespace(can_run_graph=graphed, logits_output=types.SimpleNamespace(
                hidden_states=flat)),
        )

    def replay_draft_hooks(w, hidden, block_ids, seq_lens):
        g = int(block_ids.shape[0])
        GRAPHS.setdefault("draft_events", []).append((GRAPHS.get("phase"), g))
        fb = types.SimpleNamespace(input_ids=block_ids.reshape(-1), seq_lens=seq_lens)
        for hook in w.draft_model_runner.capture_tail_hooks:
            hook(None, types.SimpleNamespace(hidden_states=hidden), fb, g * BLOCK)

    def w_of_step():
        return state["worker"]

    class Mode:
        def is_extend(self): return False
        def is_idle(self): return False

    def run_case(budget, topk, metrics, prompts, steps):
        rng = torch.Generator().manual_seed(1234 + budget)
        w, appended = make_worker(budget, topk, metrics)
        state["worker"] = w
        w._run_draft_block = lambda batch, di, rng=rng: drafter_block(batch, di, rng)
        # After "prefill": the committed context is the prompt, the first bonus is the
        # target's greedy token after it.
        state["ctx"] = [list(p) for p in prompts]
        bonus = torch.tensor([target_greedy(p, 1)[0] for p in prompts])
        seq_lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
        generated = [[int(bonus[b])] for b in range(BS)]
        case = {"budget": budget, "topk": topk, "steps": 0, "mismatch": [], "taus": []}
        for step in range(steps):
            batch = types.SimpleNamespace(
                forward_mode=Mode(), is_extend_in_batch=False,
                spec_info=make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=seq_lens),
                seq_lens=seq_lens.clone(), seq_lens_cpu=seq_lens.clone(),
                seq_lens_sum=int(seq_lens.sum()),
                req_pool_indices=torch.arange(BS, dtype=torch.int64) + 2,
                reqs=[None] * BS,
                # ScheduleBatch.sampling_info: all-greedy (what auto's chain check reads).
                sampling_info=types.SimpleNamespace(is_all_greedy=True),
            )
            assert isinstance(batch.spec_info, DFlashDraftInputV2)
            res = w.forward_batch_generation(batch)
            assert isinstance(res, GenerationBatchResult)
            # The width the worker verified: the budget, or the one its auto controller picked.
            step_budget = res.speculative_num_draft_tokens - 1
            n = step_budget + 1
            case.setdefault("budgets_run", []).append(step_budget)
            acc = res.accept_lens.long()
            out = res.next_token_ids.view(BS, n)
            vi = batch.spec_info
            # Reference walk: the heap-oracle tree from the same per-depth top-K,
            # target tokens from explicit root-to-node paths, ddtree_accept.
            hid = state["draft_hidden"][:, 1:, :]
            lp = torch.log_softmax(hid.float(), -1)
            v, i = torch.sort(lp, dim=-1, descending=True, stable=True)
            tree = build_ddtree_tree_heap(i[..., :topk], v[..., :topk], bonus, seq_lens, step_budget)
            tt = torch.empty(BS, n, dtype=torch.long)
            for b in range(BS):
                for node in range(n):
                    path, x = [], node
                    while x != -1:
                        path.append(int(tree.draft_tokens[b, x]))
                        x = int(tree.parents[b, x])
                    ctx = tuple(state["ctx"][b]) + tuple(reversed(path))
                    tt[b, node] = int(torch.argmax(target_logits(ctx)))
            ref = ddtree_accept(tree, tt)
            worker_tree_tokens = vi.draft_token.view(BS, n)
            case["same_tree"] = bool(torch.equal(worker_tree_tokens, tree.draft_tokens))
            kv = appended[-1]
            for b in range(BS):
                a = int(acc[b])
                emitted = [int(t) for t in out[b, :a]]
                ctx = state["ctx"][b] + [int(bonus[b])]
                greedy = target_greedy(ctx, a)
                path = [int(x) for x in ref.accepted_nodes[b] if int(x) >= 0]
                ref_tokens = [int(tree.draft_tokens[b, x]) for x in path[1:]] + [int(ref.bonus_tokens[b])]
                if emitted != greedy or emitted != ref_tokens or a != int(ref.accept_length[b]) + 1:
                    case["mismatch"].append({"step": step, "b": b, "emitted": emitted,
                                             "greedy": greedy, "ref": ref_tokens})
                # Draft-KV append: compacted hidden rows = the accepted nodes, in order,
                # at positions prefix + 0.. ; committed prefix length = tau.
                # Only the first w = min(b, B + 1) rows of each request reach the
                # projection (at most b are committed), never all B + 1.
                width = min(BLOCK, n)
                case["kv_rows_projected"] = int(kv["target_hidden"].shape[0])
                case["kv_rows_expected"] = BS * width
                rows = kv["target_hidden"].view(BS, -1, 4)[b, :a]
                if [int(r[1]) for r in rows] != path or int(kv["commit_lens"][b]) != a:
                    case["mismatch"].append({"step": step, "b": b, "kv_rows": [int(r[1]) for r in rows], "path": path})
                if [int(p) for p in kv["positions"].view(BS, -1)[b, :a]] != list(range(int(seq_lens[b]), int(seq_lens[b]) + a)):
                    case["mismatch"].append({"step": step, "b": b, "kv_positions": True})
                locs = kv["cache_loc_2d"]
                want = [1000 + 256 * (b + 2) + int(seq_lens[b]) + j for j in range(a)]
                if tuple(locs.shape)[0] != BS or [int(x) for x in locs[b, :a]] != want:
                    case["mismatch"].append({"step": step, "b": b, "kv_locs": [int(x) for x in locs[b, :a]], "want": want})
                state["ctx"][b] = ctx + emitted[:-1]
                generated[b] += emitted
                case["taus"].append(a)
            bonus = res.next_draft_input.bonus_tokens.clone()
            seq_lens = res.new_seq_lens.clone()
            case["steps"] += 1
            if AUTO.get("on"):
                AUTO.setdefault("seen", []).append((res.logits_output.customized_info or {}).get("ddtree_budget"))
            if metrics:
                case["customized_info_keys"] = sorted((res.logits_output.customized_info or {}).keys())
                case["metrics_summary"] = w.ddtree_metrics.summary()
        # End-to-end: everything generated equals target-only greedy decoding.
        case["lossless"] = all(
            generated[b] == target_greedy(prompts[b], len(generated[b])) for b in range(BS))
        case["generated"] = generated
        return case

    for budget, topk, metrics in ((12, 3, True), (8, 2, False), (20, 4, False), (5, 1, False)):
        prompts = [[(7 * b + k) % VOCAB for k in range(3 + b)] for b in range(BS)]
        report["cases"].append(run_case(budget, topk, metrics, prompts, 6))

    # --speculative-ddtree-budget auto (patch ddtree-worker): the worker's tree is the largest budget's;
    # each step verifies the subtree of the budget DDTreeAutoBudget picks (eagerly here).
    AUTO.update(on=True, budgets=[5, 11, 23])
    prompts = [[(7 * b + k) % VOCAB for k in range(3 + b)] for b in range(BS)]
    auto_case = run_case(23, 4, True, prompts, 8)
    auto_case["customized_budgets"] = AUTO.get("seen")
    report["auto"] = auto_case
    AUTO.clear()

    report["graphed"] = run_graphed(run_case)

    # Against the offline reference engine (tools/ddtree_offline): its tiny HF target and
    # SyntheticDrafter, batch 1 per prompt there, one batch of 3 in the worker here.
    report["offline"] = run_offline(run_case)
    report["verify_calls"] = state.get("verify_calls", 0)
    print("REPORT " + json.dumps(report))


GRAPHS: dict = {}
AUTO: dict = {}  # the auto-budget case: {"on": True, "budgets": [...]}
DRAFT_GRAPH_BS = (1, 2, 4)  # the stand-in draft graphs' batch sizes: a batch of 3 pads into 4


def run_graphed(run_case) -> dict:
    """The decode step with the tree builder's CUDA graphs. STAND-IN (no CUDA here): graphs are
    usable for CPU tensors, ``_capture`` records (phase, batch size) and returns a graph whose
    ``replay()`` re-runs the eager builder from the captured static inputs into the captured
    output buffers, and ``capture``'s torch.cuda calls (synchronize, memory_reserved,
    graph_pool_handle) are no-ops. The worker step and the builder's bucket / padding / eager
    logic are the shipped code."""
    from sglang.srt.speculative import ddtree_utils as du

    events: list = []

    class FakeGraph:
        def __init__(self, budget, static, out):
            self.budget, self.static, self.out = budget, static, out

        def replay(self):
            events.append((GRAPHS.get("phase"), "replay", int(self.static[0].shape[0])))
            du.build_ddtree_tree_from_topk(*self.static, self.budget, out=self.out)

    def fake_capture(self, inputs, device, pool=None):
        events.append((GRAPHS.get("phase"), "capture", int(inputs[0].shape[0])))
        static = tuple(x.detach().clone() for x in inputs)
        out = du.build_ddtree_tree_from_topk(*static, self.budget)
        return FakeGraph(self.budget, static, out), static, out

    du.GraphedTreeBuilder._capture = fake_capture
    du.GraphedTreeBuilder._graphs_usable = lambda self, device: self.enabled and self.failed is None
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.memory_reserved = lambda *a, **k: 0
    torch.cuda.graph_pool_handle = lambda: None
    out = {}
    for mode in ("worker", "legacy", "draft-graph"):
        GRAPHS.clear()
        GRAPHS["mode"] = mode
        del events[:]
        prompts = [[(7 * b + k) % VOCAB for k in range(3 + b)] for b in range(BS)]
        case = run_case(12, 3, False, prompts, 6)
        out[mode] = {"events": list(events), "captured": GRAPHS.get("captured"),
                     "mismatch": case["mismatch"], "lossless": case["lossless"],
                     "same_tree": case["same_tree"], "draft_events": GRAPHS.get("draft_events"),
                     "sampler": repr(GRAPHS.get("sampler")),
                     "builder_graphs_at_startup": (
                         GRAPHS["worker"].capture_ddtree_builder_graphs() if mode == "draft-graph" else None)}
    GRAPHS.clear()
    return out


def run_offline(run_case) -> list:
    import os

    from sglang.srt.speculative import ddtree_utils as shipped

    os.environ["DDTREE_UTILS_PATH"] = shipped.__file__  # the engine loads the same core file
    from ddtree_offline.engine import OfflineEngine, generated_tokens
    from ddtree_offline.models import SyntheticDrafter, tiny_target

    vocab = 64
    target = tiny_target(seed=0, vocab=vocab, hidden=32, layers=2, heads=2, kv_heads=1,
                         intermediate=64)
    target.eval()

    @torch.no_grad()
    def hf_target(ctx: tuple) -> torch.Tensor:
        return target(input_ids=torch.tensor([list(ctx)])).logits[0, -1].float()

    prompts = [[(5 * b + 3 * k + 1) % vocab for k in range(4 + 2 * b)] for b in range(BS)]
    out = []
    for budget, topk in ((12, 4), (6, 2)):
        records = []
        for p in prompts:
            eng = OfflineEngine(target, SyntheticDrafter(target, quality=0.7, k=topk, seed=0),
                                block_size=BLOCK, device="cpu")
            rec = eng.generate(p, method="ddtree", budget=budget, topk_cap=topk,
                               max_new_tokens=64, temperature=0.0)
            records.append({"acc": list(rec["acceptance_lengths"]),
                            "gen": [int(t) for t in generated_tokens(rec)]})
        MODEL.update(target=hf_target, vocab=vocab,
                     drafters=[SyntheticDrafter(target, quality=0.7, k=topk, seed=0)
                               for _ in range(BS)])
        case = run_case(budget, topk, False, prompts, 5)
        MODEL.update(target=hash_target_logits, vocab=VOCAB, drafters=None)
        taus = [case["taus"][s * BS:(s + 1) * BS] for s in range(5)]
        mine = [[taus[s][b] for s in range(5)] for b in range(BS)]
        n_gen = [len(g) for g in case["generated"]]
        out.append({
            "budget": budget, "topk": topk, "mismatch": case["mismatch"],
            "worker_taus": mine, "offline_taus": [r["acc"][:5] for r in records],
            "same_taus": all(mine[b] == records[b]["acc"][:5] for b in range(BS)),
            "same_tokens": all(case["generated"][b] == records[b]["gen"][: n_gen[b]]
                               for b in range(BS)),
        })
    return out


if __name__ == "__main__":
    main()
    sys.exit(0)
