#!/usr/bin/env python3
"""Draw a merged quintet timeline (`quintet trace RUN_DIR` -> trace.json) as a PNG.

    plot_trace.py TRACE.json [-o FILE.png] [--step N] [--lanes compute,pp,tp,...]

One block of lanes per rank (the trace's processes, in rank order, titled with their names:
rank, host, grid coordinates), one lane per activity (the trace's threads: compute, then each
axis's communication, data, checkpoint; the step lane shows the phases). Each event is a bar
from its start to its end on a common time axis (milliseconds from the first event shown);
compute bars are coloured by kind (forward, backward, backward B / W, optimizer, recompute)
and labelled with their microbatch where they are wide enough; waits are grey. Only the
outermost events of a lane are drawn (the profile's operations nested inside a forward are
left to an interactive viewer). --step N draws that traced step alone.

This is a static picture of the same data Perfetto (ui.perfetto.dev) or chrome://tracing show
interactively. Output: -o FILE, else TRACE.png beside the input; the last line on stdout is
`wrote PATH`. An unreadable trace: exit status 2, naming the file.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "backward B": "#C44E52", "backward W": "#8172B3",
          "optimizer": "#55A868", "recompute": "#937860"}
STEP_COLORS = {"step": "#E5E5E5", "pipeline": "#CFE0F1", "gradient sync": "#F6D8BE", "loss": "#D6D6D6",
               "optimizer": "#CDE8D4", "evaluation": "#EDE3C7"}
WAIT_COLOR = "#9A9A9A"
DEFAULT_LANES = ["step", "compute", "data", "tp", "cp", "ep", "pp", "dp", "zero", "world", "checkpoint"]


def outermost(events):
    """The events not nested in an earlier one (events sorted by start)."""
    out, end = [], -1.0
    for e in events:
        if e["ts"] >= end - 1e-6:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def load(path):
    try:
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit2(f"{path}: not a Trace Event file ({e})")
    procs, threads, spans = {}, {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e.get("ph") == "X":
            spans.setdefault((e["pid"], e["tid"]), []).append(e)
    return procs, threads, spans


class SystemExit2(Exception):
    pass


def draw(path, out, step=None, lanes=None):
    procs, threads, spans = load(path)
    lanes = lanes or DEFAULT_LANES
    window = None
    if step is not None:  # the step events of that step, over every rank
        starts = [e["ts"] for (pid, tid), ev in spans.items() for e in ev
                  if threads.get((pid, tid)) == "step" and e["name"] == "step" and e["args"].get("step") == step]
        ends = [e["ts"] + e["dur"] for (pid, tid), ev in spans.items() for e in ev
                if threads.get((pid, tid)) == "step" and e["name"] == "step" and e["args"].get("step") == step]
        if not starts:
            raise SystemExit2(f"{path}: step {step} is not in the trace")
        window = (min(starts), max(ends))
    rows = []  # (pid, lane name, events)
    for pid in sorted(procs):
        for lane in lanes:
            tids = [tid for (p, tid), name in threads.items() if p == pid and name == lane]
            if not tids:
                continue
            ev = sorted(spans.get((pid, tids[0]), []), key=lambda e: e["ts"])
            if window:
                ev = [e for e in ev if e["ts"] + e["dur"] > window[0] and e["ts"] < window[1]]
            if ev:
                rows.append((pid, lane, outermost(ev)))
    if not rows:
        raise SystemExit2(f"{path}: no events to draw")
    t0 = window[0] if window else min(e["ts"] for _, _, ev in rows for e in ev)
    t1 = window[1] if window else max(e["ts"] + e["dur"] for _, _, ev in rows for e in ev)
    fig, ax = plt.subplots(figsize=(14, 0.32 * len(rows) + 1.6))
    labels = []
    for i, (pid, lane, ev) in enumerate(rows):
        y = len(rows) - 1 - i
        for e in ev:
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            if lane == "compute":
                color = COLORS.get(e["name"], "#64B5CD")
            elif lane == "step":
                color = STEP_COLORS.get(e["name"], "#E5E5E5")
            else:
                color = WAIT_COLOR
            ax.barh(y, w, left=x, height=0.8, color=color, edgecolor="none")
            mb = e.get("args", {}).get("mb")
            if lane == "compute" and mb is not None and w > (t1 - t0) / 1e3 / 90:
                ax.text(x + w / 2, y, str(mb), ha="center", va="center", fontsize=6, color="white")
        labels.append(lane)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels[::-1], fontsize=7)
    # The rank blocks: a line between them and the process name on the left.
    prev = None
    for i, (pid, _, _) in enumerate(rows):
        if pid != prev:
            y = len(rows) - 1 - i
            if prev is not None:
                ax.axhline(y + 0.5, color="black", linewidth=0.6)
            ax.text(-0.005, y + 0.45, procs[pid], transform=ax.get_yaxis_transform(), ha="right", va="bottom",
                    fontsize=8, fontweight="bold")
            prev = pid
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("milliseconds" + (f" (step {step})" if step is not None else ""))
    ax.grid(True, axis="x", alpha=0.3)
    legend = [Patch(color=c, label=n) for n, c in COLORS.items()] + [Patch(color=WAIT_COLOR, label="wait")]
    ax.legend(handles=legend, ncol=len(legend), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 1.0 + 1.2 / fig.get_figheight() / 2),
              frameon=False)
    fig.tight_layout()
    fig.subplots_adjust(left=0.22)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description="Draw a merged quintet timeline (quintet trace) as a PNG.")
    p.add_argument("trace", metavar="TRACE.json")
    p.add_argument("-o", "--output", metavar="FILE.png")
    p.add_argument("--step", type=int, help="draw this traced step only")
    p.add_argument("--lanes", help="comma list of activities to draw, in order (default: all)")
    args = p.parse_args(argv)
    out = args.output or os.path.splitext(args.trace)[0] + ".png"
    try:
        draw(args.trace, out, args.step, args.lanes.split(",") if args.lanes else None)
    except SystemExit2 as e:
        print(f"plot_trace.py: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
