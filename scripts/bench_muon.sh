#!/usr/bin/env bash
# Muon against AdamW, measured (docs/benchmarks.md, "Muon"):
#   sweep     -- inputs/quickstart.deck's model on tinyshakespeare (byte tokens, 16 samples of 128
#                a step), 300 steps, train.lr over a short grid for each optimizer (lr_min =
#                lr / 10, the quickstart's other keys), one thread: the validation loss every 50 steps.
#                Writes docs/muon/sweep.csv (optimizer, lr, step, eval_loss), curves.csv (every
#                step's training loss of each run) and, with a python that has matplotlib,
#                docs/muon/muon_vs_adamw.png and sweep_summary.json (scripts/plot_muon.py; the
#                figure names the CPU from docs/muon/sweep_lscpu.txt, `lscpu | head -20`).
#   overhead  -- inputs/bench_medium.deck, AdamW and Muon, on 1 rank (2 threads) and 2 ranks
#                (dp, 1 thread each), interleaved, REPEATS times; each run's median step time and
#                optimizer time (/timing/optimizer) of steps 3-6. Writes docs/muon/overhead.csv
#                (every run), overhead.json (the medians and the overhead) and overhead_lscpu.txt.
#   usage: scripts/bench_muon.sh [sweep|overhead|all]   (REPEATS=3, LRS="...", STEPS=300)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUINTET=${QUINTET:-build/quintet}
PY=${QUINTET_PYTHON:-/usr/bin/python3}
WHAT=${1:-all}
mkdir -p docs/muon data
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
CORPUS=${BENCH_CORPUS:-../shared/data/tinyshakespeare.txt}
[[ -f data/bench_byte.h5 ]] || "$QUINTET" prepare --input "$CORPUS" --tokenizer byte --output data/bench_byte.h5 >&2

metric() {  # run_dir dataset -> one value per line
    "$PY" - "$1" "$2" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1] + "/metrics.h5", "r") as f:
    for v in f[sys.argv[2]][()]:
        print(repr(float(v)))
PY
}

if [[ $WHAT == sweep || $WHAT == all ]]; then
    LRS=${LRS:-"0.001 0.002 0.004 0.008 0.016 0.032"}
    STEPS=${STEPS:-300}
    lscpu | head -20 > docs/muon/sweep_lscpu.txt
    echo "optimizer,lr,step,eval_loss" > docs/muon/sweep.csv
    echo "optimizer,lr,step,train_loss" > docs/muon/curves.csv
    for lr in $LRS; do
        for opt in adamw muon; do  # interleaved: the host's load falls on both alike
            run="runs/muon_sweep/${opt}_$lr"
            rm -rf "$run"
            mkdir -p runs/muon_sweep
            lr_min=$("$PY" -c "print($lr / 10)")
            echo "== $opt lr $lr" >&2
            "$QUINTET" train inputs/quickstart.deck --data.path=data/bench_byte.h5 --data.micro_batch_size=16 \
                --train.optimizer="$opt" --train.lr="$lr" --train.lr_min="$lr_min" --train.steps="$STEPS" \
                --train.threads=1 --eval.every=50 --eval.batches=16 --checkpoint.every=0 --checkpoint.keep=1 \
                --output.run_dir="$run" --output.log_every=100 > "$run.log" 2>&1 || { tail -n 20 "$run.log" >&2; exit 1; }
            paste -d, <(metric "$run" /eval/step) <(metric "$run" /eval/loss) |
                sed "s/^/$opt,$lr,/" >> docs/muon/sweep.csv
            paste -d, <(metric "$run" /train/step) <(metric "$run" /train/loss) |
                sed "s/^/$opt,$lr,/" >> docs/muon/curves.csv
        done
    done
    "$PY" scripts/plot_muon.py docs/muon/sweep.csv docs/muon/curves.csv --lscpu docs/muon/sweep_lscpu.txt \
        -o docs/muon/muon_vs_adamw.png --summary docs/muon/sweep_summary.json
fi

if [[ $WHAT == overhead || $WHAT == all ]]; then
    [[ -f data/bench_bpe8192.h5 ]] ||
        "$QUINTET" prepare --input "$CORPUS" --tokenizer bpe --vocab-size 8192 --output data/bench_bpe8192.h5 >&2
    REPEATS=${REPEATS:-3}
    lscpu | head -20 > docs/muon/overhead_lscpu.txt
    echo "optimizer,ranks,rep,median_step_s,median_optimizer_s" > docs/muon/overhead.csv
    med() {  # run_dir group column: median of steps 3..6 (the first two warm up)
        "$QUINTET" metrics "$1" --csv --group "$2" | "$PY" -c "
import csv, statistics, sys
rows = [r for r in csv.DictReader(sys.stdin) if int(r['step']) >= 3]
print(statistics.median(float(r['$3']) for r in rows))"
    }
    for rep in $(seq "$REPEATS"); do
        for ranks in 1 2; do
            threads=$((2 / ranks))
            for opt in adamw muon; do  # side by side, interleaved: the host's load falls on both alike
                run="runs/muon_overhead/${opt}_r${ranks}_$rep"
                rm -rf "$run"
                mkdir -p runs/muon_overhead
                mpirun --oversubscribe --bind-to none -n "$ranks" -x OMP_NUM_THREADS="$threads" "$QUINTET" train \
                    inputs/bench_medium.deck --train.optimizer="$opt" --train.threads="$threads" \
                    --checkpoint.resume=none --output.run_dir="$run" > "$run.log" 2>&1 || { tail -n 20 "$run.log" >&2; exit 1; }
                line="$opt,$ranks,$rep,$(med "$run" train step_time_s),$(med "$run" timing optimizer)"
                echo "$line" >&2
                echo "$line" >> docs/muon/overhead.csv
            done
        done
    done
    "$PY" - docs/muon/overhead.csv docs/muon/overhead_lscpu.txt > docs/muon/overhead.json <<'PY'
import csv, json, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
out = {"deck": "inputs/bench_medium.deck", "steps_timed": "3-6 (median per run), median over repeats",
       "lscpu_model": next((l.split(":", 1)[1].strip() for l in open(sys.argv[2]) if l.startswith("Model name")), ""),
       "by_ranks": {}}
for ranks in sorted({r["ranks"] for r in rows}):
    m = {}
    for opt in ("adamw", "muon"):
        rs = [r for r in rows if r["ranks"] == ranks and r["optimizer"] == opt]
        m[opt] = {"step_s": statistics.median(float(r["median_step_s"]) for r in rs),
                  "optimizer_s": statistics.median(float(r["median_optimizer_s"]) for r in rs), "runs": len(rs)}
    m["step_overhead"] = m["muon"]["step_s"] / m["adamw"]["step_s"] - 1
    m["muon_optimizer_share_of_step"] = m["muon"]["optimizer_s"] / m["muon"]["step_s"]
    out["by_ranks"][ranks] = m
print(json.dumps(out, indent=1))
PY
    cat docs/muon/overhead.json
fi
