#!/usr/bin/env bash
# Background checkpoints, measured (docs/benchmarks.md, "Background checkpoints"): a model whose
# checkpoint is hundreds of MB per rank (bench_small's deck at d_model 1024, 4 layers, ffn 4096:
# 67.6 M parameters, 12 bytes each with the moments, written in dp shares), trained for 32 steps
# with a checkpoint every 8, blocking (checkpoint.async = false) and in the background (true),
# ROUNDS interleaved rounds. Every progress line is time-stamped as it arrives, so an
# iteration's wall time includes what the step's own timer does not: the checkpoint after it.
# Reported, medians over the rounds' iterations:
#   ordinary    iterations with no checkpoint and no background write running
#   checkpoint  the iteration after each checkpoint step (the step that pays for it)
#   in write    async: the iterations while the background write runs (sharing the cores), and
#               the checkpoint iteration against them (its neighbours)
#   blocked, staging, write: /checkpoint/blocked_s, staging_s (the copy), write_s of metrics.h5
# The last checkpoint (step 32, at the end: always blocking) is left out. BASELINE=path/to/quintet
# adds a third mode, that binary's blocking checkpoints (an older writer), in the same rounds.
# Output: runs/bench_results/checkpoint.txt, with `lscpu | head -20`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUINTET=${QUINTET:-build/quintet}
RANKS=${RANKS:-2}
read -r -a MPIRUN_ARGS <<< "${MPIRUN_ARGS:-}"
ROUNDS=${ROUNDS:-3}
OUT=runs/bench_results
mkdir -p "$OUT" data
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [[ ! -f data/bench_byte.h5 ]]; then
    CORPUS=${BENCH_CORPUS:-../shared/data/tinyshakespeare.txt}
    [[ -f "$CORPUS" ]] || { [[ -f data/quickstart.txt ]] || bash scripts/make_corpus.sh data/quickstart.txt >/dev/null; CORPUS=data/quickstart.txt; }
    "$QUINTET" prepare --input "$CORPUS" --tokenizer byte --output data/bench_byte.h5 >&2
fi
MODEL=(--model.d_model=1024 --model.n_layers=4 --model.n_heads=16 --model.n_kv_heads=16 --model.ffn_dim=4096
       --data.seq_len=64 --data.micro_batch_size=1 --parallel.microbatches=1 --train.steps=32 --train.warmup=2
       --eval.every=0 --checkpoint.every=8 --checkpoint.keep=2 --checkpoint.resume=none --output.log_every=1
       --train.threads=1)

# Time-stamps each line of stdin (seconds, monotonic) as it arrives.
stamp() { python3 -u -c '
import sys, time
for line in sys.stdin:
    sys.stdout.write("%.6f %s" % (time.monotonic(), line))
'; }

MODES="false true"
[[ -n "${BASELINE:-}" ]] && MODES="baseline $MODES"
for round in $(seq 1 "$ROUNDS"); do
    for mode in $MODES; do
        run="runs/ckpt_${mode}_$round"
        rm -rf "$run"
        echo "== round $round, checkpoint.async = $mode" >&2
        if [[ $mode == baseline ]]; then bin=$BASELINE; async=(); else bin=$QUINTET; async=(--checkpoint.async="$mode"); fi
        mpirun --oversubscribe "${MPIRUN_ARGS[@]}" -n "$RANKS" -x OMP_NUM_THREADS=1 "$bin" train inputs/bench_small.deck "${MODEL[@]}" \
            "${async[@]}" --output.run_dir="$run" 2>&1 | stamp > "$OUT/ckpt_${mode}_$round.log"
        "$QUINTET" metrics "$run" --group checkpoint > "$OUT/ckpt_${mode}_$round.csv" 2>/dev/null || : > "$OUT/ckpt_${mode}_$round.csv"
    done
done

python3 - "$OUT" "$ROUNDS" $MODES > "$OUT/checkpoint.txt" <<'PY'
import csv, re, statistics, sys
out, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = lambda v: statistics.median(v) if v else float("nan")
print("checkpoint every 8 steps of 32; %d rounds; medians over the rounds' iterations (seconds)" % rounds)
print("| checkpoint.async | ordinary iteration | iteration after a checkpoint step | difference | blocked_s | of which staging_s | write_s | iteration while writing | after - while writing |")
print("|---|---|---|---|---|---|---|---|---|")
for mode in modes:
    ordinary, at_ckpt, writing, blocked, staging, write = [], [], [], [], [], []
    for r in range(1, rounds + 1):
        steps, commits = {}, {}
        for line in open("%s/ckpt_%s_%d.log" % (out, mode, r)):
            t, text = line.split(" ", 1)
            m = re.match(r"step +(\d+)/", text)
            if m: steps[int(m.group(1))] = float(t)
            m = re.match(r"checkpoint \S+step_(\d+)\.h5", text)
            if m: commits[int(m.group(1))] = float(t)
        for row in csv.DictReader(open("%s/ckpt_%s_%d.csv" % (out, mode, r))):
            if int(float(row["step"])) == 32: continue
            blocked.append(float(row["blocked_s"])); staging.append(float(row["staging_s"])); write.append(float(row["write_s"]))
        ckpts = [c for c in commits if c != 32]
        for k in range(3, 33):
            if k not in steps or k - 1 not in steps: continue
            wall = steps[k] - steps[k - 1]
            if k - 1 in ckpts: at_ckpt.append(wall)
            elif any(c + 1 < k and steps[k] <= commits[c] for c in ckpts): writing.append(wall)
            else: ordinary.append(wall)
    o, c = med(ordinary), med(at_ckpt)
    f = lambda v: "%.3f" % med(v) if v else "-"
    print("| %s | %.3f | %.3f | %+.3f | %s | %s | %s | %s | %s |" % (mode, o, c, c - o, f(blocked), f(staging), f(write),
          f(writing), "%+.3f" % (c - med(writing)) if writing else "-"))
PY
{ echo; lscpu | head -20; } >> "$OUT/checkpoint.txt"
cat "$OUT/checkpoint.txt"
