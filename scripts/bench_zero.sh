#!/usr/bin/env bash
# ZeRO levels and pipeline schedules, measured (docs/benchmarks.md, "ZeRO-2/3" and "The
# zero-bubble schedules at pp 4"):
#   memory: per-rank bytes by category at parallel.zero = 0, 1, 2, 3 for dp 2, 4, 8, the
#           planner's prediction beside the trainer's own accounting (the largest rank);
#   zero cost: tokens/s of zero 3 against zero 1 at dp 2, parallel.overlap_dp on and off;
#   pipeline: 1f1b, interleaved (v = 2), zb_h1 and zbv at pp 4 with 8 microbatches: the
#           bubble in theory, each stage's measured idle fraction, tokens/s.
# The model is bench_small's shapes with 8 layers (so a layer, the unit ZeRO-3 gathers, is a
# small part of the whole), shorter samples so 8 ranks fit on a small host. Output: the lines
# the trainer prints at the end of each run, collected under runs/bench_results/zero.txt.
# On a host with fewer cores than ranks the timings include time-slicing; the bytes do not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUINTET=${QUINTET:-build/quintet}
OUT=runs/bench_results
mkdir -p "$OUT"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
[[ -f data/quickstart.txt ]] || bash scripts/make_corpus.sh data/quickstart.txt >/dev/null
[[ -f data/bench_byte.h5 ]] || "$QUINTET" prepare --input data/quickstart.txt --tokenizer byte --output data/bench_byte.h5 >&2
REPORT="$OUT/zero.txt"
: > "$REPORT"

run() {  # name ranks steps overrides...
    local name=$1 ranks=$2 steps=$3
    shift 3
    rm -rf "runs/zero_$name"
    echo "== $name: $ranks rank(s): $*" >&2
    mpirun --oversubscribe --bind-to none -n "$ranks" -x OMP_NUM_THREADS=1 "$QUINTET" train inputs/bench_small.deck \
        --model.n_layers=8 --data.seq_len=128 --data.micro_batch_size=4 \
        --output.run_dir="runs/zero_$name" --checkpoint.resume=none --checkpoint.every=0 \
        --train.steps="$steps" --train.warmup=1 --train.threads=1 "$@" > "$OUT/zero_$name.log" 2>&1 ||
        { tail -n 20 "$OUT/zero_$name.log" >&2; exit 1; }
    { echo "== $name ($ranks ranks: $*)"; grep -E "predicted|pipeline \(|stage [0-9]+: measured" "$OUT/zero_$name.log"; } >> "$REPORT"
}

for dp in 2 4 8; do
    for z in 0 1 2 3; do
        run "mem_dp${dp}_z$z" "$dp" 2 --parallel.zero="$z"
    done
done
for z in 1 3; do
    for ov in true false; do
        run "tps_dp2_z${z}_ov$ov" 2 8 --parallel.zero="$z" --parallel.overlap_dp="$ov"
    done
done
PP=(--parallel.pp=4 --parallel.microbatches=8 --data.micro_batch_size=1)
run pp4_1f1b 4 6 "${PP[@]}"
run pp4_interleaved 4 6 "${PP[@]}" --parallel.schedule=interleaved --parallel.virtual_stages=2
run pp4_zb_h1 4 6 "${PP[@]}" --parallel.schedule=zb_h1
run pp4_zbv 4 6 "${PP[@]}" --parallel.schedule=zbv --parallel.virtual_stages=2
cat "$REPORT"
