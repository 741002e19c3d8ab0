"""A small, slow stand-in for the DDTree core API (docs/contracts.md), for development only.

Used by the offline tests ONLY when the real core (the patch series' ``ddtree_utils.py``) cannot be
imported AND ``DDTREE_OFFLINE_ALLOW_STANDIN=1`` is set. It follows the contract's semantics
(heap builder, node order, acceptance walk) with plain Python loops; it is not shipped anywhere.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import torch


class DDTreeTree(NamedTuple):
    draft_tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    positions: torch.Tensor
    tree_mask: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    node_logprobs: torch.Tensor
    ranks: torch.Tensor


class DDTreeAcceptance(NamedTuple):
    accepted_nodes: torch.Tensor
    accept_length: torch.Tensor
    bonus_tokens: torch.Tensor


def build_ddtree_tree_from_topk(topk_ids, topk_logprobs, root_tokens, start_positions, budget):
    bs, D, K = topk_ids.shape
    dev = topk_ids.device
    total = sum(K ** d for d in range(1, D + 1))
    B = min(int(budget), total)
    N = B + 1
    ids_c = topk_ids.cpu()
    lp_c = topk_logprobs.double().cpu()
    out = {k: [] for k in DDTreeTree._fields}
    for b in range(bs):
        toks, pars, deps, lps, rks = [int(root_tokens[b])], [-1], [0], [0.0], [-1]
        # heap entries: (-score, depth, rank_path, parent_index)
        heap = [(-float(lp_c[b, 0, 0]), 1, (0,), 0)]
        while heap and len(toks) < N:
            negs, d, path, par = heapq.heappop(heap)
            idx = len(toks)
            r = path[-1]
            toks.append(int(ids_c[b, d - 1, r]))
            pars.append(par)
            deps.append(d)
            lps.append(-negs)
            rks.append(r)
            if r + 1 < K:
                s = -negs - float(lp_c[b, d - 1, r]) + float(lp_c[b, d - 1, r + 1])
                heapq.heappush(heap, (-s, d, path[:-1] + (r + 1,), par))
            if d < D:
                s = -negs + float(lp_c[b, d, 0])
                heapq.heappush(heap, (-s, d + 1, path + (0,), idx))
        mask = torch.zeros(N, N, dtype=torch.bool)
        for i in range(N):
            j = i
            while j != -1:
                mask[i, j] = True
                j = pars[j]
        nxt_tok = [-1] * N
        nxt_sib = [-1] * N
        last_child = {}
        for i in range(1, N):
            p = pars[i]
            if nxt_tok[p] == -1:
                nxt_tok[p] = i
            if p in last_child:
                nxt_sib[last_child[p]] = i
            last_child[p] = i
        out["draft_tokens"].append(torch.tensor(toks))
        out["parents"].append(torch.tensor(pars))
        out["depths"].append(torch.tensor(deps))
        out["positions"].append(int(start_positions[b]) + torch.tensor(deps))
        out["tree_mask"].append(mask)
        out["retrive_index"].append(b * N + torch.arange(N))
        out["retrive_next_token"].append(torch.tensor(nxt_tok))
        out["retrive_next_sibling"].append(torch.tensor(nxt_sib))
        out["node_logprobs"].append(torch.tensor(lps, dtype=torch.float32))
        out["ranks"].append(torch.tensor(rks))
    return DDTreeTree(**{k: torch.stack(v).to(dev) for k, v in out.items()})


build_ddtree_tree_heap = build_ddtree_tree_from_topk


def ddtree_accept(tree, target_tokens):
    bs, N = tree.draft_tokens.shape
    D = int(tree.depths.max())
    acc = torch.full((bs, D + 1), -1, dtype=torch.long)
    lens = torch.zeros(bs, dtype=torch.long)
    bonus = torch.zeros(bs, dtype=torch.long)
    dt = tree.draft_tokens.cpu()
    nt = tree.retrive_next_token.cpu()
    ns = tree.retrive_next_sibling.cpu()
    tt = target_tokens.cpu()
    for b in range(bs):
        cur, path = 0, [0]
        while True:
            want = int(tt[b, cur])
            c = int(nt[b, cur])
            while c != -1 and int(dt[b, c]) != want:
                c = int(ns[b, c])
            if c == -1:
                break
            cur = c
            path.append(c)
        acc[b, : len(path)] = torch.tensor(path)
        lens[b] = len(path) - 1
        bonus[b] = int(tt[b, cur])
    dev = target_tokens.device
    return DDTreeAcceptance(acc.to(dev), lens.to(dev), bonus.to(dev))


_M = (1 << 63) - 1


def _mix(x):
    # splitmix64-like finalizer on int64 with wraparound; masks keep shifts logical.
    x = x ^ ((x >> 33) & ((1 << 31) - 1))
    x = x * -49064778989728563  # 0xff51afd7ed558ccd as signed
    x = x ^ ((x >> 33) & ((1 << 31) - 1))
    x = x * -4265267296055464877  # 0xc4ceb9fe1a85ec53 as signed
    x = x ^ ((x >> 33) & ((1 << 31) - 1))
    return x


def positional_gumbel(seeds, positions, vocab):
    dev = positions.device
    s = seeds.to(torch.int64).view(-1, 1, 1)
    p = positions.to(torch.int64).unsqueeze(-1)
    t = torch.arange(vocab, device=dev, dtype=torch.int64).view(1, 1, -1)
    x = _mix(_mix(_mix(s * 1000003 + 12345) + p) + t)
    u = (((x >> 11) & ((1 << 52) - 1)).double() + 0.5) / float(1 << 52)
    return (-torch.log(-torch.log(u))).float()


def sample_target_tokens(logits, temperature, gumbel=None):
    if temperature == 0.0 or gumbel is None and temperature == 0:
        return logits.argmax(-1)
    return (logits.float() / temperature + gumbel).argmax(-1)


def predicted_accept_length(tree):
    return tree.node_logprobs[:, 1:].double().exp().sum(-1).float()
