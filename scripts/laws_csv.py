#!/usr/bin/env python3
"""The runs of a [laws] study as CSV: one row per run of study.h5 (docs/scaling-laws.md).

usage: laws_csv.py STUDY_DIR|study.h5 [OUT.csv]   (default: stdout)

Columns: run, status, budget, N (as the study counted it), D, C, loss (the final validation
loss), train_loss_smoothed, N_total, N_non_embedding, N_active, flops (quintet's exact count),
steps. `quintet laws OUT.csv` fits the same law as `quintet laws STUDY_DIR` (it reads N, D, loss,
budget, run and status and ignores the rest), so the CSV is the data a published law comes from.
"""
import csv
import os
import sys

import h5py

COLUMNS = ["run", "status", "budget", "N", "D", "C", "loss", "train_loss_smoothed", "N_total",
           "N_non_embedding", "N_active", "flops", "steps"]


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    if os.path.isdir(path):
        path = os.path.join(path, "study.h5")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        print(f"laws_csv.py: cannot open {path}: {e}", file=sys.stderr)
        return 2
    rows = []
    for name, g in f.get("runs", {}).items():
        a = g.attrs
        if "budget" not in a:
            continue
        row = {"run": name, "status": text(a.get("status", b"done"))}
        for k in COLUMNS[2:]:
            key = "val_loss" if k == "loss" else k
            if key in a:
                v = a[key]
                row[k] = int(v) if k == "steps" else repr(float(v))
        rows.append(row)
    if not rows:
        print(f"laws_csv.py: {path} holds no [laws] runs", file=sys.stderr)
        return 2
    rows.sort(key=lambda r: (float(r.get("budget", 0)), float(r.get("N", 0))))
    out = open(sys.argv[2], "w", newline="") if len(sys.argv) == 3 else sys.stdout
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
