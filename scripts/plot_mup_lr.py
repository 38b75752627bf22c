#!/usr/bin/env python3
"""Does the best learning rate stay put as the width grows? Plot a learning-rate sweep over widths.

    plot_mup_lr.py STUDY_DIR OUT_PREFIX

STUDY_DIR is the directory of a `quintet study` whose [vary] section sweeps init.scheme,
model.d_model and train.lr (inputs/study_mup_lr.deck). For every finished run it reads the last
validation loss (/eval/loss of STUDY_DIR/runs/<name>/metrics.h5; a run that diverged to a
non-finite loss counts as +inf) and writes

  OUT_PREFIX.csv   scheme,d_model,lr,val_loss        one row per run
  OUT_PREFIX.json  per scheme and width: the grid's best lr, the optimum of a parabola in
                   log10(lr) through the best point and its two neighbours, and the bracket
                   [lower neighbour, upper neighbour] the optimum is known to lie in
  OUT_PREFIX.png   validation loss against lr, one panel per scheme, one line per width

The bracket is the honest interval: one seed per point, so the noise of a single loss is not
measured here, and the optimum cannot be placed more finely than between two grid points.
Exit status 2 when the study is missing or has no finished run.
"""
import csv
import json
import math
import os
import sys

import numpy as np
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import h5py  # noqa: E402


def deck_value(deck, section, key):
    current = None
    for line in deck.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif "=" in line and current == section:
            k, v = (s.strip() for s in line.split("=", 1))
            if k == key:
                return v
    return None


def read_runs(study_dir):
    rows = []
    with h5py.File(os.path.join(study_dir, "study.h5"), "r") as f:
        for name, g in f["runs"].items():
            status = g.attrs.get("status", b"")
            status = status.decode() if isinstance(status, bytes) else str(status)
            if status != "done":
                print(f"left out {name}: status {status}", file=sys.stderr)
                continue
            deck = g.attrs["deck"]
            deck = deck.decode() if isinstance(deck, bytes) else str(deck)
            scheme = deck_value(deck, "init", "scheme")
            d_model = int(deck_value(deck, "model", "d_model"))
            lr = float(deck_value(deck, "train", "lr"))
            loss = math.inf
            with h5py.File(os.path.join(study_dir, "runs", name, "metrics.h5"), "r") as m:
                if "eval/loss" in m and len(m["eval/loss"]):
                    v = float(m["eval/loss"][-1])
                    loss = v if math.isfinite(v) else math.inf
            rows.append((scheme, d_model, lr, loss))
    return sorted(rows)


def optimum(lrs, losses):
    """Best grid point, the parabola's optimum in log10(lr) and the bracket around it."""
    i = int(np.argmin(losses))
    best = lrs[i]
    lo = lrs[i - 1] if i > 0 else None
    hi = lrs[i + 1] if i + 1 < len(lrs) else None
    fitted = None
    if lo is not None and hi is not None and all(math.isfinite(losses[j]) for j in (i - 1, i, i + 1)):
        x = np.log10([lo, best, hi])
        a, b, _ = np.polyfit(x, [losses[i - 1], losses[i], losses[i + 1]], 2)
        if a > 0:
            fitted = float(10 ** (-b / (2 * a)))
    return {"grid_best_lr": best, "grid_best_loss": losses[i], "fitted_lr": fitted,
            "bracket": [lo, hi], "at_grid_edge": lo is None or hi is None}


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    study_dir, prefix = sys.argv[1], sys.argv[2]
    try:
        rows = read_runs(study_dir)
    except (OSError, KeyError) as e:
        print(f"plot_mup_lr.py: cannot read {study_dir}/study.h5: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"plot_mup_lr.py: no finished run in {study_dir}", file=sys.stderr)
        return 2
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scheme", "d_model", "lr", "val_loss"])
        for r in rows:
            w.writerow(r)
    schemes = sorted({r[0] for r in rows})
    summary = {}
    fig, axes = plt.subplots(1, len(schemes), figsize=(5.5 * len(schemes), 4.2), sharey=True, squeeze=False)
    finite = [r[3] for r in rows if math.isfinite(r[3])]
    ceiling = max(finite) + 0.1 if finite else 10
    for ax, scheme in zip(axes[0], schemes):
        summary[scheme] = {}
        for d in sorted({r[1] for r in rows if r[0] == scheme}):
            pts = sorted((r[2], r[3]) for r in rows if r[0] == scheme and r[1] == d)
            lrs, losses = [p[0] for p in pts], [p[1] for p in pts]
            opt = optimum(lrs, losses)
            summary[scheme][str(d)] = opt
            shown = [min(l, ceiling) for l in losses]
            line, = ax.plot(lrs, shown, "o-", label=f"d_model {d}")
            ax.plot([opt["grid_best_lr"]], [opt["grid_best_loss"]], "*", ms=14, color=line.get_color())
        ax.set_xscale("log")
        ax.set_xlabel("train.lr")
        ax.set_title(f"init.scheme = {scheme}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("validation loss after the run (diverged: drawn at the top)")
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=110)
    with open(prefix + ".json", "w") as f:
        json.dump(summary, f, indent=2)
    for p in (".csv", ".json", ".png"):
        print(f"wrote {prefix + p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
