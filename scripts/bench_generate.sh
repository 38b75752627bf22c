#!/usr/bin/env bash
# `quintet generate` against llama.cpp on the same model: a step-0 checkpoint of
# inputs/bench_medium.deck (GQA, exported as llama) and of inputs/bench_mla.deck (MLA, exported as
# deepseek2), f32 GGUF, greedy decoding of NEW tokens after a PROMPT-token prompt, the same ids for
# both, with each thread count of THREADS for both. quintet reads the prompt in one forward
# (Decoder::prefill); llama.cpp evaluates it in one batch (scripts/bench_generate_llama_cpp.mjs,
# node-llama-cpp 3.21.1's prebuilt CPU build, its default settings). Then quintet alone decodes
# BATCH_PROMPTS prompts of the corpus with `--prompts` at each batch size of BATCHES.
# Rounds interleave every run (quintet, llama.cpp, each model, each thread count); medians of
# REPEATS rounds.
# Environment: BUILD (build), REPEATS (5), THREADS ("1 2"), PROMPT (128), NEW (128),
# BATCHES ("1 4 16"), BATCH_PROMPTS (16).
# Output: tables on stdout, raw figures and lscpu in runs/bench_generate/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
BUILD=${BUILD:-build}; REPEATS=${REPEATS:-5}; THREADS=${THREADS:-1 2}; PROMPT=${PROMPT:-128}; NEW=${NEW:-128}
BATCHES=${BATCHES:-1 4 16}; BATCH_PROMPTS=${BATCH_PROMPTS:-16}
Q=$BUILD/quintet; NM=$BUILD/npm/node_modules; OUT=runs/bench_generate
mkdir -p "$OUT" data
if [ ! -f "$NM/node-llama-cpp/package.json" ]; then
  npm install --prefix "$BUILD/npm" --no-audit --no-fund --loglevel=error node-llama-cpp@3.21.1 >&2
fi
[ -f data/quickstart.txt ] || bash scripts/make_corpus.sh data/quickstart.txt
if [ ! -f data/bench_bpe8192.h5 ]; then
  "$Q" prepare --input data/quickstart.txt --tokenizer bpe --vocab-size 8192 --output data/bench_bpe8192.h5 >&2
fi
lscpu > "$OUT/lscpu.txt"
IDS=$(python3 -c "print(' '.join(str((i * 7919 + 13) % 4000) for i in range($PROMPT)))")
# BATCH_PROMPTS lines of the corpus, 40 words each, from places spread over it.
python3 - data/quickstart.txt "$BATCH_PROMPTS" > "$OUT/prompts.txt" <<'PY'
import sys
words = open(sys.argv[1], encoding="utf-8", errors="replace").read().split()
n = int(sys.argv[2])
for i in range(n):
    at = (len(words) - 50) * i // n
    print(" ".join(words[at:at + 40]))
PY
for deck in medium mla; do
  rm -rf "$OUT/$deck"
  OMP_NUM_THREADS=1 "$Q" train "inputs/bench_$deck.deck" --train.steps=0 --checkpoint.resume=none \
    --data.path=data/bench_bpe8192.h5 --output.run_dir="$OUT/$deck" > "$OUT/$deck.train.log" 2>&1
  "$Q" export --checkpoint "$OUT/$deck/checkpoints/step_00000000.h5" --format gguf --output "$OUT/$deck.gguf" \
    --force 2> "$OUT/$deck.export.log"
done
: > "$OUT/raw.tsv"; : > "$OUT/batch.tsv"
for r in $(seq "$REPEATS"); do
  for th in $THREADS; do
    for deck in medium mla; do
      ck="$OUT/$deck/checkpoints/step_00000000.h5"
      OMP_NUM_THREADS=$th "$Q" generate --checkpoint "$ck" --prompt-ids "$IDS" --tokens "$NEW" --temperature 0 \
        > /dev/null 2> "$OUT/q.err"
      line=$(grep 'generate: prompt ' "$OUT/q.err")
      pp=$(echo "$line" | sed -E 's/.*prompt [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/')
      tg=$(echo "$line" | sed -E 's/.*new tokens in [0-9.]+ s \(([0-9.]+) tok\/s\)$/\1/')
      printf '%s\t%s\tquintet\t%s\t%s\n' "$deck" "$th" "$pp" "$tg" >> "$OUT/raw.tsv"
      line=$(node scripts/bench_generate_llama_cpp.mjs "$NM" "$OUT/$deck.gguf" "$IDS" "$NEW" "$th")
      printf '%s\t%s\tllama.cpp\t%s\t%s\n' "$deck" "$th" "$(echo "$line" | sed -E 's/pp_tok_s=([0-9.]+).*/\1/')" \
        "$(echo "$line" | sed -E 's/.*tg_tok_s=([0-9.]+)/\1/')" >> "$OUT/raw.tsv"
      for b in $BATCHES; do
        OMP_NUM_THREADS=$th "$Q" generate --checkpoint "$ck" --prompts "$OUT/prompts.txt" --batch "$b" \
          --tokens "$NEW" --temperature 0 > /dev/null 2> "$OUT/q.err"
        tg=$(grep 'batched steps' "$OUT/q.err" | sed -E 's/.*steps, [0-9.]+ s \(([0-9.]+) tok\/s\)$/\1/')
        printf '%s\t%s\t%s\t%s\n' "$deck" "$th" "$b" "$tg" >> "$OUT/batch.tsv"
      done
    done
  done
done
python3 - "$OUT/raw.tsv" "$OUT/batch.tsv" "$PROMPT" "$NEW" "$BATCH_PROMPTS" "$REPEATS" <<'PY'
import sys, statistics
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
med = lambda xs: statistics.median(float(x) for x in xs)
print(f"Side by side: prompt {sys.argv[3]} tokens, {sys.argv[4]} new tokens, greedy, f32; medians of "
      f"{sys.argv[6]} rounds (min-max in brackets)\n")
print("| model | threads | prompt tok/s quintet | llama.cpp | ratio | generation tok/s quintet | llama.cpp | ratio |")
print("|---|---|---|---|---|---|---|---|")
for deck in ("medium", "mla"):
    for th in sorted({r[1] for r in rows}, key=int):
        q = [r for r in rows if r[0] == deck and r[1] == th and r[2] == "quintet"]
        l = [r for r in rows if r[0] == deck and r[1] == th and r[2] == "llama.cpp"]
        rng = lambda xs, i: f"{min(float(x[i]) for x in xs):.0f}-{max(float(x[i]) for x in xs):.0f}"
        qp, lp, qt, lt = med(x[3] for x in q), med(x[3] for x in l), med(x[4] for x in q), med(x[4] for x in l)
        print(f"| {deck} | {th} | {qp:.0f} ({rng(q, 3)}) | {lp:.0f} ({rng(l, 3)}) | {qp / lp:.2f} "
              f"| {qt:.1f} ({rng(q, 4)}) | {lt:.1f} ({rng(l, 4)}) | {qt / lt:.2f} |")
b = [l.split("\t") for l in open(sys.argv[2]).read().split("\n") if l]
sizes = sorted({r[2] for r in b}, key=int)
print(f"\nquintet generate --prompts ({sys.argv[5]} prompts of 40 words, {sys.argv[4]} new tokens each): "
      "generation tok/s of the batched steps, all sequences together\n")
print("| model | threads | " + " | ".join(f"batch {s}" for s in sizes) + " |")
print("|---|---|" + "---|" * len(sizes))
for deck in ("medium", "mla"):
    for th in sorted({r[1] for r in b}, key=int):
        cells = [med(r[3] for r in b if r[0] == deck and r[1] == th and r[2] == s) for s in sizes]
        print(f"| {deck} | {th} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
PY
