#!/usr/bin/env bash
# Start-up against shard count (docs/benchmarks.md, "Start-up and shard count"): one corpus of
# TEXT, prepared with TOKENIZER into 10, 100 and 1000 shards, and the wall time of `quintet train`
# of one step of a tiny model on each (start-up, the data headers, one step) -- medians of
# REPEATS runs, the shard counts interleaved. With BASE=path/to/an/older/quintet the same for
# that binary on corpora it prepared itself (its shards each carry the tokenizer).
# Usage: bash scripts/bench_startup.sh TEXT TOKENIZER_SPEC [WORKDIR]
#   e.g. bash scripts/bench_startup.sh /work/shared/data/tinyshakespeare.txt hf:llama3/tokenizer.json
set -euo pipefail
cd "$(dirname "$0")/.."
TEXT=${1:?usage: bench_startup.sh TEXT TOKENIZER_SPEC [WORKDIR]}
SPEC=${2:?usage: bench_startup.sh TEXT TOKENIZER_SPEC [WORKDIR]}
W=${3:-/tmp/quintet-bench-startup}
Q=${QUINTET:-$PWD/build/quintet}
REPEATS=${REPEATS:-5}
mkdir -p "$W"
trap 'rm -rf "$W"' EXIT
lscpu | head -20
cat > "$W/tiny.deck" <<'EOF'
[model]
d_model = 32
n_layers = 1
n_heads = 2
n_kv_heads = 2
ffn_dim = 64
[data]
seq_len = 64
micro_batch_size = 2
[train]
steps = 1
[checkpoint]
every = 0
[output]
log_every = 1
EOF
binaries=("new:$Q")
[ -n "${BASE:-}" ] && binaries+=("base:$BASE")
for b in "${binaries[@]}"; do
    name=${b%%:*} bin=${b#*:}
    total=$("$bin" prepare --input "$TEXT" --tokenizer "$SPEC" --output "$W/$name.h5" |
            sed -n 's/.* -> \([0-9]*\) tokens.*/\1/p')
    for n in 10 100 1000; do
        "$bin" prepare --input "$TEXT" --tokenizer "$SPEC" --shard-tokens $(( (total + n - 1) / n )) \
            --output "$W/$name-$n" > /dev/null
        echo "$name: $n shards: $(ls "$W/$name-$n" | grep -c '^shard_') files, $(du -sm "$W/$name-$n" | cut -f1) MB on disk"
    done
done
declare -A times
for r in $(seq "$REPEATS"); do
    for b in "${binaries[@]}"; do
        name=${b%%:*} bin=${b#*:}
        for n in 10 100 1000; do
            rm -rf "$W/run"
            t0=$(date +%s.%N)
            "$bin" train "$W/tiny.deck" --data.path="$W/$name-$n" --output.run_dir="$W/run" > "$W/log" 2>&1 ||
                { cat "$W/log"; exit 1; }
            t1=$(date +%s.%N)
            times["$name-$n"]+="$(echo "$t1 - $t0" | bc) "
        done
    done
done
for b in "${binaries[@]}"; do
    name=${b%%:*}
    for n in 10 100 1000; do
        median=$(echo ${times["$name-$n"]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
        echo "$name: $n shards: train of one step, median of $REPEATS: ${median} s (all: ${times["$name-$n"]})"
    done
done
