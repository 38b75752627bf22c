#!/usr/bin/env bash
# Tokenizer speed: quintet's tiktoken: reader against OpenAI's tiktoken (the npm package's WASM
# build: the reference the tests use) on the same text and machine, in MB/s per thread
# (docs/tokenizers.md, docs/benchmarks.md "Tokenizers"). For each encoding (cl100k_base,
# o200k_base, gpt2) and text, REPEATS interleaved rounds of: quintet on 1 thread, tiktoken (1
# thread: WASM is single-threaded), quintet on all threads; the table gives medians. Timings cover
# encoding only (quintet tokenize --stats; tiktoken after a warm-up encode), not loading.
# Needs build/quintet and Node >= 20; installs `tiktoken` into build/npm like the tests.
# Environment: REPEATS (5), BENCH_TEXTS (files; default: ../shared/data/tinyshakespeare.txt if
# present, and the mixed test corpus repeated to 1 MB). Output: the table on stdout; raw numbers
# and lscpu under runs/bench_results/tokenizers/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

REPEATS=${REPEATS:-5}
OUT=runs/bench_results/tokenizers
QUINTET=build/quintet
NM=build/npm/node_modules
mkdir -p "$OUT" build/npm
[[ -x $QUINTET ]] || { echo "bench_tokenizers.sh: no $QUINTET: build first (scripts/setup.sh)" >&2; exit 1; }
command -v node >/dev/null || { echo "bench_tokenizers.sh: no node (>= 20) on PATH" >&2; exit 1; }
[[ -f $NM/tiktoken/package.json ]] ||
    npm install --prefix build/npm --no-audit --no-fund --loglevel=error tiktoken@1.0.22 >&2
node scripts/bench_tokenizers.mjs "$NM" ranks "$OUT"
lscpu > "$OUT/lscpu.txt"

if [[ -n "${BENCH_TEXTS:-}" ]]; then
    read -r -a TEXTS <<< "$BENCH_TEXTS"
else
    TEXTS=()
    [[ -f ../shared/data/tinyshakespeare.txt ]] && TEXTS+=(../shared/data/tinyshakespeare.txt)
    python3 - "$OUT/mixed_1MB.txt" <<'PY'
import sys
corpus = open("tests/tokenizer/data/mixed_corpus.txt", encoding="utf-8").read()
open(sys.argv[1], "w", encoding="utf-8").write(corpus * (1_000_000 // len(corpus.encode()) + 1))
PY
    TEXTS+=("$OUT/mixed_1MB.txt")
fi
THREADS=$(nproc)
raw="$OUT/raw.txt"
: > "$raw"
rate_quintet() {  # $1 encoding, $2 text, $3 threads
    OMP_NUM_THREADS=$3 "$QUINTET" tokenize --tokenizer "tiktoken:$OUT/$1.tiktoken" --whole --stats < "$2" 2>&1 >/dev/null |
        sed -n 's/.* \([0-9.]*\) MB\/s on.*/\1/p'
}
for text in "${TEXTS[@]}"; do
    for enc in cl100k_base o200k_base gpt2; do
        for ((r = 0; r < REPEATS; ++r)); do
            echo "$(basename "$text") $enc quintet_1 $(rate_quintet "$enc" "$text" 1)" >> "$raw"
            echo "$(basename "$text") $enc tiktoken_1 $(node scripts/bench_tokenizers.mjs "$NM" time "$enc" "$text" |
                sed -n 's/^MB\/s=\([0-9.]*\).*/\1/p')" >> "$raw"
            echo "$(basename "$text") $enc quintet_$THREADS $(rate_quintet "$enc" "$text" "$THREADS")" >> "$raw"
        done
    done
done
python3 - "$raw" "$THREADS" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    text, enc, who, rate = line.split()
    rows[(text, enc, who)].append(float(rate))
threads = sys.argv[2]
print(f"| text | encoding | quintet, 1 thread | tiktoken (WASM), 1 thread | ratio | quintet, {threads} threads |")
print("|---|---|---|---|---|---|")
for (text, enc) in dict.fromkeys((t, e) for t, e, _ in rows):
    q = statistics.median(rows[(text, enc, "quintet_1")])
    t = statistics.median(rows[(text, enc, "tiktoken_1")])
    qn = statistics.median(rows[(text, enc, f"quintet_{threads}")])
    print(f"| {text} | {enc} | {q:.1f} MB/s | {t:.1f} MB/s | {q / t:.1f}x | {qn:.1f} MB/s |")
PY
