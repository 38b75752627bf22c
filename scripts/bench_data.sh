#!/usr/bin/env bash
# Data pipeline benchmarks (docs/benchmarks.md, "Data pipeline"):
#  1. quintet prepare on 1 GiB of text in 16 files (bpe trained on the first 8 MB): MB/s and
#     peak RSS on 1 rank x 2 threads and 2 ranks x 1 thread;
#  2. training the quickstart model on a 4 MiB and a 4 GiB token file (2 ranks): peak RSS per
#     rank and median tokens/s; with BASE=path/to/an/older/quintet also that binary's in-memory
#     path on the 4 MiB file.
# Usage: bash scripts/bench_data.sh TEXT [WORKDIR]   (TEXT: any plain text, repeated to size)
# Needs about 12 GiB free in WORKDIR (default /tmp/quintet-bench-data), deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
TEXT=${1:?usage: bench_data.sh TEXT [WORKDIR]}
W=${2:-/tmp/quintet-bench-data}
Q=${QUINTET:-$PWD/build/quintet}
MPI="mpirun --oversubscribe --allow-run-as-root --bind-to none"
STEPS=${STEPS:-40}
mkdir -p "$W"
trap 'rm -rf "$W"' EXIT
lscpu | grep "Model name" || true
repeat_to() {  # repeat_to BYTES OUT
    local n=$1 out=$2
    : > "$out.part"
    while [ "$(stat -c %s "$out.part")" -lt "$n" ]; do cat "$TEXT" >> "$out.part"; done
    head -c "$n" "$out.part" > "$out" && rm "$out.part"
}
peak_rss() { grep "Maximum resident set size" "$1" | awk '{printf "%.0f MiB", $6 / 1024}'; }

echo "== prepare: 1 GiB of text in 16 files, bpe 4096 trained on 8 MB =="
repeat_to $((1 << 30)) "$W/text_1g.txt"
mkdir -p "$W/text_1g" && split -b 64M -d "$W/text_1g.txt" "$W/text_1g/part_" && rm "$W/text_1g.txt"
for ranks in 1 2; do
    rm -rf "$W/prep$ranks"
    /usr/bin/time -v $MPI -n $ranks -x OMP_NUM_THREADS=$((2 / ranks)) "$Q" prepare --input "$W/text_1g" \
        --tokenizer bpe --vocab-size 4096 --train-sample 8000000 --shard-tokens 100000000 \
        --output "$W/prep$ranks" > "$W/prep$ranks.log" 2> "$W/prep$ranks.time"
    echo "$ranks rank(s): $(grep 'prepare: encoded' "$W/prep$ranks.log") | peak RSS (largest process) $(peak_rss "$W/prep$ranks.time")"
    grep "document(s) ->" "$W/prep$ranks.log"
done
rm -rf "$W/prep1" "$W/prep2"
echo "== the same 1 GiB as one file (cut into units of about 64 MiB) =="
cat "$W"/text_1g/part_* > "$W/one.txt" && rm -rf "$W/text_1g"
for ranks in 1 2; do
    /usr/bin/time -v $MPI -n $ranks -x OMP_NUM_THREADS=$((2 / ranks)) "$Q" prepare --input "$W/one.txt" \
        --tokenizer bpe --vocab-size 4096 --train-sample 8000000 --shard-tokens 100000000 \
        --output "$W/one$ranks" > "$W/one$ranks.log" 2> "$W/one$ranks.time"
    echo "$ranks rank(s): $(grep 'prepare: encoded' "$W/one$ranks.log") | peak RSS (largest process) $(peak_rss "$W/one$ranks.time")"
    rm -rf "$W/one$ranks"
done
rm -f "$W/one.txt"

echo "== train: the quickstart model, 2 ranks, $STEPS steps, on 4 MiB and 4 GiB token files =="
repeat_to $((2 << 20)) "$W/text_4m.txt"
repeat_to $((2 << 30)) "$W/text_4g.txt"
"$Q" prepare --input "$W/text_4m.txt" --tokenizer byte --shard-tokens 4000000000 --output "$W/t4m" > /dev/null
"$Q" prepare --input "$W/text_4g.txt" --tokenizer byte --shard-tokens 4000000000 --output "$W/t4g" > "$W/t4g.log"
rm -f "$W/text_4m.txt" "$W/text_4g.txt"
ls -l "$W/t4m/shard_000000.h5" "$W/t4g/shard_000000.h5"
median_tps() {  # the median tokens/s of steps 5..N
    "$1" metrics "$2" | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "tokens_per_s") c = i; next }
        NR > 5 { print $c }' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
peak_ranks() {  # the largest /memory/peak_rss_bytes of the last step, MiB
    "$1" metrics "$2" --group memory | tail -1 | awk -F, -v h="$("$1" metrics "$2" --group memory | head -1)" '
        BEGIN { n = split(h, H, ",") } { m = 0; for (i = 1; i <= n; i++) if (H[i] ~ /^peak_rss_bytes/ && $i > m) m = $i; printf "%.0f MiB", m / 1048576 }'
}
run() {  # run NAME BINARY DATA ORDER
    $MPI -n 2 -x OMP_NUM_THREADS=1 "$2" train inputs/quickstart.deck --data.path="$3" --data.order="$4" \
        --train.steps=$STEPS --eval.every=0 --checkpoint.every=0 --output.log_every=$STEPS \
        --output.run_dir="$W/$1" > "$W/$1.log" 2>&1
    echo "$1: tokens/s $(median_tps "$Q" "$W/$1") | peak RSS per rank $(peak_ranks "$Q" "$W/$1")"
}
for order in random shuffle; do
    run "new_4m_$order" "$Q" "$W/t4m/shard_000000.h5" $order
    run "new_4g_$order" "$Q" "$W/t4g/shard_000000.h5" $order
done
if [ -n "${BASE:-}" ]; then
    run base_4m_random "$BASE" "$W/t4m/shard_000000.h5" random
    run new_4m_random_again "$Q" "$W/t4m/shard_000000.h5" random
fi
