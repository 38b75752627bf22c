#!/usr/bin/env python3
"""Plot a quintet scaling study (STUDY_DIR/study.h5) into STUDY_DIR/plots/*.png.

    plot_study.py STUDY_DIR

study.h5 schema (written by `quintet study`):

  root attributes
    scaling    string: "strong", "weak" or "none"
    study      string: the study deck's text
    base_deck  string: path of the base deck
  /runs/<name>/          one group per run
    attributes (scalars)
      tp, cp, dp, pp, ep, world, threads, seed     int64
      layout        string, e.g. "tp2 cp1 pp1 dp1 ep1"
      commit        string
      deck          string, the resolved deck text
      status        string, "done" | "failed"
      exit_status   int64
      tokens_per_s  median over the steps after the first two
      mfu, mfu_matmul, step_time_s                              medians
      time_compute_s, time_tp_s, time_cp_s, time_dp_s, time_ep_s, time_bubble_s
                    medians of per-step seconds; compute = step time minus the others (>= 0)
      predicted_tokens_per_s, predicted_step_time_s, predicted_peak_rss_bytes
                    float64; NaN when there is no prediction
      peak_rss_bytes  float64, max over ranks
    datasets
      step, loss, grad_norm, tokens_per_s   1-D float64, one value per step
      memory_bytes  [ranks, 6] float64, attribute columns =
                    "params,grads,optimizer,activations,buffers,peak_rss"
  /parity/<name>/        optional, one group per compared run
    attributes
      loss_rel, grad_norm_rel, expert_load_rel   float64 (expert_load_rel NaN when not MoE)
      reference     string: the name of the single-rank run compared against

Plots (runs with status "failed" are left out and listed on stderr; runs of equal world size
but different layouts are separate points, labelled by layout):

  throughput.png     tokens_per_s against world (log-log), the best run per world joined by a
                     line, and the ideal linear scaling from the smallest world N0
  efficiency.png     scaling efficiency against world: strong: (tps(N)/tps(N0)) / (N/N0);
                     weak: (tps(N)/N) / (tps(N0)/N0); tps(N0) is the best run at N0.
                     Not drawn when scaling is "none".
  mfu.png            mfu (%) against world; mfu_matmul (%) dashed where finite
  comm_fraction.png  stacked bars per run: time_compute_s, time_tp_s, time_cp_s, time_dp_s,
                     time_ep_s, time_bubble_s as shares of step_time_s
  predicted.png      measured against predicted tokens_per_s, and peak_rss_bytes against
                     predicted_peak_rss_bytes, with the line y = x
  loss.png           every run's /runs/<name>/loss against step
  parity.png         (when /parity exists) loss_rel, grad_norm_rel, expert_load_rel per run,
                     log y; exact agreement (0) is drawn at the floor and marked "0"

Prints `wrote PATH` for each PNG. Exit status 2 when study.h5 is missing or unreadable, 1 when
no run succeeded.
"""
import argparse
import math
import os
import sys

import numpy as np

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import h5py  # noqa: E402

PHASES = [("time_compute_s", "compute"), ("time_tp_s", "tp"), ("time_cp_s", "cp"),
          ("time_dp_s", "dp"), ("time_ep_s", "ep"), ("time_bubble_s", "pp bubble")]
PARITY = [("loss_rel", "loss"), ("grad_norm_rel", "grad norm"),
          ("expert_load_rel", "expert load")]
DPI = 110


class StudyError(Exception):
    """A study.h5 that is missing or cannot be read."""


# --- reading ---------------------------------------------------------------------------------

def scalar(value):
    """An HDF5 attribute as a Python str / int / float (bytes decoded, 1-element arrays unboxed)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0] if value.size == 1 else value
    if isinstance(value, np.generic):
        value = value.item()
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def number(attrs, key):
    """A numeric attribute as float (NaN when absent or not a number)."""
    try:
        return float(scalar(attrs[key]))
    except (KeyError, TypeError, ValueError):
        return math.nan


def text(attrs, key, default=""):
    return str(scalar(attrs[key])) if key in attrs else default


def read_run(name, group):
    attrs = group.attrs
    run = {key: number(attrs, key) for key in attrs if key not in ("layout", "commit", "deck", "status")}
    run.update(name=name, layout=text(attrs, "layout", name), status=text(attrs, "status", "done"))
    run["world"] = int(run["world"]) if math.isfinite(run.get("world", math.nan)) else 1
    for key in ("step", "loss", "grad_norm", "tokens_per_s"):
        if key in group and isinstance(group[key], h5py.Dataset):
            run["series_" + key] = np.asarray(group[key][()], dtype=np.float64).reshape(-1)
    return run


def read_study(study_dir):
    """(scaling, runs, parity): runs as dicts sorted by (world, layout, name); parity or None."""
    path = os.path.join(study_dir, "study.h5")
    if not os.path.isfile(path):
        raise StudyError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            scaling = text(f.attrs, "scaling", "none")
            runs = [read_run(name, g) for name, g in f["runs"].items()] if "runs" in f else []
            parity = read_parity(f["parity"]) if "parity" in f else None
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        raise StudyError(f"{path}: cannot be read as HDF5 ({e})") from e
    runs.sort(key=lambda r: (r["world"], r["layout"], r["name"]))
    return scaling, runs, parity


def read_parity(group):
    rows = []
    for name, g in group.items():
        row = {key: number(g.attrs, key) for key, _ in PARITY}
        row.update(name=name, reference=text(g.attrs, "reference"))
        rows.append(row)
    return sorted(rows, key=lambda r: r["name"])


# --- helpers ---------------------------------------------------------------------------------

MARKERS = "osD^vPX*"


def label(run):
    return run.get("label", run["layout"])


def style_runs(runs):
    """Give each run its label (the layout; the name added where layouts repeat), colour and
    marker, the same in every plot."""
    layouts = [r["layout"] for r in runs]
    for i, r in enumerate(runs):
        r["label"] = r["layout"] if layouts.count(r["layout"]) == 1 else f"{r['layout']} ({r['name']})"
        r["color"] = f"C{i % 10}"
        r["marker"] = MARKERS[(i // 10) % len(MARKERS)]


def finite(*values):
    return all(isinstance(v, float) and math.isfinite(v) for v in values)


def best_per_world(runs, key):
    """{world: the largest finite runs[key] among runs of that world}."""
    best = {}
    for r in runs:
        v = r.get(key, math.nan)
        if finite(v) and (r["world"] not in best or v > best[r["world"]]):
            best[r["world"]] = v
    return best


def point(ax, run, x, y, hollow=False):
    """One run's point, in its colour and marker, labelled (for the legend) by its layout."""
    ax.scatter(x, y, marker=run["marker"], s=40, zorder=3, label=None if hollow else label(run),
               facecolors="none" if hollow else run["color"], edgecolors=run["color"])


def legend(ax):
    """The legend: the runs (one entry each), then the lines; outside the axes when long."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    outside = len(handles) > 6
    ax.legend(handles, labels, fontsize=7, loc="upper left" if outside else "best",
              bbox_to_anchor=(1.02, 1.0) if outside else None)


def rank_axis(ax, worlds):
    ax.set_xlabel("ranks (world size)")
    worlds = sorted(set(worlds))
    if len(worlds) > 1 and worlds[0] > 0:
        ax.set_xscale("log", base=2)
    ax.set_xticks(worlds)
    ax.set_xticklabels([str(w) for w in worlds])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)


def point_figsize(runs):
    """Wider when the legend (one entry per run) goes beside the axes."""
    return (9.0, 4.8) if len(runs) > 4 else (6.5, 4.8)


def save(fig, path):
    if not fig.legends:  # a figure legend is placed after its own tight_layout
        fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    print(f"wrote {path}")


def no_data(ax, message):
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)


# --- the plots -------------------------------------------------------------------------------

def plot_throughput(runs, scaling, path):
    fig, ax = plt.subplots(figsize=point_figsize(runs))
    points = [r for r in runs if finite(r.get("tokens_per_s", math.nan))]
    for r in points:
        point(ax, r, r["world"], r["tokens_per_s"])
    best = best_per_world(points, "tokens_per_s")
    if best:
        worlds = sorted(best)
        ax.plot(worlds, [best[w] for w in worlds], color="black", linewidth=1,
                label="best layout per world")
        n0 = worlds[0]
        if len(worlds) > 1 and scaling in ("strong", "weak"):
            ax.plot(worlds, [best[n0] * w / n0 for w in worlds], color="gray", linestyle="--",
                    label="ideal (linear from N0)")
        if all(best[w] > 0 for w in worlds) and len(worlds) > 1:
            ax.set_yscale("log")
        legend(ax)
    else:
        no_data(ax, "no throughput recorded")
    rank_axis(ax, [r["world"] for r in runs])
    ax.set_ylabel("tokens/s")
    ax.set_title(f"throughput ({scaling} scaling)")
    save(fig, path)


def efficiency(runs, scaling):
    """[(run, efficiency)] against the best run at the smallest world N0."""
    best = best_per_world(runs, "tokens_per_s")
    if not best:
        return []
    n0 = min(best)
    out = []
    for r in runs:
        tps = r.get("tokens_per_s", math.nan)
        if not finite(tps) or best[n0] <= 0:
            continue
        if scaling == "strong":
            eff = (tps / best[n0]) / (r["world"] / n0)
        else:  # weak: throughput per rank relative to N0's
            eff = (tps / r["world"]) / (best[n0] / n0)
        out.append((r, eff))
    return out


def plot_efficiency(runs, scaling, path):
    fig, ax = plt.subplots(figsize=point_figsize(runs))
    points = efficiency(runs, scaling)
    for r, eff in points:
        point(ax, r, r["world"], eff * 100.0)
    if points:
        ax.axhline(100.0, color="gray", linestyle="--", linewidth=0.8, label="ideal")
        ax.set_ylim(bottom=0, top=max(110.0, 1.1 * max(e * 100.0 for _, e in points)))
        legend(ax)
    else:
        no_data(ax, "no throughput recorded")
    rank_axis(ax, [r["world"] for r in runs])
    formula = ("(tps(N)/tps(N0)) / (N/N0)" if scaling == "strong"
               else "(tps(N)/N) / (tps(N0)/N0)")
    ax.set_ylabel(f"efficiency (%) = {formula}", fontsize=8)
    ax.set_title(f"{scaling} scaling efficiency")
    save(fig, path)


def mfu_series(ax, runs, key, linestyle, name, hollow):
    """runs[key] (%) against world, one point per run and the best per world joined by a
    black line (its legend entry: `name`); True if any point."""
    points = [r for r in runs if finite(r.get(key, math.nan))]
    for r in points:
        point(ax, r, r["world"], r[key] * 100.0, hollow=hollow)
    best = best_per_world(points, key)
    if best:
        worlds = sorted(best)
        ax.plot(worlds, [best[w] * 100.0 for w in worlds], color="black", linewidth=1,
                linestyle=linestyle, label=name)
    return bool(points)


def plot_mfu(runs, path):
    fig, ax = plt.subplots(figsize=point_figsize(runs))
    drew = mfu_series(ax, runs, "mfu", "-", "of peak FLOP/s (filled)", hollow=False)
    matmul = mfu_series(ax, runs, "mfu_matmul", "--", "of matmul rate (hollow)", hollow=drew)
    if drew or matmul:
        ax.set_ylim(bottom=0)
        legend(ax)
    else:
        no_data(ax, "no MFU recorded")
    rank_axis(ax, [r["world"] for r in runs])
    ax.set_ylabel("MFU (%)")
    ax.set_title("model FLOP utilisation")
    save(fig, path)


def phase_shares(run):
    """Each phase's share of the step time (missing or NaN phases count as 0)."""
    seconds = [max(0.0, run.get(key, 0.0)) if finite(run.get(key, math.nan)) else 0.0
               for key, _ in PHASES]
    step = run.get("step_time_s", math.nan)
    total = max(sum(seconds), step if finite(step) else 0.0)
    return [s / total if total > 0 else 0.0 for s in seconds]


def plot_comm_fraction(runs, path):
    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(runs) + 2.5), 4.8))
    x = np.arange(len(runs))
    shares = np.array([phase_shares(r) for r in runs]).reshape(len(runs), len(PHASES))
    bottom = np.zeros(len(runs))
    for i, (_, name) in enumerate(PHASES):
        ax.bar(x, shares[:, i] * 100.0, bottom=bottom * 100.0, label=name, color=f"C{i}")
        bottom += shares[:, i]
    ax.set_xticks(x)
    ax.set_xticklabels([f"{label(r)}\n(N={r['world']})" for r in runs], fontsize=7,
                       rotation=30 if len(runs) > 6 else 0, ha="right" if len(runs) > 6 else "center")
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of step time")
    ax.set_title("where the step time goes")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18 if len(runs) <= 6 else -0.3))
    ax.grid(True, axis="y", alpha=0.3)
    save(fig, path)


def measured_vs_predicted(ax, runs, measured, predicted, unit, scale, title):
    pairs = [(r, r[predicted] / scale, r[measured] / scale) for r in runs
             if finite(r.get(measured, math.nan), r.get(predicted, math.nan))]
    ax.set_title(title)
    ax.set_xlabel(f"predicted ({unit})")
    ax.set_ylabel(f"measured ({unit})")
    ax.grid(True, alpha=0.3)
    if not pairs:
        no_data(ax, "no predictions")
        return
    for r, px, my in pairs:
        point(ax, r, px, my)
    hi = 1.1 * max(max(p, m) for _, p, m in pairs) or 1.0
    ax.plot([0, hi], [0, hi], color="gray", linestyle="--", label="y = x")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.locator_params(nbins=5)


def plot_predicted(runs, path):
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5.2))
    measured_vs_predicted(a, runs, "tokens_per_s", "predicted_tokens_per_s", "tokens/s", 1.0,
                          "throughput")
    measured_vs_predicted(b, runs, "peak_rss_bytes", "predicted_peak_rss_bytes", "GiB",
                          float(1 << 30), "peak RSS (max over ranks)")
    shared_legend(fig, [a, b])
    save(fig, path)


def shared_legend(fig, axes):
    """One legend beside the panels: each label once, whichever panel drew it."""
    entries = {}
    for ax in axes:
        for handle, lab in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(lab, handle)
    if entries:
        fig.tight_layout(rect=(0, 0, 0.82, 1))
        fig.legend(list(entries.values()), list(entries.keys()), fontsize=7,
                   loc="center left", bbox_to_anchor=(0.82, 0.5))


def plot_loss(runs, path):
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    drew = False
    for r in runs:
        loss = r.get("series_loss")
        if loss is None or loss.size == 0:
            continue
        step = r.get("series_step")
        if step is None or step.size != loss.size:
            step = np.arange(1, loss.size + 1)
        ax.plot(step, loss, color=r["color"], label=f"{r['name']} ({r['layout']})",
                marker="o" if loss.size < 30 else None, markersize=3)
        drew = True
    if drew:
        legend(ax)
    else:
        no_data(ax, "no loss recorded")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("loss curves")
    ax.grid(True, alpha=0.3)
    save(fig, path)


def plot_parity(parity, path):
    fig, ax = plt.subplots(figsize=(max(6.5, 1.2 * len(parity) + 2.5), 4.8))
    values = [[row[key] for key, _ in PARITY] for row in parity]
    positive = [v for vs in values for v in vs if finite(v) and v > 0]
    floor = min(positive) / 10.0 if positive else 1e-16
    width = 0.8 / len(PARITY)
    x = np.arange(len(parity))
    labelled = set()
    for j, (_, name) in enumerate(PARITY):
        for i, vs in enumerate(values):
            v = vs[j]
            if not finite(v):  # NaN: not measured (expert load of a dense model)
                continue
            xi = x[i] + (j - (len(PARITY) - 1) / 2) * width
            ax.bar(xi, max(v, floor), width, color=f"C{j}",
                   label=None if name in labelled else name)
            labelled.add(name)
            if v <= 0:
                ax.text(xi, floor, "0", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([row["name"] for row in parity], fontsize=8,
                       rotation=30 if len(parity) > 6 else 0)
    refs = sorted({row["reference"] for row in parity if row["reference"]})
    ax.set_title("relative difference from the single-rank run" +
                 (f" ({', '.join(refs)})" if refs else ""))
    ax.set_ylabel("relative difference")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


# --- main ------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Plot a quintet scaling study (STUDY_DIR/study.h5) into STUDY_DIR/plots/: "
                    "throughput, efficiency, mfu, comm_fraction, predicted, loss and, when the "
                    "study has parity checks, parity PNGs.")
    p.add_argument("study_dir", metavar="STUDY_DIR", help="a study directory with study.h5")
    return p.parse_args(argv)


def split_failed(runs):
    ok = [r for r in runs if r["status"] != "failed"]
    failed = [r for r in runs if r["status"] == "failed"]
    for r in failed:
        status = r.get("exit_status", math.nan)
        why = f"exit status {int(status)}" if finite(status) else "failed"
        print(f"plot_study.py: run {r['name']} ({label(r)}) failed ({why}): left out of the plots",
              file=sys.stderr)
    return ok


def main(argv=None):
    args = parse_args(argv)
    try:
        scaling, runs, parity = read_study(args.study_dir)
    except StudyError as e:
        print(f"plot_study.py: {e}", file=sys.stderr)
        return 2
    runs = split_failed(runs)
    if not runs:
        print(f"plot_study.py: no successful run in {args.study_dir}/study.h5: nothing to plot",
              file=sys.stderr)
        return 1
    style_runs(runs)
    out = os.path.join(args.study_dir, "plots")
    os.makedirs(out, exist_ok=True)
    plot_throughput(runs, scaling, os.path.join(out, "throughput.png"))
    if scaling in ("strong", "weak"):
        plot_efficiency(runs, scaling, os.path.join(out, "efficiency.png"))
    else:
        print(f"plot_study.py: scaling is '{scaling}': no efficiency.png", file=sys.stderr)
    plot_mfu(runs, os.path.join(out, "mfu.png"))
    plot_comm_fraction(runs, os.path.join(out, "comm_fraction.png"))
    plot_predicted(runs, os.path.join(out, "predicted.png"))
    plot_loss(runs, os.path.join(out, "loss.png"))
    if parity:
        plot_parity(parity, os.path.join(out, "parity.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
