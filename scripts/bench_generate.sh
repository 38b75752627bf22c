#!/usr/bin/env bash
# `quintet generate` against llama.cpp on the same model: a step-0 checkpoint of
# inputs/bench_medium.deck (GQA, exported as llama) and of inputs/bench_mla.deck (MLA, exported as
# deepseek2), f32 GGUF, greedy decoding of NEW tokens after a PROMPT-token prompt, THREADS threads
# for both. quintet runs the prompt through its KV-cache decoder one token at a time; llama.cpp
# evaluates it in one batch (scripts/bench_generate_llama_cpp.mjs, node-llama-cpp 3.21.1's
# prebuilt CPU build, its default settings). Rounds interleave the runs; medians of REPEATS.
# Environment: BUILD (build), REPEATS (5), THREADS (1), PROMPT (128), NEW (128).
# Output: a table on stdout, raw figures and lscpu's model line in runs/bench_generate/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
BUILD=${BUILD:-build}; REPEATS=${REPEATS:-5}; THREADS=${THREADS:-1}; PROMPT=${PROMPT:-128}; NEW=${NEW:-128}
Q=$BUILD/quintet; NM=$BUILD/npm/node_modules; OUT=runs/bench_generate
mkdir -p "$OUT" data
if [ ! -f "$NM/node-llama-cpp/package.json" ]; then
  npm install --prefix "$BUILD/npm" --no-audit --no-fund --loglevel=error node-llama-cpp@3.21.1 >&2
fi
if [ ! -f data/bench_bpe8192.h5 ]; then
  [ -f data/quickstart.txt ] || bash scripts/make_corpus.sh data/quickstart.txt
  "$Q" prepare --input data/quickstart.txt --tokenizer bpe --vocab-size 8192 --output data/bench_bpe8192.h5 >&2
fi
lscpu | grep -E 'Model name|^CPU\(s\)' > "$OUT/lscpu.txt"
IDS=$(python3 -c "print(' '.join(str((i * 7919 + 13) % 4000) for i in range($PROMPT)))")
for deck in medium mla; do
  rm -rf "$OUT/$deck"
  OMP_NUM_THREADS=1 "$Q" train "inputs/bench_$deck.deck" --train.steps=0 --checkpoint.resume=none \
    --data.path=data/bench_bpe8192.h5 --output.run_dir="$OUT/$deck" > "$OUT/$deck.train.log" 2>&1
  "$Q" export --checkpoint "$OUT/$deck/checkpoints/step_00000000.h5" --format gguf --output "$OUT/$deck.gguf" \
    --force 2> "$OUT/$deck.export.log"
done
: > "$OUT/raw.tsv"
for r in $(seq "$REPEATS"); do
  for deck in medium mla; do
    OMP_NUM_THREADS=$THREADS "$Q" generate --checkpoint "$OUT/$deck/checkpoints/step_00000000.h5" \
      --prompt-ids "$IDS" --tokens "$NEW" --temperature 0 > /dev/null 2> "$OUT/q.err"
    line=$(grep 'generate: prompt' "$OUT/q.err")
    pp=$(echo "$line" | sed -E 's/.*\(([0-9.]+) tok\/s\);.*/\1/'); tg=$(echo "$line" | sed -E 's/.*\(([0-9.]+) tok\/s\)$/\1/')
    printf '%s\tquintet\t%s\t%s\n' "$deck" "$pp" "$tg" >> "$OUT/raw.tsv"
    line=$(node scripts/bench_generate_llama_cpp.mjs "$NM" "$OUT/$deck.gguf" "$IDS" "$NEW" "$THREADS")
    printf '%s\tllama.cpp\t%s\t%s\n' "$deck" "$(echo "$line" | sed -E 's/pp_tok_s=([0-9.]+).*/\1/')" \
      "$(echo "$line" | sed -E 's/.*tg_tok_s=([0-9.]+)/\1/')" >> "$OUT/raw.tsv"
  done
done
python3 - "$OUT/raw.tsv" "$THREADS" "$PROMPT" "$NEW" <<'PY'
import sys, statistics
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
print(f"| model | runtime | prompt tok/s ({sys.argv[3]} tokens) | generation tok/s ({sys.argv[4]} tokens) | runs |")
print("|---|---|---|---|---|")
for deck in ("medium", "mla"):
    for rt in ("quintet", "llama.cpp"):
        r = [x for x in rows if x[0] == deck and x[1] == rt]
        pp = statistics.median(float(x[2]) for x in r); tg = statistics.median(float(x[3]) for x in r)
        print(f"| {deck} | {rt} | {pp:.1f} | {tg:.1f} | {len(r)} |")
print(f"\nthreads: {sys.argv[2]}")
PY
