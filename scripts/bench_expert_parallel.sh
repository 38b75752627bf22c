#!/usr/bin/env bash
# Expert parallelism on inputs/bench_moe.deck (8 experts, top-2, one shared; 8 x 512 tokens per
# step), the same global batch in every run:
#   ep1_1x2   one rank x 2 threads (micro_batch_size 8)
#   ep1_dp2   dp=2, ep=1: 2 ranks x 1 thread, micro_batch_size 4 (every rank holds all experts)
#   ep2_dp2   dp=2, ep=2: 2 ranks x 1 thread, each rank holds 4 experts
# Printed per run: tokens/s, seconds in the exchange (dispatch incl. counts, combine), all ranks'
# exchange bytes per step against the theory from the routed counts (docs/math.md §9: 4 crossings
# of d_model fp32 values per row routed to another rank) and against the balanced estimate
# 16 C L m R (ep-1)/ep, the worst layer's imbalance, activation MiB per rank, and whether the
# curves agree (ep2 vs ep1 at the same dp: loss to 1e-5).
# Usage: scripts/bench_expert_parallel.sh   (after scripts/bench.sh made data/bench_bpe8192.h5)
# Environment: BENCH_EP_STEPS (4), PYTHON.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUINTET=build/quintet
OUT=runs/bench_results
STEPS=${BENCH_EP_STEPS:-4}
PY=${PYTHON:-/usr/bin/python3}
case "${1:-}" in -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
mkdir -p "$OUT"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
[[ -f data/bench_bpe8192.h5 ]] || { echo "bench_expert_parallel.sh: run scripts/bench.sh first (data/bench_bpe8192.h5)" >&2; exit 1; }

run() {  # name ranks threads overrides...
    local name=$1 ranks=$2 threads=$3
    shift 3
    rm -rf "runs/ep_$name"
    echo "== $name: $ranks rank(s) x $threads thread(s): $*" >&2
    mpirun --oversubscribe --bind-to none -n "$ranks" -x OMP_NUM_THREADS="$threads" "$QUINTET" train inputs/bench_moe.deck \
        --output.run_dir="runs/ep_$name" --checkpoint.resume=none --checkpoint.every=0 \
        --train.steps="$STEPS" --train.warmup=1 --train.threads="$threads" "$@" < /dev/null > "$OUT/ep_$name.log" 2>&1 ||
        { tail -n 20 "$OUT/ep_$name.log" >&2; exit 1; }
}

run ep1_1x2 1 2
run ep1_dp2 2 1 --data.micro_batch_size=4
run ep2_dp2 2 1 --data.micro_batch_size=4 --parallel.ep=2

"$PY" - "$STEPS" <<'EOF' | tee "$OUT/expert_parallel.txt"
import sys, h5py, numpy as np
steps = int(sys.argv[1])
def col(run, path):
    with h5py.File(f"runs/ep_{run}/metrics.h5", "r") as f:
        return np.asarray(f[path][()], dtype=float) if path in f else None
def med(run, path):
    v = col(run, path)
    if v is None:
        return float("nan")
    return float(np.median(v[1:] if len(v) > 1 else v))
C, L, k = 512, 8, 2
print(f"# bench_moe deck (E=8, top-2, 1 shared, 8 x 512 tokens per step), {steps} steps, medians after the first")
print(f"{'run':9s} {'tok/s':>7s} {'dispatch s':>10s} {'combine s':>9s} {'MiB/step':>9s} {'theory MiB':>10s} "
      f"{'=':>2s} {'balanced MiB':>12s} {'imbalance':>9s} {'act MiB':>8s}")
for run, ep, R in [("ep1_1x2", 1, 8 * 512 * k), ("ep1_dp2", 1, 4 * 512 * k), ("ep2_dp2", 2, 4 * 512 * k)]:
    tps = med(run, "/train/tokens_per_s")
    imb = np.max(col(run, "/moe/imbalance"), axis=(1, 2))
    act = med(run, "/pipeline/stage0_activation_mib")
    if ep > 1:
        b, t = col(run, "/timing/ep_bytes_all"), col(run, "/timing/ep_bytes_theory")
        eq = "==" if np.array_equal(b, t) else "!="
        ranks = 2
        balanced = ranks * 16 * C * L * 1 * R * (ep - 1) / ep / 2**20
        print(f"{run:9s} {tps:7.0f} {med(run, '/timing/ep_dispatch'):10.3f} {med(run, '/timing/ep_combine'):9.3f} "
              f"{np.median(b) / 2**20:9.1f} {np.median(t) / 2**20:10.1f} {eq:>2s} {balanced:12.1f} "
              f"{np.median(imb):9.2f} {act:8.1f}")
    else:
        print(f"{run:9s} {tps:7.0f} {'':>10s} {'':>9s} {'':>9s} {'':>10s} {'':>2s} {'':>12s} {np.median(imb):9.2f} {act:8.1f}")
a, b = col("ep1_dp2", "/train/loss"), col("ep2_dp2", "/train/loss")
print(f"ep2 vs ep1 at dp2: max relative loss difference {np.max(np.abs(a - b) / a):.2e} over {len(a)} steps")
EOF
