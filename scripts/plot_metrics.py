#!/usr/bin/env python3
"""Plot the training history of one or more quintet runs into a single PNG.

    plot_metrics.py RUN_DIR [RUN_DIR ...] [-o FILE.png]

Reads RUN_DIR/metrics.h5 (written by src/io/metrics.cpp, one row per step) and draws one
panel per quantity; several runs are overlaid in the same panels, labelled by the run
directory's basename (made unique with parent directories, then a counter, when equal):

    training loss     /train/loss        against /train/step
    eval loss         /eval/loss         against /eval/step
    learning rate     /train/lr          against /train/step
    grad norm         /train/grad_norm   against /train/step (log y)
    tokens/s          /train/tokens_per_s against /train/step
    MFU (%)           /train/mfu * 100, and /train/mfu_matmul * 100 as a dashed line
                      ("of matmul rate") when that dataset exists
    compute per rank  /ranks/compute_s [step, rank], one panel per run with more than one rank:
                        each rank's compute seconds per step (its step time less its waits),
                        a line per rank up to 16 ranks, else the median, the min-max band and
                        the slowest rank's line; the slowest rank is labelled (the straggler
                        report's figure, docs/observability.md)
    expert load       /moe/expert_load [step, layer, expert]:
                        * "expert load imbalance": max/mean expert load of the last layer
                          against /train/step, one line per MoE run (1 = perfectly balanced);
                        * "expert share at the last step": one heatmap per MoE run, the share
                          of each layer's routed tokens taken by each expert [layer x expert].

Panels with no data in any run are left out. Rows of a dataset beyond /train/step's length (a
write cut short) are ignored; NaN rows (a run resumed on another layout) are gaps.

Output: -o FILE, else the first run dir's metrics.png. The last line on stdout is
`wrote PATH`. A missing or unreadable metrics.h5 is reported on stderr, naming the path, and
the exit status is 2.
"""
import argparse
import math
import os
import sys

import numpy as np

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

import h5py  # noqa: E402

PANEL_W, PANEL_H, NCOLS = 5.2, 3.4, 3


class MetricsError(Exception):
    """A metrics.h5 that is missing or cannot be read."""


# --- reading ---------------------------------------------------------------------------------

def read_dataset(f, path):
    """The dataset at `path` as a float64 array, or None when it is absent or empty."""
    if path not in f or not isinstance(f[path], h5py.Dataset):
        return None
    values = np.asarray(f[path][()], dtype=np.float64)
    return values if values.size else None


def read_run(run_dir):
    """Everything plotted from run_dir/metrics.h5, as a dict of arrays (absent keys: no data)."""
    path = os.path.join(run_dir, "metrics.h5")
    if not os.path.isfile(path):
        raise MetricsError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            names = ["/train/step", "/train/loss", "/train/lr", "/train/grad_norm",
                     "/train/tokens_per_s", "/train/mfu", "/train/mfu_matmul",
                     "/eval/step", "/eval/loss", "/moe/expert_load", "/ranks/compute_s",
                     "/runs/start_step", "/runs/tp", "/runs/cp", "/runs/dp", "/runs/pp", "/runs/ep"]
            data = {name: read_dataset(f, name) for name in names}
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        raise MetricsError(f"{path}: cannot be read as HDF5 ({e})") from e
    return {k: v for k, v in data.items() if v is not None}


def resumes(run):
    """[(step, text)] for every start of the run after the first: a resume, and the layout it
    moved to when that changed (/runs, one row per start)."""
    starts = run.get("/runs/start_step")
    if starts is None:
        return []
    axes = ["tp", "cp", "dp", "pp", "ep"]
    layouts = [tuple(int(run[f"/runs/{a}"][i]) if f"/runs/{a}" in run and i < len(run[f"/runs/{a}"]) else 1
                     for a in axes) for i in range(len(starts))]
    out = []
    for i in range(1, len(starts)):
        text = "resumed"
        if layouts[i] != layouts[i - 1]:
            text += " on " + " ".join(f"{a}={v}" for a, v in zip(axes, layouts[i]) if v > 1 or a == "dp")
        out.append((float(starts[i]), text))
    return out


def mark_resumes(ax, runs):
    """A dotted vertical line at every resume of every run, labelled at the top of the panel."""
    for label, run, style in runs:
        for step, text in resumes(run):
            ax.axvline(step, color=style.get("color", "0.4"), linestyle=":", linewidth=1)
            ax.annotate(text, xy=(step, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                        va="top", ha="right", fontsize=7, color=style.get("color", "0.3"))


def aligned(run, key, step_key="/train/step"):
    """(steps, values) of `key` against its step column, cut to the shorter of the two."""
    if key not in run or step_key not in run:
        return None
    n = min(len(run[key]), len(run[step_key]))
    if n == 0:
        return None
    return run[step_key][:n], run[key][:n]


def unique_labels(run_dirs):
    """Basenames of the run dirs; equal ones get parent dirs prepended, then a counter."""
    parts = [os.path.normpath(os.path.abspath(d)).split(os.sep) for d in run_dirs]
    labels = [p[-1] for p in parts]
    depth = 1
    while len(set(labels)) < len(labels) and depth < max(len(p) for p in parts):
        depth += 1
        labels = [os.sep.join(p[-depth:]) if labels.count(lab) > 1 else lab
                  for p, lab in zip(parts, labels)]
    seen = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if labels.count(lab) == 1 else f"{lab} ({seen[lab]})")
    return out


# --- panels: each returns True when it drew something ----------------------------------------

def line_panel(ax, runs, key, title, ylabel, step_key="/train/step", scale=1.0, logy=False):
    drew = False
    for label, run, style in runs:
        xy = aligned(run, key, step_key)
        if xy is None:
            continue
        ax.plot(xy[0], xy[1] * scale, **style, label=label,
                marker="o" if len(xy[0]) < 30 else None, markersize=3)
        drew = True
    if drew:
        decorate(ax, title, ylabel)
        if logy and wide_positive_range(ax):
            ax.set_yscale("log")
        mark_resumes(ax, runs)
    return drew


def mfu_panel(ax, runs):
    drew = line_panel(ax, runs, "/train/mfu", "MFU", "% of peak FLOP/s", scale=100.0)
    dashed = False
    for label, run, style in runs:
        xy = aligned(run, "/train/mfu_matmul")
        if xy is None:
            continue
        ax.plot(xy[0], xy[1] * 100.0, color=style["color"], linestyle="--",
                label=f"{label} of matmul rate")
        dashed = True
    if dashed:
        decorate(ax, "MFU", "%")
        ax.legend(handles=[Line2D([], [], color="gray", label="of peak FLOP/s"),
                           Line2D([], [], color="gray", linestyle="--", label="of matmul rate")],
                  fontsize=7)
    return drew or dashed


def imbalance(load):
    """max/mean expert load of the last layer, per step (NaN where the row is empty)."""
    out = np.full(len(load), np.nan)
    for i, row in enumerate(load[:, -1, :]):
        row = row[np.isfinite(row)]
        if row.size and row.mean() > 0:
            out[i] = row.max() / row.mean()
    return out


def moe_imbalance_panel(ax, runs):
    drew = False
    for label, run, style in runs:
        load = run.get("/moe/expert_load")
        if load is None or load.ndim != 3 or "/train/step" not in run:
            continue
        n = min(len(load), len(run["/train/step"]))
        ax.plot(run["/train/step"][:n], imbalance(load[:n]), **style, label=label,
                marker="o" if n < 30 else None, markersize=3)
        drew = True
    if drew:
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
        decorate(ax, "expert load imbalance (last layer)", "max / mean expert load")
    return drew


def last_step_shares(load):
    """[layer, expert] share of each layer's load at the last step that has finite values."""
    for row in load[::-1]:
        if np.all(np.isfinite(row)):
            totals = row.sum(axis=1, keepdims=True)
            return np.divide(row, totals, out=np.zeros_like(row), where=totals > 0)
    return None


def moe_heatmap_panel(fig, ax, label, run):
    shares = last_step_shares(run["/moe/expert_load"])
    if shares is None:
        return False
    layers, experts = shares.shape
    im = ax.imshow(shares, aspect="auto", cmap="viridis", vmin=0.0,
                   extent=(-0.5, experts - 0.5, layers - 0.5, -0.5), interpolation="nearest")
    fig.colorbar(im, ax=ax, label="share of layer's tokens")
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_xticks(range(experts) if experts <= 16 else np.linspace(0, experts - 1, 9).astype(int))
    ticks = list(range(layers)) if layers <= 16 else list(np.linspace(0, layers - 1, 9).astype(int))
    ax.set_yticks(ticks)
    # A layer with no routing at all is a dense layer (moe.layers leaves it out): say so.
    dense = [not np.any(shares[l] > 0) for l in range(layers)]
    ax.set_yticklabels([f"{l} (dense)" if dense[l] else str(l) for l in ticks], fontsize=8)
    ax.set_title(f"expert share at the last step\n{label}", fontsize=9)
    return True


def rank_compute_panel(ax, label, run):
    """Each rank's compute seconds per step (/ranks/compute_s [step, rank]) of one run."""
    compute = run["/ranks/compute_s"]
    n = min(len(compute), len(run["/train/step"]))
    steps, compute = run["/train/step"][:n], compute[:n]
    ranks = compute.shape[1]
    means = np.nanmean(compute, axis=0)
    slow = int(np.nanargmax(means))
    if ranks <= 16:
        for r in range(ranks):
            ax.plot(steps, compute[:, r], linewidth=2.0 if r == slow else 0.9,
                    label=f"rank {r}" if r == slow or ranks <= 8 else None)
    else:
        ax.fill_between(steps, np.nanmin(compute, axis=1), np.nanmax(compute, axis=1),
                        color="0.8", label="min-max of the ranks")
        ax.plot(steps, np.nanmedian(compute, axis=1), color="0.3", label="median rank")
        ax.plot(steps, compute[:, slow], color="C3", linewidth=1.5, label=f"rank {slow} (slowest)")
    decorate(ax, f"compute per rank\n{label}", "seconds per step")
    ax.legend(fontsize=7, title=f"slowest: rank {slow}", title_fontsize=7)
    return True


def decorate(ax, title, ylabel):
    """Title, labels and grid; the runs' legend is the figure's, above the panels."""
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def wide_positive_range(ax, decades=1.3):
    """Whether every plotted y is > 0 and they span more than `decades` (worth a log axis)."""
    ys = [np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()]
    ys = np.concatenate([y[np.isfinite(y)] for y in ys]) if ys else np.array([])
    return ys.size > 0 and ys.min() > 0 and math.log10(ys.max() / ys.min()) > decades


# --- the figure ------------------------------------------------------------------------------

def panel_makers(runs):
    """(name, function(fig, ax) -> drew) for every candidate panel, in display order."""
    makers = [
        ("loss", lambda fig, ax: line_panel(ax, runs, "/train/loss", "training loss", "loss")),
        ("eval", lambda fig, ax: line_panel(ax, runs, "/eval/loss", "eval loss", "loss",
                                            step_key="/eval/step")),
        ("lr", lambda fig, ax: line_panel(ax, runs, "/train/lr", "learning rate", "lr")),
        ("grad", lambda fig, ax: line_panel(ax, runs, "/train/grad_norm", "grad norm",
                                            "global L2 norm", logy=True)),
        ("tps", lambda fig, ax: line_panel(ax, runs, "/train/tokens_per_s", "throughput",
                                           "tokens/s")),
        ("mfu", lambda fig, ax: mfu_panel(ax, runs)),
        ("moe", lambda fig, ax: moe_imbalance_panel(ax, runs)),
    ]
    for label, run, _ in runs:
        compute = run.get("/ranks/compute_s")
        if compute is not None and compute.ndim == 2 and compute.shape[1] > 1 and "/train/step" in run:
            makers.append((f"ranks {label}",
                           lambda fig, ax, label=label, run=run: rank_compute_panel(ax, label, run)))
    for label, run, _ in runs:
        load = run.get("/moe/expert_load")
        if load is not None and load.ndim == 3:
            makers.append((f"heat {label}",
                           lambda fig, ax, label=label, run=run: moe_heatmap_panel(fig, ax, label, run)))
    return makers


def has_data(name, runs):
    """Whether a panel would draw anything, decided before the grid is laid out."""
    if name.startswith("heat ") or name.startswith("ranks "):
        return True
    keys = {"loss": ["/train/loss"], "eval": ["/eval/loss"], "lr": ["/train/lr"],
            "grad": ["/train/grad_norm"], "tps": ["/train/tokens_per_s"],
            "mfu": ["/train/mfu", "/train/mfu_matmul"], "moe": ["/moe/expert_load"]}[name]
    step_key = "/eval/step" if name == "eval" else "/train/step"
    return any(aligned(run, k, step_key) is not None for _, run, _ in runs for k in keys)


def draw(runs, out):
    makers = [(n, m) for n, m in panel_makers(runs) if has_data(n, runs)]
    if not makers:
        print("plot_metrics.py: no steps recorded yet in any run; the figure is empty",
              file=sys.stderr)
    nrows = max(1, math.ceil(len(makers) / NCOLS))
    ncols = min(NCOLS, max(1, len(makers)))
    fig, axes = plt.subplots(nrows, ncols, figsize=(PANEL_W * ncols, PANEL_H * nrows),
                             squeeze=False)
    flat = list(axes.flat)
    for ax, (_, make) in zip(flat, makers):
        if not make(fig, ax):
            ax.set_visible(False)
    for ax in flat[len(makers):]:
        ax.set_visible(False)
    if not makers:
        flat[0].set_visible(True)
        flat[0].text(0.5, 0.5, "no steps recorded", ha="center", va="center")
        flat[0].set_axis_off()
    fig.tight_layout(rect=(0, 0, 1, 1 - legend_height(fig, runs)))
    add_run_legend(fig, runs)
    fig.savefig(out, dpi=110)
    plt.close(fig)


LEGEND_COLS = 3


def legend_height(fig, runs):
    """The fraction of the figure's height kept free at the top for the runs' legend."""
    rows = math.ceil(len(runs) / LEGEND_COLS)
    return min(0.4, (0.1 + 0.22 * rows) / fig.get_figheight())


def add_run_legend(fig, runs):
    """One legend for the whole figure: a run's colour is the same in every panel."""
    handles = [Line2D([], [], **style, marker="o", markersize=4, label=label)
               for label, _, style in runs]
    fig.legend(handles=handles, loc="upper center", ncol=min(LEGEND_COLS, len(runs)),
               fontsize=9, frameon=False)


def run_style(i):
    """Line colour and style of the i-th run: the colour cycle, then other line styles
    ("--" is kept for MFU of the matmul rate)."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return dict(color=colors[i % len(colors)],
                linestyle=["-", "-.", ":"][(i // len(colors)) % 3])


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Plot loss, eval loss, learning rate, grad norm, tokens/s, MFU and MoE "
                    "expert load from RUN_DIR/metrics.h5 into one PNG; several runs are "
                    "overlaid.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run directory with metrics.h5")
    p.add_argument("-o", "--output", metavar="FILE.png",
                   help="output file (default: FIRST_RUN_DIR/metrics.png)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        data = [read_run(d) for d in args.run_dirs]
    except MetricsError as e:
        print(f"plot_metrics.py: {e}", file=sys.stderr)
        return 2
    runs = [(label, run, run_style(i))
            for i, (label, run) in enumerate(zip(unique_labels(args.run_dirs), data))]
    out = args.output or os.path.join(args.run_dirs[0], "metrics.png")
    try:
        draw(runs, out)
    except OSError as e:
        print(f"plot_metrics.py: cannot write {out}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
