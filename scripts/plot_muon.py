#!/usr/bin/env python3
"""Plot Muon against AdamW from scripts/bench_muon.sh's CSV files (docs/benchmarks.md, "Muon").

    plot_muon.py SWEEP.csv CURVES.csv [--lscpu LSCPU.txt] [-o FILE.png] [--summary FILE.json]

SWEEP.csv: optimizer,lr,step,eval_loss (every evaluation of every run); CURVES.csv:
optimizer,lr,step,train_loss (every step). Left panel: the final validation loss against the
learning rate, one line per optimizer. Right panel: each optimizer at its own best learning rate
(lowest final validation loss): the training loss (a 20-step moving average) and the validation
points, against the step. The figure's title names the CPU (the "Model name" line of LSCPU.txt,
`lscpu | head -20` of the host that ran the sweep). --summary writes the figure's numbers as JSON:
each run's final validation loss, each optimizer's best learning rate and its validation losses at
the evaluated steps. The last line on stdout is `wrote PATH`.
"""
import argparse
import csv
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path, value):
    runs = defaultdict(list)  # (optimizer, lr) -> [(step, value)]
    with open(path) as f:
        for row in csv.DictReader(f):
            runs[(row["optimizer"], float(row["lr"]))].append((int(float(row["step"])), float(row[value])))
    for k in runs:
        runs[k].sort()
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("curves")
    ap.add_argument("-o", default="muon_vs_adamw.png")
    ap.add_argument("--lscpu", help="lscpu output of the host that ran the sweep")
    ap.add_argument("--summary", help="write the figure's numbers here (JSON)")
    a = ap.parse_args()
    cpu = ""
    if a.lscpu:
        with open(a.lscpu) as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("Model name")), "")
    ev, tr = read(a.sweep, "eval_loss"), read(a.curves, "train_loss")
    if not ev:
        print(f"{a.sweep}: no runs", file=sys.stderr)
        return 2
    colors = {"adamw": "tab:blue", "muon": "tab:red"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    best = {}
    for opt in sorted({o for o, _ in ev}):
        lrs = sorted(lr for o, lr in ev if o == opt)
        final = [ev[(opt, lr)][-1][1] for lr in lrs]
        left.plot(lrs, final, "o-", color=colors.get(opt), label=opt)
        best[opt] = lrs[min(range(len(lrs)), key=lambda i: final[i])]
    left.set_xscale("log")
    left.set_xlabel("train.lr")
    left.set_ylabel("validation loss at the last step")
    left.set_title("learning-rate sweep")
    left.grid(alpha=0.3)
    left.legend()
    for opt, lr in best.items():
        steps = [s for s, _ in tr[(opt, lr)]]
        loss = [v for _, v in tr[(opt, lr)]]
        smooth = [sum(loss[max(0, i - 19):i + 1]) / (i + 1 - max(0, i - 19)) for i in range(len(loss))]
        right.plot(steps, smooth, color=colors.get(opt), label=f"{opt} lr {lr:g} (train, 20-step mean)")
        es = ev[(opt, lr)]
        right.plot([s for s, _ in es], [v for _, v in es], "o", color=colors.get(opt), label=f"{opt} lr {lr:g} (validation)")
    right.set_xlabel("step")
    right.set_ylabel("loss (nats per token)")
    right.set_title("each at its best learning rate")
    right.set_ylim(top=min(3.5, right.get_ylim()[1]))
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle("Muon against AdamW, inputs/quickstart.deck's model on tinyshakespeare (bytes), 300 steps"
                 + (f" -- CPU: {cpu}" if cpu else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(a.o, dpi=110)
    if a.summary:
        summary = {
            "cpu": cpu,
            "final_eval_loss": {opt: {f"{lr:g}": ev[(opt, lr)][-1][1] for o, lr in sorted(ev) if o == opt}
                                for opt in best},
            "best_lr": {opt: lr for opt, lr in best.items()},
            "at_best_lr_eval_loss_by_step": {opt: {str(s): v for s, v in ev[(opt, lr)]} for opt, lr in best.items()},
        }
        with open(a.summary, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    print(f"wrote {a.o}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
