#!/usr/bin/env bash
# The context-extension recipe of docs/long-context.md, end to end, with its measurements:
#   1. train inputs/long_context_short.deck at seq_len 128 (2 ranks);
#   2. evaluate the short model at 512 with plain RoPE and with YaRN (factor 4, no training),
#      and at 128;
#   3. continue at 512 with YaRN and cp = 2 from the short weights (inputs/long_context_extend.deck);
#   4. evaluate the extended model at 512 and at 128;
#   5. write the table (runs/long_context/table.md) and the plot of loss by position
#      (docs/long_context_by_position.png, matplotlib).
# About 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/quintet ] || { echo "long_context_demo: build/quintet missing: run scripts/setup.sh first" >&2; exit 1; }
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
Q=build/quintet
OUT=runs/long_context
mkdir -p "$OUT"
[ -f data/quickstart.txt ] || bash scripts/make_corpus.sh data/quickstart.txt
[ -f data/quickstart.h5 ] || $Q prepare --input data/quickstart.txt --tokenizer byte --output data/quickstart.h5
rm -rf runs/long_context_short runs/long_context_extend
mpirun --oversubscribe -n 2 $Q train inputs/long_context_short.deck | tee "$OUT/short.log" | grep -E "^step|^eval" | tail -3
SHORT=runs/long_context_short/checkpoints/step_00000600.h5
ev() {  # name, checkpoint, overrides...
  local name=$1 ck=$2; shift 2
  # The whole validation split once (23.6k tokens: 23 batches of 2 x 512 or of 8 x 128).
  mpirun --oversubscribe -n 2 $Q eval --checkpoint "$ck" --data data/quickstart.h5 --eval.batches=23 \
    --data.micro_batch_size=2 --parallel.cp=2 --by-position "$OUT/$name.h5" "$@" 2> "$OUT/$name.err" | tail -1 \
    | tee "$OUT/$name.txt"
}
ev short_512_rope "$SHORT" --data.seq_len=512
ev short_512_yarn "$SHORT" --data.seq_len=512 --rope.scaling=yarn --rope.factor=4
ev short_128 "$SHORT" --data.seq_len=128 --parallel.cp=1 --data.micro_batch_size=8
mpirun --oversubscribe -n 2 $Q train inputs/long_context_extend.deck | tee "$OUT/extend.log" | grep -E "^step|^eval" | tail -3
EXT=runs/long_context_extend/checkpoints/step_00000100.h5
ev extended_512 "$EXT" --data.seq_len=512
ev extended_128 "$EXT" --data.seq_len=128 --parallel.cp=1 --data.micro_batch_size=8
PY=/usr/bin/python3
$PY - "$OUT" <<'PY'
import sys, h5py, numpy as np
out = sys.argv[1]
def val(n): return float(open(f"{out}/{n}.txt").read().split()[0].split("=")[1])
rows = [("short model, plain RoPE, at 512", "short_512_rope"),
        ("short model, YaRN x4 without training, at 512", "short_512_yarn"),
        ("after 100 steps of YaRN fine-tuning at 512 (cp = 2)", "extended_512"),
        ("short model at its own 128", "short_128"),
        ("fine-tuned model at 128 (regression check)", "extended_128")]
with open(f"{out}/table.md", "w") as t:
    t.write("| case | validation loss (nats/token) |\n|---|---|\n")
    for label, n in rows:
        t.write(f"| {label} | {val(n):.4f} |\n")
print(open(f"{out}/table.md").read())
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("long_context_demo: no matplotlib (Debian: apt-get install python3-matplotlib)")
fig, ax = plt.subplots(figsize=(8, 4.5))
for label, n in rows[:3]:
    with h5py.File(f"{out}/{n}.h5", "r") as f:
        y = f["/loss_by_position"][:]
    k = 16  # smoothed over 16 positions
    ys = np.convolve(y, np.ones(k) / k, mode="valid")
    ax.plot(np.arange(len(ys)) + k // 2, ys, label=label)
ax.axvline(128, color="gray", ls="--", lw=1)
lo, hi = ax.get_ylim()
ax.text(132, lo + 0.03 * (hi - lo), "trained context (128)", va="bottom", fontsize=8, color="gray")
ax.set_xlabel("position in the sample")
ax.set_ylabel("cross-entropy (nats), mean over 46 samples")
ax.set_title("Loss by position at 4x the trained context")
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
fig.savefig("docs/long_context_by_position.png", dpi=110)
print("wrote docs/long_context_by_position.png")
PY
