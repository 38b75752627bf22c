#!/usr/bin/env bash
# Long-context throughput on this machine, side by side in one run (interleaved rounds,
# medians), medium's shape (inputs/bench_medium.deck) at seq_len 2048, 4096 tokens per step:
#   - cp = 2 on 2 ranks x 1 thread against cp = 1 on 1 rank x 2 threads: tokens/s, the share
#     of the step spent waiting on the ring (/timing/cp_exposed), activation memory per rank;
#   - train.recompute = none | selective | full on 1 rank x 2 threads: tokens/s and activations.
# Environment: REPEATS (3), STEPS (4). Output: the tables on stdout, raw logs in runs/bench_lc/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
REPEATS=${REPEATS:-3}; STEPS=${STEPS:-4}
Q=build/quintet; OUT=runs/bench_lc; mkdir -p "$OUT"
[ -f data/bench_bpe8192.h5 ] || { echo "bench_long_context: data/bench_bpe8192.h5 missing: run scripts/bench.sh once" >&2; exit 1; }
common="inputs/bench_medium.deck --data.seq_len=2048 --data.micro_batch_size=2 --train.steps=$STEPS --checkpoint.resume=none --train.peak_tflops=1"
: > "$OUT/raw.tsv"
run() {  # name ranks threads overrides...
  local name=$1 ranks=$2 threads=$3; shift 3
  rm -rf "$OUT/$name"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=$threads mpirun --oversubscribe -x OMP_NUM_THREADS -n "$ranks" $Q train $common \
    --output.run_dir="$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  /usr/bin/python3 - "$OUT" "$name" <<'PY' >> "$OUT/raw.tsv"
import sys, re, h5py, numpy as np
out, name = sys.argv[1], sys.argv[2]
with h5py.File(f"{out}/{name}/metrics.h5", "r") as f:
    tps = np.median(f["/train/tokens_per_s"][1:])
    st = f["/train/step_time_s"][1:]
    exp = f["/timing/cp_exposed"][1:] if "/timing/cp_exposed" in f else np.zeros_like(st)
    comm = f["/timing/cp_comm"][1:] if "/timing/cp_comm" in f else np.zeros_like(st)
act = re.search(r"activations: ([0-9.]+) MiB per rank", open(f"{out}/{name}.log").read()).group(1)
print(f"{name}\t{tps:.1f}\t{np.median(exp / st):.4f}\t{np.median(comm / st):.4f}\t{act}")
PY
}
for ((r = 1; r <= REPEATS; r++)); do
  echo "== round $r/$REPEATS" >&2
  run cp1_2threads 1 2
  run cp2_1thread 2 1 --parallel.cp=2
  run recompute_none 1 2 --train.recompute=none
  run recompute_selective 1 2 --train.recompute=selective
  run recompute_full 1 2 --train.recompute=full
done
/usr/bin/python3 - "$OUT/raw.tsv" <<'PY'
import sys, statistics
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    n, tps, exp, comm, act = line.split()
    rows[n].append((float(tps), float(exp), float(comm), float(act)))
med = {n: [statistics.median(x[i] for x in v) for i in range(4)] for n, v in rows.items()}
print("| run | tok/s | ring wait (exposed) / step | ring transfer time / step | activations MiB/rank |")
print("|---|---|---|---|---|")
for n in ("cp1_2threads", "cp2_1thread"):
    t, e, c, a = med[n]
    print(f"| {n} | {t:.1f} | {e:.3f} | {c:.3f} | {a:.1f} |")
print(f"\ncp2 / cp1 tokens/s: {med['cp2_1thread'][0] / med['cp1_2threads'][0]:.3f}\n")
print("| train.recompute | tok/s | activations MiB |")
print("|---|---|---|")
for n in ("recompute_none", "recompute_selective", "recompute_full"):
    t, e, c, a = med[n]
    print(f"| {n.split('_')[1]} | {t:.1f} | {a:.1f} |")
PY
