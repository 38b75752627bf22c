#!/usr/bin/env python3
"""The coordinate check's plot (quintet mup-check -o PNG): for each kind of layer output, its RMS
against the width on log-log axes, one line per training step. Under muP the lines are flat.

usage: plot_mup_check.py DATA.json OUT.png   (DATA: the list quintet mup-check --json prints)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = ["embedding", "attn_logits", "attn_out", "ffn_out", "residual", "output_logits"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    points = json.load(open(sys.argv[1]))
    steps = sorted({p["step"] for p in points})
    widths = sorted({p["width"] for p in points})
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), sharex=True)
    cmap = plt.get_cmap("viridis")
    for ax, kind in zip(axes.flat, KINDS):
        for i, s in enumerate(steps):
            ys = {p["width"]: p["rms"] for p in points if p["kind"] == kind and p["step"] == s}
            xs = [w for w in widths if ys.get(w, 0) > 0]
            ax.plot(xs, [ys[w] for w in xs], "o-", color=cmap(i / max(1, len(steps) - 1)), label=f"step {s}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(kind)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("width (d_model)")
    for ax in axes[:, 0]:
        ax.set_ylabel("RMS")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
