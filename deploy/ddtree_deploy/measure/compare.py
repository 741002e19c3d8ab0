"""Compare a run against a baseline: are the outputs the same, and how do tau and TPOT compare?

For every (dataset, method) group of the RUN, the reference group in the BASELINE is the same
method if the baseline has it (e.g. ``ddtree_tb256`` vs ``ddtree_tb256``), else the baseline's
``baseline`` (target-only decoding), or always the method named by ``against``: at temperature
0 DDTree is lossless, so every method's output must equal target-only decoding token for token.

Per group: exact-match rate of output ids over the prompts both sides have, the first
divergence position of each diverged prompt (with the surrounding tokens, decoded when a local
tokenizer is given), tau (mean over prompts of the per-prompt mean acceptance length, bonus token
included, as the reference ``benchmark.py`` prints it) for both sides and their acceptance-length
histograms (with the total-variation distance between them), and the TPOT ratio
``mean run TPOT / mean reference TPOT``.

Thresholds (:class:`Thresholds`) turn the report into a verdict; a failed verdict is raised as
:class:`~ddtree_deploy.errors.CompareFailedError` (exit code 11) by :func:`check`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ddtree_deploy.errors import CompareFailedError, UsageError
from ddtree_deploy.measure.records import METHOD_BASELINE, RunRecord, dataset_key, iter_groups

if TYPE_CHECKING:
    from rich.console import Console

CONTEXT_TOKENS = 8


# --- metrics (pure functions; unit-tested with hypothesis) ------------------------------------


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ, ``None`` if they are equal.

    If one is a strict prefix of the other, the divergence is at the shorter length.
    """
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    if len(a) != len(b):
        return n
    return None


def match_status(run: Sequence[int], ref: Sequence[int]) -> tuple[str, int | None]:
    """``("match", None)``, ``("prefix", pos)`` (one is a strict prefix of the other: usually a
    different ``max_new_tokens``), or ``("diverged", pos)``."""
    pos = first_divergence(run, ref)
    if pos is None:
        return "match", None
    if pos == min(len(run), len(ref)):
        return "prefix", pos
    return "diverged", pos


def mean(xs: Sequence[float]) -> float | None:
    xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return sum(xs) / len(xs) if xs else None


def tau_histogram(records: Sequence[RunRecord]) -> dict[int, int] | None:
    """Pooled histogram {acceptance length: rounds} over all rounds of all records.

    Uses ``acceptance_lengths`` when present, else SGLang's ``spec_correct_drafts_histogram``
    (index = accepted draft tokens, so tau = index + 1). ``None`` if no record has either.
    """
    hist: Counter[int] = Counter()
    seen = False
    for r in records:
        if r.acceptance_lengths:
            hist.update(int(a) for a in r.acceptance_lengths)
            seen = True
            continue
        h = (r.meta_info or {}).get("spec_correct_drafts_histogram")
        if isinstance(h, list) and h:
            for i, c in enumerate(h):
                if c:
                    hist[i + 1] += int(c)
            seen = True
    return dict(sorted(hist.items())) if seen else None


def histogram_tv(a: dict[int, int] | None, b: dict[int, int] | None) -> float | None:
    """Total-variation distance between two count histograms (0 = same shape, 1 = disjoint)."""
    if not a or not b:
        return None
    na, nb = sum(a.values()), sum(b.values())
    if na == 0 or nb == 0:
        return None
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0) / na - b.get(k, 0) / nb) for k in keys)


def group_tau(records: Sequence[RunRecord]) -> float | None:
    return mean([r.tau for r in records if r.tau is not None])


def group_tpot(records: Sequence[RunRecord]) -> float | None:
    return mean([r.time_per_output_token for r in records if r.time_per_output_token])


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# --- the report -------------------------------------------------------------------------------


@dataclass
class Thresholds:
    min_exact_match: float | None = 1.0
    max_tpot_ratio: float | None = None
    min_tau_ratio: float | None = None
    prefix_ok: bool = False
    # Count a divergence as the two targets' (status "target") when, on both sides, the method's output
    # equals that side's own target-only (``baseline``) output for the prompt; the baseline group's own
    # divergences are then the targets' by definition. For comparing implementations whose targets round
    # differently (a GPU engine against a CPU or bf16 reference).
    allow_target_divergence: bool = False


def _context(ids: Sequence[int], pos: int, n: int = CONTEXT_TOKENS) -> dict[str, Any]:
    lo = max(0, pos - n)
    return {
        "start": lo,
        "before": list(ids[lo:pos]),
        "at": ids[pos] if pos < len(ids) else None,
        "after": list(ids[pos + 1 : pos + 1 + n]),
    }


def compare_records(
    baseline: Sequence[RunRecord],
    run: Sequence[RunRecord],
    *,
    decode: Callable[[list[int]], str] | None = None,
    thresholds: Thresholds | None = None,
    max_divergences: int = 20,
    against: str | None = None,
) -> dict[str, Any]:
    """Build the comparison report (a JSON-able dict); ``report["ok"]`` is the verdict.

    ``against``: compare every run group with this baseline method (e.g. ``"baseline"``: each
    method vs target-only decoding, which also works with BASELINE = RUN, one file holding a
    whole sweep) instead of the same method."""
    th = thresholds or Thresholds()
    base_groups: dict[tuple[str, str], dict[int, RunRecord]] = {}
    for (ds, method), recs in iter_groups(baseline):
        base_groups[(dataset_key(ds), method)] = recs
    run_baselines = {dataset_key(ds): recs for (ds, method), recs in iter_groups(run) if method == METHOD_BASELINE}
    groups_out: list[dict[str, Any]] = []
    failures: list[str] = []
    unmatched: list[str] = []
    for (ds, method), run_recs in sorted(iter_groups(run), key=lambda kv: (kv[0][0], _method_order(kv[0][1]))):
        k = dataset_key(ds)
        ref_method = against or (method if (k, method) in base_groups else METHOD_BASELINE)
        ref_recs = base_groups.get((k, ref_method))
        if ref_recs is None:
            unmatched.append(f"{ds}/{method}")
            continue
        common = sorted(set(run_recs) & set(ref_recs))
        statuses: Counter[str] = Counter()
        divergences: list[dict[str, Any]] = []
        own_run_base = run_baselines.get(k, {})
        own_ref_base = base_groups.get((k, METHOD_BASELINE), {})
        for pi in common:
            rr, br = run_recs[pi], ref_recs[pi]
            status, pos = match_status(rr.output_ids, br.output_ids)
            if (
                status != "match"
                and th.allow_target_divergence
                and against is None
                and (
                    method == ref_method == METHOD_BASELINE
                    or (
                        pi in own_run_base
                        and pi in own_ref_base
                        and list(rr.output_ids) == list(own_run_base[pi].output_ids)
                        and list(br.output_ids) == list(own_ref_base[pi].output_ids)
                    )
                )
            ):
                status = "target"
            statuses[status] += 1
            if pos is not None and len(divergences) < max_divergences:  # pos is None only for "match"
                d: dict[str, Any] = {
                    "prompt_index": pi,
                    "status": status,
                    "position": pos,
                    "run_len": len(rr.output_ids),
                    "ref_len": len(br.output_ids),
                    "run": _context(rr.output_ids, pos),
                    "ref": _context(br.output_ids, pos),
                }
                if decode is not None:
                    lo = max(0, pos - CONTEXT_TOKENS)
                    d["decoded"] = {
                        "common_prefix": decode(list(br.output_ids[lo:pos])),
                        "run_next": decode(list(rr.output_ids[pos : pos + CONTEXT_TOKENS])),
                        "ref_next": decode(list(br.output_ids[pos : pos + CONTEXT_TOKENS])),
                    }
                divergences.append(d)
        n = len(common)
        matched = (
            statuses["match"]
            + (statuses["prefix"] if th.prefix_ok else 0)
            + (statuses["target"] if th.allow_target_divergence else 0)
        )
        em = matched / n if n else None
        run_list = [run_recs[i] for i in sorted(run_recs)]
        ref_list = [ref_recs[i] for i in sorted(ref_recs)]
        run_common = [run_recs[i] for i in common]
        ref_common = [ref_recs[i] for i in common]
        tau_run, tau_ref = group_tau(run_common), group_tau(ref_common)
        hist_run, hist_ref = tau_histogram(run_common), tau_histogram(ref_common)
        tpot_run, tpot_ref = group_tpot(run_common), group_tpot(ref_common)
        tau_ratio, tpot_ratio = ratio(tau_run, tau_ref), ratio(tpot_run, tpot_ref)
        group_failures: list[str] = []
        g: dict[str, Any] = {
            "dataset": ds,
            "method": method,
            "ref_method": ref_method,
            "n_run": len(run_list),
            "n_ref": len(ref_list),
            "n_common": n,
            "missing_in_run": sorted(set(ref_recs) - set(run_recs))[:50],
            "missing_in_ref": sorted(set(run_recs) - set(ref_recs))[:50],
            "exact_match": statuses["match"],
            "prefix_match": statuses["prefix"],
            "diverged": statuses["diverged"],
            "target_divergence": statuses["target"],
            "exact_match_rate": em,
            "first_divergence_min": min((d["position"] for d in divergences), default=None),
            "divergences": divergences,
            "tau_run": tau_run,
            "tau_ref": tau_ref,
            "tau_ratio": tau_ratio,
            "tau_hist_run": {str(k2): v for k2, v in (hist_run or {}).items()} or None,
            "tau_hist_ref": {str(k2): v for k2, v in (hist_ref or {}).items()} or None,
            "tau_hist_tv": histogram_tv(hist_run, hist_ref),
            "tpot_run_s": tpot_run,
            "tpot_ref_s": tpot_ref,
            "tpot_ratio": tpot_ratio,
            "failures": group_failures,
        }
        name = f"{ds}/{method} (vs {ref_method})"
        if n == 0:
            group_failures.append("no prompt index in common with the baseline")
        if th.min_exact_match is not None and em is not None and em < th.min_exact_match:
            first = divergences[0] if divergences else None
            where = f"; first: prompt {first['prompt_index']} at token {first['position']}" if first else ""
            group_failures.append(f"exact match {em:.3f} < {th.min_exact_match}{where}")
        if th.max_tpot_ratio is not None and tpot_ratio is not None and tpot_ratio > th.max_tpot_ratio:
            group_failures.append(f"TPOT ratio {tpot_ratio:.3f} > {th.max_tpot_ratio}")
        if th.min_tau_ratio is not None and tau_ratio is not None and tau_ratio < th.min_tau_ratio:
            group_failures.append(f"tau ratio {tau_ratio:.3f} < {th.min_tau_ratio}")
        failures.extend(f"{name}: {f}" for f in group_failures)
        groups_out.append(g)
    if not groups_out:
        failures.append("no (dataset, method) of the run has a counterpart in the baseline")
    return {
        "ok": not failures,
        "against": against,
        "thresholds": {
            "min_exact_match": th.min_exact_match,
            "max_tpot_ratio": th.max_tpot_ratio,
            "min_tau_ratio": th.min_tau_ratio,
            "prefix_ok": th.prefix_ok,
            "allow_target_divergence": th.allow_target_divergence,
        },
        "groups": groups_out,
        "unmatched": unmatched,
        "failures": failures,
    }


def _method_order(method: str) -> tuple[int, int, str]:
    from ddtree_deploy.measure.records import method_budget

    if method == "baseline":
        return (0, 0, method)
    if method == "dflash":
        return (1, 0, method)
    b = method_budget(method)
    return (2, b if b is not None else 1 << 30, method)


def check(report: dict[str, Any]) -> None:
    """Raise :class:`CompareFailedError` (exit 11) if the report failed its thresholds."""
    if report["ok"]:
        return
    lines = report["failures"]
    msg = "comparison failed:\n  " + "\n  ".join(lines[:20])
    if len(lines) > 20:
        msg += f"\n  ... and {len(lines) - 20} more"
    raise CompareFailedError(msg, details={"report": report})


# --- tokenizer (local files only) -------------------------------------------------------------


def local_decoder(path: str) -> Callable[[list[int]], str]:
    """A ``decode(ids) -> str`` from a tokenizer on local disk. Never touches the network."""
    import os
    from pathlib import Path

    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"--tokenizer {path}: no such local file or directory (only local tokenizers are used)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:
        raise UsageError(f"--tokenizer {path}: cannot load a tokenizer from it: {exc}") from None

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=False))

    return decode


# --- rendering --------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(report: dict[str, Any], console: Console) -> None:
    """The human view (rich, on the given console: stderr in the CLI)."""
    from rich.table import Table

    console = wide(console)
    t = Table(title="compare: run vs baseline", show_lines=False)
    for col in (
        "dataset",
        "method",
        "vs",
        "n",
        "exact",
        "prefix",
        "diverged",
        "target",
        "match rate",
        "1st div",
        "tau run",
        "tau ref",
        "hist TV",
        "TPOT ratio",
        "verdict",
    ):
        t.add_column(col, justify="right" if col not in ("dataset", "method", "vs", "verdict") else "left")
    for g in report["groups"]:
        verdict = "[green]ok[/]" if not g["failures"] else "[red]FAIL[/]"
        t.add_row(
            g["dataset"],
            g["method"],
            g["ref_method"],
            str(g["n_common"]),
            str(g["exact_match"]),
            str(g["prefix_match"]),
            str(g["diverged"]),
            str(g.get("target_divergence", 0)),
            _f(g["exact_match_rate"]),
            "-" if g["first_divergence_min"] is None else str(g["first_divergence_min"]),
            _f(g["tau_run"], "{:.2f}"),
            _f(g["tau_ref"], "{:.2f}"),
            _f(g["tau_hist_tv"]),
            _f(g["tpot_ratio"]),
            verdict,
        )
    console.print(t)
    for g in report["groups"]:
        for d in g["divergences"][:5]:
            console.print(
                f"[yellow]{g['dataset']}/{g['method']}[/] prompt {d['prompt_index']}: {d['status']} at token {d['position']} "
                f"(run len {d['run_len']}, ref len {d['ref_len']})",
                markup=True,
                highlight=False,
            )
            console.print(f"    ref: ...{d['ref']['before']} [{d['ref']['at']}] {d['ref']['after']}...", markup=False)
            console.print(f"    run: ...{d['run']['before']} [{d['run']['at']}] {d['run']['after']}...", markup=False)
            if "decoded" in d:
                dec = d["decoded"]
                console.print(
                    f"    text: {dec['common_prefix']!r} | ref {dec['ref_next']!r} | run {dec['run_next']!r}", markup=False
                )
    if report["unmatched"]:
        console.print("no baseline for: " + ", ".join(report["unmatched"]), markup=False)
    if report["ok"]:
        console.print("[bold green]compare: ok[/]")


def wide(console: Console, width: int = 160) -> Console:
    """The console itself on a terminal; off a terminal (pipes, CI logs) one ``width`` columns
    wide on the same file, so tables are not squeezed into 80 columns."""
    if console.is_terminal:
        return console
    from rich.console import Console

    return Console(file=console.file, width=width, highlight=False, no_color=console.no_color)
