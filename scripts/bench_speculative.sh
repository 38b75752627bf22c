#!/usr/bin/env bash
# `quintet generate --speculative mtp` against plain greedy decoding of the same checkpoint
# (docs/math.md §11). Three models of 256 channels, 6 layers, 8 heads (4 kv), vocabulary 256,
# model.mtp_depth 1, 2 and 3, each trained STEPS steps (lr 3e-3, train.mtp_weight 1) on the
# synthetic token chain of the tests (x -> 7x + 3 mod 256, a random byte in one step of five: the
# generator of tests/support/run_support.cpp's make_token_file, seed 5, 20000 tokens, written as
# bytes and made a token file by `quintet prepare --tokenizer byte`). Then greedy decoding of NEW
# tokens after the 4-token prompt "5 38 10 73", interleaved in each of REPEATS rounds: plain,
# speculative, and speculative with QUINTET_FEW_ROWS=1 (GEMMs of 2 or more rows -- the
# verifications -- take the packing blocked GEMM, as before the few-row path; one row keeps the
# matrix-vector path); medians of the new tokens' time. The continuations (--print-ids) must be
# equal, token for token, in every run: the script stops with status 1 if one is not.
# One thread: OMP_NUM_THREADS (default 1) is used for the training and every generation.
# Environment: BUILD (build), REPEATS (5), NEW (200), STEPS (150), OMP_NUM_THREADS (1).
# Output: the table on stdout, raw figures, logs and lscpu in runs/bench_speculative/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}; REPEATS=${REPEATS:-5}; NEW=${NEW:-200}; STEPS=${STEPS:-150}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
Q=$BUILD/quintet; OUT=runs/bench_speculative; PROMPT="5 38 10 73"
[ -x "$Q" ] || { echo "bench_speculative: $Q not found: build it first (cmake --build $BUILD --target quintet)" >&2; exit 2; }
rm -rf "$OUT"; mkdir -p "$OUT"
lscpu > "$OUT/lscpu.txt"
# The chain, with std::mt19937's outputs: Python's Mersenne Twister seeded as init_genrand(5)
# gives the same 32-bit words from getrandbits(32).
python3 - "$OUT/chain.bin" <<'PY'
import random, sys
seed, n, V = 5, 20000, 256
mt = [seed]
for i in range(1, 624):
    mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
g = random.Random()
g.setstate((3, tuple(mt + [624]), None))
x, out = 0, bytearray()
for _ in range(n):
    x = g.getrandbits(32) % V if g.getrandbits(32) % 5 == 0 else (x * 7 + 3) % V
    out.append(x)
open(sys.argv[1], "wb").write(out)
PY
"$Q" prepare --input "$OUT/chain.bin" --tokenizer byte --binary keep --output "$OUT/chain.h5" > "$OUT/prepare.log" 2>&1
cat > "$OUT/spec.deck" <<EOF
[model]
d_model = 256
n_layers = 6
n_heads = 8
n_kv_heads = 4
[data]
path = $OUT/chain.h5
seq_len = 64
micro_batch_size = 8
order = random
val_fraction = 0.05
[train]
steps = $STEPS
lr = 3e-3
lr_min = 3e-4
warmup = $(( STEPS < 10 ? STEPS : 10 ))
grad_clip = 1.0
seed = 11
mtp_weight = 1
[eval]
every = 0
[checkpoint]
every = 0
[output]
log_every = 50
EOF
DEPTHS="1 2 3"
for d in $DEPTHS; do
  "$Q" train "$OUT/spec.deck" --model.mtp_depth="$d" --checkpoint.resume=none --output.run_dir="$OUT/d$d" \
    > "$OUT/d$d.train.log" 2>&1 || { echo "bench_speculative: training depth $d failed:" >&2; tail -20 "$OUT/d$d.train.log" >&2; exit 1; }
done
: > "$OUT/raw.tsv"
for r in $(seq "$REPEATS"); do
  for d in $DEPTHS; do
    ck=$(printf '%s/d%s/checkpoints/step_%08d.h5' "$OUT" "$d" "$STEPS")
    for mode in plain speculative packed; do
      extra=""; [ "$mode" != plain ] && extra="--speculative mtp"
      rows=8; [ "$mode" = packed ] && rows=1
      # shellcheck disable=SC2086
      QUINTET_FEW_ROWS=$rows "$Q" generate --checkpoint "$ck" --prompt-ids "$PROMPT" --tokens "$NEW" --temperature 0 --print-ids $extra \
        > "$OUT/$mode.out" 2> "$OUT/$mode.err" || { echo "bench_speculative: generate ($mode, depth $d) failed:" >&2; cat "$OUT/$mode.err" >&2; exit 1; }
      grep "^$PROMPT " "$OUT/$mode.out" > "$OUT/$mode.ids" || { echo "bench_speculative: no --print-ids line ($mode, depth $d)" >&2; exit 1; }
      s=$(grep 'generate: prompt ' "$OUT/$mode.err" | sed -E 's/.*new tokens in ([0-9.]+) s.*/\1/')
      acc=0; dr=0; ver=0
      if [ "$mode" != plain ]; then
        line=$(grep 'generate: speculative mtp' "$OUT/$mode.err")
        ver=$(echo "$line" | sed -E 's/.*: ([0-9]+) verification forwards.*/\1/')
        dr=$(echo "$line" | sed -E 's/.*drafted ([0-9]+),.*/\1/')
        acc=$(echo "$line" | sed -E 's/.*accepted ([0-9]+),.*/\1/')
      fi
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$d" "$mode" "$s" "$acc" "$dr" "$ver" >> "$OUT/raw.tsv"
    done
    for mode in speculative packed; do
      if ! cmp -s "$OUT/plain.ids" "$OUT/$mode.ids"; then
        echo "bench_speculative: FAILED: depth $d, round $r: the $mode continuation differs from plain greedy's" >&2
        diff <(tr ' ' '\n' < "$OUT/plain.ids") <(tr ' ' '\n' < "$OUT/$mode.ids") | head -10 >&2 || true
        exit 1
      fi
    done
  done
done
python3 - "$OUT/raw.tsv" "$NEW" "$REPEATS" "$STEPS" "$OMP_NUM_THREADS" <<'PY'
import sys, statistics
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
print(f"quintet generate --temperature 0, {sys.argv[2]} new tokens after a 4-token prompt, plain against "
      f"--speculative mtp (and the same with QUINTET_FEW_ROWS=1: the verifications through the packing GEMM), {sys.argv[5]} thread(s), models trained {sys.argv[4]} steps; medians of "
      f"{sys.argv[3]} interleaved rounds (min-max in brackets); continuations equal in every run\n")
print("| depth | acceptance (accepted / drafted) | plain s | speculative s | ratio (speculative / plain) "
      "| verification forwards | speculative, packing GEMM s | ratio |")
print("|---|---|---|---|---|---|---|---|")
med = lambda xs: f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"
for d in sorted({r[1] for r in rows}, key=int):
    t = {m: [float(r[3]) for r in rows if r[1] == d and r[2] == m] for m in ("plain", "speculative", "packed")}
    s = [(int(r[4]), int(r[5]), int(r[6])) for r in rows if r[1] == d and r[2] != "plain"]
    acc, dr, ver = s[0]
    if any(x != s[0] for x in s):
        sys.exit(f"bench_speculative: depth {d}: the drafts differ between runs: {sorted(set(s))}")
    mp, ms, mk = (statistics.median(t[m]) for m in ("plain", "speculative", "packed"))
    print(f"| {d} | {acc / max(dr, 1):.3f} ({acc} / {dr}) | {med(t['plain'])} | {med(t['speculative'])} "
          f"| {ms / mp:.2f} | {ver} | {med(t['packed'])} | {mk / mp:.2f} |")
PY
echo
grep -E '^(Model name|CPU family|Model|Thread\(s\) per core|Hypervisor vendor):' "$OUT/lscpu.txt" | sed -E 's/  +/ /g'
grep -qw avx512f "$OUT/lscpu.txt" && echo "Flags: avx512f present" || echo "Flags: no avx512f"
