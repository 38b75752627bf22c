#!/usr/bin/env python3
"""Draws a fitted scaling law: `quintet laws INPUT -o PLOT.png` runs this with the law's JSON.

usage: plot_laws.py LAW.json OUT.png

Three panels from the JSON that `quintet laws --json` prints (docs/scaling-laws.md):
  1. IsoFLOP curves: each budget's runs (loss against N), its fitted parabola in log N and the
     parabola's minimum; the parametric law's compute-optimal N for the same budget, dashed;
  2. loss against C: every run, each budget's IsoFLOP minimum, and the fitted law's frontier
     L(N_opt(C), D_opt(C)) with its bootstrap band; held-out runs (--exclude-highest) hollow;
  3. residuals: log L - log L^ of every run against N, coloured by budget.
Writes OUT.png (PNG whatever its name ends with). Exit status 2 when the JSON cannot be read.
"""
import json
import math
import sys

import numpy as np

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 110


def value(law, key):
    v = law.get(key, {}).get("value")
    return float("nan") if v is None else float(v)


def frontier(params, C):
    E, A, B, alpha, beta = params
    G = (alpha * A / (beta * B)) ** (1.0 / (alpha + beta))
    N = G * (C / 6.0) ** (beta / (alpha + beta))
    D = C / (6.0 * N)
    return E + A / N ** alpha + B / D ** beta, N


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            law = json.load(f)
    except (OSError, ValueError) as e:
        print(f"plot_laws.py: cannot read {sys.argv[1]}: {e}", file=sys.stderr)
        return 2
    params = [value(law, k) for k in ("E", "A", "B", "alpha", "beta")]
    points = law.get("points", [])
    heldout = law.get("heldout", [])
    budgets = sorted({p["budget"] for p in points + heldout})
    cmap = plt.get_cmap("viridis")
    colour = {b: cmap(i / max(1, len(budgets) - 1)) for i, b in enumerate(budgets)}
    iso = {b["C"]: b for b in law.get("isoflop", {}).get("budgets", [])}

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    for b in budgets:
        pts = [p for p in points if p["budget"] == b]
        held = [p for p in heldout if p["budget"] == b]
        label = f"C = {b:.3g}"
        if pts:
            ax.scatter([p["N"] for p in pts], [p["loss"] for p in pts], color=colour[b], label=label, zorder=3)
        if held:
            ax.scatter([p["N"] for p in held], [p["loss"] for p in held], facecolors="none", edgecolors=colour[b],
                       label=label + " (held out)", zorder=3)
        prof = iso.get(b)
        allpts = pts + held
        if prof and allpts:
            p0, p1, p2 = prof["parabola"]
            ns = [p["N"] for p in allpts]
            x = np.linspace(math.log(min(ns)) - 0.2, math.log(max(ns)) + 0.2, 100)
            ax.plot(np.exp(x), p0 + p1 * x + p2 * x * x, color=colour[b], lw=1)
            if prof.get("ok"):
                ax.plot([prof["N_opt"]], [prof["loss_opt"]], marker="*", ms=13, color=colour[b], mec="black", zorder=4)
        if all(math.isfinite(v) for v in params) and params[3] > 0 and params[4] > 0:
            _, nopt = frontier(params, b)
            ax.axvline(nopt, color=colour[b], ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(f"N ({law.get('params') or 'parameters'})")
    ax.set_ylabel(law.get("loss", "loss"))
    ax.set_title("IsoFLOP profiles (stars: minima; dashed: the law's N_opt)")
    ax.legend(fontsize=8)

    ax = axes[1]
    for b in budgets:
        pts = [p for p in points if p["budget"] == b]
        held = [p for p in heldout if p["budget"] == b]
        if pts:
            ax.scatter([p["C"] for p in pts], [p["loss"] for p in pts], color=colour[b], s=18, zorder=3)
        if held:
            ax.scatter([p["C"] for p in held], [p["loss"] for p in held], facecolors="none", edgecolors=colour[b], s=18,
                       zorder=3)
        prof = iso.get(b)
        if prof and prof.get("ok"):
            ax.plot([b], [prof["loss_opt"]], marker="*", ms=13, color=colour[b], mec="black", zorder=4)
    allc = [p["C"] for p in points + heldout]
    if allc and all(math.isfinite(v) for v in params) and params[3] > 0 and params[4] > 0:
        cs = np.logspace(math.log10(min(allc)) - 0.3, math.log10(max(allc)) + 0.7, 120)
        ax.plot(cs, [frontier(params, c)[0] for c in cs], color="black", label="fitted frontier L(N_opt(C), D_opt(C))")
        samples = [s for s in law.get("bootstrap_samples", []) if s[3] > 0 and s[4] > 0]
        if len(samples) >= 20:
            curves = np.array([[frontier(s, c)[0] for c in cs] for s in samples])
            conf = law.get("fit", {}).get("confidence", 0.95)
            lo, hi = np.nanpercentile(curves, [50 * (1 - conf), 100 - 50 * (1 - conf)], axis=0)
            ax.fill_between(cs, lo, hi, color="grey", alpha=0.3, label=f"{100 * conf:.0f}% bootstrap band")
        ax.axhline(params[0], color="grey", ls=":", lw=1, label=f"E = {params[0]:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("C = 6 N D (FLOPs)")
    ax.set_ylabel(law.get("loss", "loss"))
    ax.set_title("loss against compute")
    ax.legend(fontsize=8)

    ax = axes[2]
    for b in budgets:
        pts = [p for p in points if p["budget"] == b and p.get("residual") is not None]
        held = [p for p in heldout if p["budget"] == b and p.get("residual") is not None]
        if pts:
            ax.scatter([p["N"] for p in pts], [p["residual"] for p in pts], color=colour[b], label=f"C = {b:.3g}")
        if held:
            ax.scatter([p["N"] for p in held], [p["residual"] for p in held], facecolors="none", edgecolors=colour[b])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("N")
    ax.set_ylabel("log L - log L^ (fitted)")
    ax.set_title("residuals of the parametric law")
    ax.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=DPI, format="png")
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
