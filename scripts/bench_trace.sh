#!/usr/bin/env bash
# What the timeline and the per-rank figures cost (docs/observability.md, docs/benchmarks.md):
# the benchmark decks on 1 and 2 ranks, three binaries side by side in each round -- BASELINE (a
# build from before them), this build with the timeline off (the default), and this build with
# train.trace_steps covering every measured step -- in rotated order, REPEATS rounds; the table
# gives the medians of each run's steady tokens/s (the steps after the first 2) and the
# straggler lines each quiet run of this build printed.
#
#   BASELINE=path/to/old/quintet [QUINTET=build/quintet] [REPEATS=3] [BENCH_CONFIGS="..."] scripts/bench_trace.sh
#
# BENCH_CONFIGS: "deck:ranks:extra-args" items (default: small and medium on 1 rank x 2 threads,
# small on dp=2 and tp=2, medium on pp=2 with 4 microbatches; 2-rank runs use 1 thread each).
# Output: the table on stdout; logs under runs/bench_trace/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

QUINTET=${QUINTET:-build/quintet}  # the build measured (a copy keeps a rebuild out of the rounds)
BASE=${BASELINE:?set BASELINE to the quintet binary to compare with}
REPEATS=${REPEATS:-3}
CONFIGS=${BENCH_CONFIGS:-"small:1: small:2:--parallel.tp=2 small:2:--parallel.dp=2 medium:1: medium:2:--parallel.pp=2,--parallel.microbatches=4"}
OUT=runs/bench_trace
mkdir -p "$OUT" data
CORPUS=${BENCH_CORPUS:-../shared/data/tinyshakespeare.txt}
[[ -f data/bench_byte.h5 ]] || "$QUINTET" prepare --input "$CORPUS" --tokenizer byte --output data/bench_byte.h5 >&2
[[ -f data/bench_bpe8192.h5 ]] ||
    "$QUINTET" prepare --input "$CORPUS" --tokenizer bpe --vocab-size 8192 --output data/bench_bpe8192.h5 >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The median of the steady steps' tokens/s of a run folder (rows after the first 2).
steady_tps() {
    "$QUINTET" metrics "$1" --csv | python3 -c '
import csv, statistics, sys
rows = list(csv.DictReader(sys.stdin))[2:]
print(statistics.median(float(r["tokens_per_s"]) for r in rows) if rows else "nan")'
}

# run BIN DECK RANKS EXTRA NAME: one training run, its log kept.
run() {
    local bin=$1 deck=$2 ranks=$3 extra=$4 name=$5 threads=2
    [[ $ranks -gt 1 ]] && threads=1
    rm -rf "$OUT/$name"
    OMP_NUM_THREADS=$threads mpirun --oversubscribe -n "$ranks" "$bin" train "inputs/bench_$deck.deck" \
        --output.run_dir="$OUT/$name" --train.peak_tflops=1 --checkpoint.resume=none \
        --train.threads=$threads ${extra//,/ } > "$OUT/$name.log" 2>&1
}

declare -A tps lines
for ((round = 0; round < REPEATS; ++round)); do
    for cfg in $CONFIGS; do
        IFS=: read -r deck ranks extra <<< "$cfg"
        steps=$(sed -n 's/^steps *= *\([0-9]*\).*/\1/p' "inputs/bench_$deck.deck")
        key="$deck:$ranks:$extra"
        kinds=(base off on)
        for ((k = 0; k < 3; ++k)); do  # rotated: each binary goes first in one round of three
            kind=${kinds[$(((k + round) % 3))]}
            name="${deck}_r${ranks}_$(echo "$extra" | tr -c 'a-z0-9' '_')_${kind}_$round"
            case $kind in
                base) run "$BASE" "$deck" "$ranks" "$extra" "$name" ;;
                off) run "$QUINTET" "$deck" "$ranks" "$extra" "$name" ;;
                on) run "$QUINTET" "$deck" "$ranks" "$extra,--train.trace_steps=3-$steps" "$name" ;;
            esac
            tps[$key:$kind]+="$(steady_tps "$OUT/$name") "
            [[ $kind != base ]] && lines[$key:$kind]+="$(grep -c '^straggler: ' "$OUT/$name.log" || true) "
        done
    done
done

median() { python3 -c 'import statistics, sys; v = [float(x) for x in sys.argv[1:]]; print(f"{statistics.median(v):.0f}")' "$@"; }
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.3f}')" "$1" "$2"; }
echo "| deck | ranks | layout | baseline tok/s | timeline off | timeline on | off / baseline | on / off | straggler lines (off; on) |"
echo "|---|---|---|---|---|---|---|---|---|"
for cfg in $CONFIGS; do
    IFS=: read -r deck ranks extra <<< "$cfg"
    key="$deck:$ranks:$extra"
    b=$(median ${tps[$key:base]}) o=$(median ${tps[$key:off]}) n=$(median ${tps[$key:on]})
    echo "| $deck | $ranks | ${extra//,/ } | $b (${tps[$key:base]% }) | $o (${tps[$key:off]% }) | $n (${tps[$key:on]% }) | $(ratio "$o" "$b") | $(ratio "$n" "$o") | ${lines[$key:off]% }; ${lines[$key:on]% } |"
done
