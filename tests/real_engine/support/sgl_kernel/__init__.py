"""Test-only CPU shim for ``sgl_kernel`` (no CPU build of it is published).

Used ONLY by tests/real_engine, on PYTHONPATH of the engine's processes. With
``SGLANG_USE_CPU_ENGINE=1`` SGLang 0.5.23 imports ``*_cpu`` ops from ``sgl_kernel`` at module
load (pinned wheel: ``kernels/ops/kvcache/cache_move.py:10``, ``srt/mem_cache/allocation.py:46``,
``kernels/ops/speculative/cache_locs.py:28``, ``kernels/ops/speculative/eagle.py:10``,
``kernels/ops/speculative/spec_tree.py:40-43``). Every name imports; only the ops below are
implemented, each following the Triton kernel SGLang uses at the same call site off-CPU (same
arguments, same flat pointer arithmetic, so a write past a row lands where the GPU kernel's would);
calling ANY other name raises ``NotImplementedError`` naming it. These are bookkeeping copies
(KV slots, cache locations, token ids): no attention, sampling or model math lives here, so they do
not change the code under test (scheduler, model runner, attention backend, workers, verify).
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+ddtree-tests-cpu-shim"


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """``cache_move.py`` ``copy_all_layer_kv_cache_tiled``: for every layer buffer (raw base
    pointer + row stride in bytes) copy rows src_loc -> tgt_loc (all loads before the stores)."""
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    rows = int(max(int(tgt.max()), int(src.max()))) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * int(stride))).from_address(int(ptr))
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, int(stride))
        buf[tgt] = buf[src].clone()


def _spans(start_offset, end_offset):
    out = 0
    for s, e in zip(start_offset.tolist(), end_offset.tolist()):
        yield int(s), int(e), out
        out += max(int(e) - int(s), 0)


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """``allocation.py`` ``assign_req_to_token_pool``: row[start:end] = the request's slice of
    out_cache_loc, addressed as ``req_to_token + row * pool_len + offset`` (flat, like the kernel)."""
    flat = req_to_token.view(-1)
    for row, (s, e, o) in zip(req_pool_indices.tolist(), _spans(start_offset, end_offset)):
        if e > s:
            base = int(row) * int(pool_len)
            flat[base + s: base + e] = out_cache_loc[o: o + e - s].to(flat.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """``cache_locs.py`` ``assign_extend_cache_locs``: the reverse gather, out = row[start:end]."""
    flat = req_to_token.reshape(-1)
    for row, (s, e, o) in zip(req_pool_indices.tolist(), _spans(start_offset, end_offset)):
        if e > s:
            base = int(row) * int(pool_len)
            out_cache_loc[o: o + e - s] = flat[base + s: base + e].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """``eagle.py`` ``fill_bonus_tokens``: bonus[i] = accept_tokens[stride * i + len[i] - 1]."""
    bs = accept_lens.numel()
    idx = torch.arange(bs, dtype=torch.int64) * int(accept_stride) + accept_lens.to(torch.int64) - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """``eagle.py`` ``fill_accept_out_cache_loc``: pack out_cache_loc[accept_index[j]] for the
    accept_index entries != -1, in order."""
    flat = accept_index.reshape(-1).to(torch.int64)
    keep = flat[flat != -1]
    accept_out_cache_loc[: keep.numel()] = out_cache_loc[keep].to(accept_out_cache_loc.dtype)


def verify_tree_greedy_cpu(*, predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict):
    """``spec_tree.py`` ``verify_tree_greedy_func``: run SGLang's own Triton greedy tree verify
    (``verify_tree_greedy_triton``, its XPU path) under the Triton interpreter."""
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    verify_tree_greedy_triton(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
        candidates=candidates, retrieve_index=retrive_index,
        retrieve_next_token=retrive_next_token, retrieve_next_sibling=retrive_next_sibling,
        target_predict=target_predict,
    )


_IMPLEMENTED = {
    "copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu", "assign_extend_cache_locs_cpu",
    "fill_bonus_tokens_cpu", "fill_accept_out_cache_loc_cpu", "verify_tree_greedy_cpu",
}


class _Missing:
    """Importable placeholder; raises naming itself when used."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *a, **k):
        raise NotImplementedError(
            f"sgl_kernel.{self._name} is not implemented by the test-only CPU shim "
            "(tests/real_engine/support/sgl_kernel); the engine called an op the suite "
            "does not know: implement it following SGLang's Triton kernel at that call site")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __repr__(self):
        return f"<sgl_kernel shim placeholder {self._name}>"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)
