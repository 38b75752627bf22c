#!/usr/bin/env bash
# Tensor- and pipeline-parallel measurements on the `medium` deck (scripts/bench.sh runs it
# after the single-process comparison; it can also run alone).
#   TP: tp=1 (1 rank x 2 threads) vs tp=2 (2 ranks x 1 thread), without and with sequence
#       parallelism: tokens/s, and bytes sent per rank per step by TP collectives against the
#       per-layer theory 4*b*T*d*(tp-1)/tp elements per layer per pass.
#   PP: pp=2 with 1f1b, gpipe and interleaved (v=2), and pp=4 with 1f1b, m=8 microbatches of
#       1 sample: each stage's measured idle fraction against (p-1)/(m+p-1) (/v interleaved),
#       and peak activation memory per stage.
# Output: a table on stdout and under runs/bench_results/parallel.txt. On a 2-core machine,
# pp=4 oversubscribes the cores 2:1, so its idle fractions include time-slicing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUINTET=build/quintet
OUT=runs/bench_results
STEPS=${BENCH_PARALLEL_STEPS:-4}
PY=${PYTHON:-/usr/bin/python3}
mkdir -p "$OUT"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
[[ -f data/bench_bpe8192.h5 ]] || { echo "bench_parallel.sh: run scripts/bench.sh first (data/bench_bpe8192.h5)" >&2; exit 1; }

run() {  # name ranks threads overrides...
    local name=$1 ranks=$2 threads=$3
    shift 3
    rm -rf "runs/par_$name"
    echo "== $name: $ranks rank(s) x $threads thread(s): $*" >&2
    # --bind-to none: Open MPI pins a lone rank to one core, which would serialise its threads.
    mpirun --oversubscribe --bind-to none -n "$ranks" -x OMP_NUM_THREADS="$threads" "$QUINTET" train inputs/bench_medium.deck \
        --output.run_dir="runs/par_$name" --checkpoint.resume=none --checkpoint.every=0 \
        --train.steps="$STEPS" --train.warmup=1 --train.threads="$threads" "$@" > "$OUT/par_$name.log" 2>&1 ||
        { tail -n 20 "$OUT/par_$name.log" >&2; exit 1; }
}

run tp1 1 2
run tp2 2 1 --parallel.tp=2
run tp2sp 2 1 --parallel.tp=2 --parallel.sequence_parallel=true
PPARGS=(--data.micro_batch_size=1 --parallel.microbatches=8)
run pp1 1 2 "${PPARGS[@]}"
run pp2_1f1b 2 1 --parallel.pp=2 "${PPARGS[@]}"
run pp2_gpipe 2 1 --parallel.pp=2 --parallel.schedule=gpipe "${PPARGS[@]}"
run pp2_interleaved 2 1 --parallel.pp=2 --parallel.schedule=interleaved --parallel.virtual_stages=2 "${PPARGS[@]}"
run pp4_1f1b 4 1 --parallel.pp=4 "${PPARGS[@]}"

"$PY" - "$STEPS" <<'EOF' | tee "$OUT/parallel.txt"
import sys, h5py, numpy as np
steps = int(sys.argv[1])
def col(run, path):
    with h5py.File(f"runs/par_{run}/metrics.h5", "r") as f:
        return np.asarray(f[path][()], dtype=float) if path in f else None
def med(run, path):
    v = col(run, path)
    return float(np.median(v[1:] if len(v) > 1 else v))
# medium: b=8, T=512, d=512, L=8
b, T, d, L = 8, 512, 512, 8
print(f"# medium deck, {steps} steps, medians after the first step")
print("\n## Tensor parallelism (one microbatch of 8 x 512 tokens per step)")
print(f"{'run':8s} {'tok/s':>9s} {'vs tp1':>7s} {'TP MiB/step':>12s} {'theory layers':>14s} {'ratio':>6s} {'TP comm s':>10s} {'act MiB':>8s}")
base = med("tp1", "/train/tokens_per_s")
for run, tp in [("tp1", 1), ("tp2", 2), ("tp2sp", 2)]:
    tps = med(run, "/train/tokens_per_s")
    mib = med(run, "/timing/tp_bytes") / 2**20
    theory = 4 * b * T * d * (tp - 1) / tp * 4 * L * 2 / 2**20  # elements*4 bytes, L layers, fwd+bwd
    ratio = mib / theory if theory else float("nan")
    act = med(run, "/pipeline/stage0_activation_mib")
    print(f"{run:8s} {tps:9.0f} {tps / base:7.2f} {mib:12.1f} {theory:14.1f} {ratio:6.3f} {med(run, '/timing/tp_comm'):10.3f} {act:8.1f}")
print("(theory counts the 4 per-layer all-reduces of the blocks; the measured figure also holds the")
print(" vocab-parallel embedding and head reductions and the loss statistics)")
print("\n## Pipeline parallelism (m = 8 microbatches of 1 x 512 tokens)")
print(f"{'run':16s} {'tok/s':>8s} {'theory bubble':>14s}  per-stage idle (measured) / peak activation MiB")
theory = {"pp1": 0.0, "pp2_1f1b": 1 / 9, "pp2_gpipe": 1 / 9, "pp2_interleaved": 1 / 17, "pp4_1f1b": 3 / 11}
for run, p in [("pp1", 1), ("pp2_1f1b", 2), ("pp2_gpipe", 2), ("pp2_interleaved", 2), ("pp4_1f1b", 4)]:
    tps = med(run, "/train/tokens_per_s")
    idle = [med(run, f"/pipeline/stage{s}_idle_fraction") for s in range(p)]
    act = [med(run, f"/pipeline/stage{s}_activation_mib") for s in range(p)]
    stages = "  ".join(f"s{s}: {i:.3f}/{a:.0f}" for s, (i, a) in enumerate(zip(idle, act)))
    print(f"{run:16s} {tps:8.0f} {theory[run]:14.3f}  {stages}")
EOF
