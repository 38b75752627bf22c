#!/usr/bin/env bash
# MLA on this machine, side by side in one run (interleaved rounds, medians), inputs/bench_mla.deck:
#   1. context parallelism, seq_len 2048, cp = 2 on 2 ranks x 1 thread: parallel.cp_mla_kv =
#      ring against latent -- tokens/s, bytes per step, the share of the step waiting on cp
#      communication, activations per rank;
#   2. generation: `quintet generate` greedy decode tokens/s with the compressed latent cache
#      against the full per-head K|V cache, and the cache bytes per token, from a step-0
#      checkpoint of the deck (1 thread).
# (Training throughput against PyTorch: BENCH_DECKS=mla scripts/bench.sh.)
# Environment: REPEATS (3), STEPS (4), DECODE_TOKENS (400). Output: tables on stdout, raw in runs/bench_mla/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
REPEATS=${REPEATS:-3}; STEPS=${STEPS:-4}; DECODE_TOKENS=${DECODE_TOKENS:-400}
Q=build/quintet; OUT=runs/bench_mla; mkdir -p "$OUT"
[ -f data/bench_bpe8192.h5 ] || { echo "bench_mla: data/bench_bpe8192.h5 missing: run scripts/bench.sh once" >&2; exit 1; }
common="inputs/bench_mla.deck --data.seq_len=2048 --data.micro_batch_size=2 --train.steps=$STEPS --checkpoint.resume=none --train.peak_tflops=1"
: > "$OUT/raw.tsv"
cprun() {  # name overrides...
  local name=$1; shift
  rm -rf "$OUT/$name"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 mpirun --oversubscribe -x OMP_NUM_THREADS -n 2 $Q train $common --parallel.cp=2 \
    --output.run_dir="$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  /usr/bin/python3 - "$OUT" "$name" <<'PY' >> "$OUT/raw.tsv"
import sys, re, h5py, numpy as np
out, name = sys.argv[1], sys.argv[2]
with h5py.File(f"{out}/{name}/metrics.h5", "r") as f:
    tps = np.median(f["/train/tokens_per_s"][1:])
    st = f["/train/step_time_s"][1:]
    exp = np.median(f["/timing/cp_exposed"][1:] / st)
    mib = np.median(f["/timing/cp_bytes"][1:]) / 2**20
act = re.search(r"activations: ([0-9.]+) MiB per rank", open(f"{out}/{name}.log").read()).group(1)
print(f"{name}\t{tps:.1f}\t{exp:.4f}\t{mib:.1f}\t{act}")
PY
}
# A step-0 checkpoint for decoding.
rm -rf "$OUT/ck"
OMP_NUM_THREADS=1 $Q train inputs/bench_mla.deck --train.steps=0 --checkpoint.resume=none \
  --output.run_dir="$OUT/ck" > "$OUT/ck.log" 2>&1
CK=$OUT/ck/checkpoints/step_00000000.h5
decode() {  # name kv-cache
  OMP_NUM_THREADS=1 $Q generate --checkpoint "$CK" --prompt "The" --tokens "$DECODE_TOKENS" --temperature 0 \
    --kv-cache "$2" 2> "$OUT/$1.err" > "$OUT/$1.out"
  local tps bpt
  tps=$(grep -o '[0-9.]* tokens/s' "$OUT/$1.err" | cut -d' ' -f1)
  bpt=$(grep -o 'cache [0-9]* bytes per token' "$OUT/$1.err" | cut -d' ' -f2)
  printf '%s\t%s\t0\t0\t%s\n' "$1" "$tps" "$bpt" >> "$OUT/raw.tsv"
}
for ((r = 1; r <= REPEATS; r++)); do
  echo "== round $r/$REPEATS" >&2
  cprun cp2_ring --parallel.cp_mla_kv=ring
  cprun cp2_latent --parallel.cp_mla_kv=latent
  decode decode_latent compact
  decode decode_full full
done
cmp -s "$OUT/decode_latent.out" "$OUT/decode_full.out" && same=yes || same=no
/usr/bin/python3 - "$OUT/raw.tsv" "$same" <<'PY'
import sys, statistics
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    n, *v = line.split()
    rows[n].append([float(x) for x in v])
med = {n: [statistics.median(x[i] for x in v) for i in range(4)] for n, v in rows.items()}
print("| cp = 2, seq 2048 | tok/s | waiting on cp comm / step | MiB sent per step | activations MiB/rank |")
print("|---|---|---|---|---|")
for n in ("cp2_ring", "cp2_latent"):
    t, e, b, a = med[n]
    print(f"| {n.split('_')[1]} | {t:.1f} | {e:.3f} | {b:.1f} | {a:.1f} |")
print(f"\nlatent / ring tokens/s: {med['cp2_latent'][0] / med['cp2_ring'][0]:.3f}\n")
print("| decode (greedy, 1 thread) | tokens/s | cache bytes per token |")
print("|---|---|---|")
for n in ("decode_latent", "decode_full"):
    t, _, _, b = med[n]
    print(f"| {n.split('_')[1]} | {t:.1f} | {b:.0f} |")
print(f"\nlatent / full decode tokens/s: {med['decode_latent'][0] / med['decode_full'][0]:.3f}; same tokens: {sys.argv[2]}")
PY
