"""The loss curves of a train_pair.py run: python tools/real_pair/plot_loss.py train_log.jsonl out.png"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    log, png = Path(argv[0]), Path(argv[1])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, phase, title in (
        (axes[0], "target", "target (next-token CE)"),
        (axes[1], "draft", "drafter (position-weighted block CE)"),
    ):
        pts = [(d["step"], d["loss"]) for d in lines if d.get("phase") == phase and "step" in d and "loss" in d]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", lw=1.2)
        done = [d for d in lines if d.get("phase") == phase and d.get("event") == "done"]
        if done and "heldout_loss" in done[0]:
            ax.axhline(done[0]["heldout_loss"], color="C3", ls="--", lw=1, label="held-out loss (end)")
            ax.legend(fontsize=8)
        acc = [(d["step"], d["acc_d1"]) for d in lines if d.get("phase") == phase and "acc_d1" in d]
        if acc:
            ax2 = ax.twinx()
            ax2.plot([p[0] for p in acc], [p[1] for p in acc], "C2-", lw=1, label="top-1 acc, block slot 1")
            ax2.set_ylabel("top-1 accuracy, slot 1", color="C2")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
