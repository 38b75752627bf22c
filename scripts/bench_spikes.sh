#!/usr/bin/env bash
# Loss spikes: false positives on ordinary training (docs/benchmarks.md, "Loss spikes: false
# positives"). Trains DECK (default inputs/bench_small.deck) for STEPS steps (default 3000) with
# train.on_spike = none -- every step the policy would judge a spike is recorded in /train/spike
# without acting -- and reports from metrics.h5:
#   judged      steps after the warm-up (a full window: the limits are not NaN)
#   flagged     steps with /train/spike = 1 at the run's spike_sigma, each with its values
#   excess      the largest (value - mean) / std of the window over the judged steps, loss and norm
#   at sigma s  the steps that would be flagged at s = 3, 4, 5, recomputed from /train/loss and
#               /train/grad_norm (every step enters the window under none)
# and checks that the recorded limits equal the recomputed ones. Extra arguments go to quintet
# train (e.g. --data.micro_batch_size=4). Output: runs/bench_results/spikes.txt, with
# `lscpu | head -20`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUINTET=${QUINTET:-build/quintet}
DECK=${DECK:-inputs/bench_small.deck}
STEPS=${STEPS:-3000}
RUN=${RUN:-runs/bench_spikes}
OUT=runs/bench_results
mkdir -p "$OUT" data
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [[ ! -f data/bench_byte.h5 ]]; then
    CORPUS=${BENCH_CORPUS:-../shared/data/tinyshakespeare.txt}
    [[ -f $CORPUS ]] || CORPUS=data/quickstart.txt
    "$QUINTET" prepare --input "$CORPUS" --tokenizer byte --output data/bench_byte.h5 >&2
fi
rm -rf "$RUN"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$QUINTET" train "$DECK" --train.steps="$STEPS" --train.on_spike=none \
    --output.log_every=100 --output.run_dir="$RUN" "$@" >&2
"$QUINTET" metrics "$RUN" > "$OUT/spikes_train.csv"
WINDOW=$("$QUINTET" deck --get train.spike_window "$DECK" "$@")
SIGMA=$("$QUINTET" deck --get train.spike_sigma "$DECK" "$@")

python3 - "$OUT/spikes_train.csv" "$WINDOW" "$SIGMA" "$DECK $*" > "$OUT/spikes.txt" <<'PY'
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
window, sigma, what = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
loss = [float(r["loss"]) for r in rows]  # cross-entropy + MoE aux, as judged
norm = [float(r["grad_norm"]) for r in rows]
def stats(v):  # population mean and std, two passes, oldest first (train/spikes.cpp)
    m = sum(v) / len(v)
    return m, math.sqrt(sum((x - m) ** 2 for x in v) / len(v))
judged, flagged, worst = 0, [], {"loss": -1e30, "norm": -1e30}
at = {s: {"loss": 0, "norm": 0} for s in (3, 4, 5)}
max_rel = 0.0
for i in range(window, len(rows)):
    judged += 1
    exc = {}
    for name, v in (("loss", loss), ("norm", norm)):
        m, s = stats(v[i - window:i])
        exc[name] = (v[i] - m) / s if s > 0 else 0.0
        worst[name] = max(worst[name], exc[name])
        for k in at:
            if v[i] > m + k * s: at[k][name] += 1
        rec = float(rows[i]["spike_loss_limit" if name == "loss" else "spike_grad_norm_limit"])
        max_rel = max(max_rel, abs(rec - (m + sigma * s)) / abs(m + sigma * s))
    if float(rows[i]["spike"]) > 0:
        flagged.append("step %s: loss %.2f std, gradient norm %.2f std above the window's mean" % (rows[i]["step"], exc["loss"], exc["norm"]))
print("%s: %d steps, window %d, sigma %g" % (what, len(rows), window, sigma))
print("judged (after the warm-up): %d" % judged)
print("flagged (/train/spike): %d" % len(flagged))
for f in flagged: print("  " + f)
print("largest excess: loss %.2f std, gradient norm %.2f std" % (worst["loss"], worst["norm"]))
print("flagged at sigma 3 / 4 / 5 (recomputed): loss %d / %d / %d, norm %d / %d / %d" %
      (at[3]["loss"], at[4]["loss"], at[5]["loss"], at[3]["norm"], at[4]["norm"], at[5]["norm"]))
print("recorded limits against recomputed: largest relative difference %.2e" % max_rel)
PY
{ echo; lscpu | head -20; } >> "$OUT/spikes.txt"
cat "$OUT/spikes.txt"
