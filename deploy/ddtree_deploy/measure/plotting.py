"""The budget-sweep plot: tau and output tokens/s vs tree budget, one line per dataset.

Autoregressive (``baseline``) and linear DFlash (``dflash``) runs, when present, are drawn as
horizontal reference lines in the dataset's colour (dashed: autoregressive, dotted: DFlash).
The figure has a fixed pixel size (:data:`FIGSIZE` x :data:`DPI`) so tests can check it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

FIGSIZE = (12.0, 5.0)
DPI = 100
PIXELS = (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI))  # (width, height) of the PNG


def plot_sweep(rows: Sequence[dict[str, Any]], path: Path, *, title: str = "DDTree budget sweep") -> Path:
    """``rows``: summary rows with ``dataset``, ``method``, ``budget``, ``tau``, ``tokens_per_s``."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI)
    datasets = sorted({r["dataset"] for r in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    metrics = (("tau", "tau (tokens per verify step)"), ("tokens_per_s", "output tokens/s"))
    for ax, (key, label) in zip(axes, metrics):
        for i, ds in enumerate(datasets):
            c = colors[i % len(colors)]
            pts = sorted(
                (r["budget"], r[key]) for r in rows if r["dataset"] == ds and r["budget"] is not None and r.get(key) is not None
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=c, label=f"{ds} DDTree")
            for method, style, name in (("baseline", "--", "autoregressive"), ("dflash", ":", "DFlash (linear)")):
                vals = [r[key] for r in rows if r["dataset"] == ds and r["method"] == method and r.get(key) is not None]
                if vals:
                    ax.axhline(vals[0], color=c, linestyle=style, linewidth=1.2, label=f"{ds} {name}")
        budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
        if budgets:
            ax.set_xscale("log", base=2)
            ax.set_xticks(budgets)
            ax.set_xticklabels([str(b) for b in budgets])
            ax.minorticks_off()
        ax.set_xlabel("tree budget B (nodes)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("acceptance length")
    axes[1].set_title("throughput")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[1].legend(handles, labels, fontsize=7, loc="best")
    fig.suptitle(title)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12, top=0.86, wspace=0.22)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), dpi=DPI, format="png")  # no bbox_inches="tight": keep the pixel size fixed
    plt.close(fig)
    return path
