#!/usr/bin/env bash
# The proof that a refactor changed nothing: runs the same decks with two quintet binaries (the
# commit before, the commit after) and compares their 10-step loss and grad-norm curves, per
# layout, reporting the largest relative difference and whether the curves are bit-identical;
# then checks that every layout of the new binary writes the same step-0 checkpoint and that a
# checkpoint written by the old binary still loads.
#   scripts/refactor_proof.sh OLD_QUINTET NEW_QUINTET [WORK_DIR]
# Tiny models, one thread per rank (as the tests run): a few minutes on 2 cores.
set -euo pipefail
old=$(readlink -f "$1"); new=$(readlink -f "$2"); work=${3:-/tmp/quintet_refactor_proof}
cd "$(dirname "$0")/.."
root=$(pwd)
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1
rm -rf "$work"; mkdir -p "$work/old" "$work/new" "$work/step0"
[ -f data/quickstart.txt ] || bash scripts/make_corpus.sh data/quickstart.txt
"$new" prepare --input data/quickstart.txt --tokenizer byte --output "$work/data.h5" > /dev/null
cat > "$work/deck" <<DECK
[model]
d_model = 64
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_dim = 128
[data]
path = $work/data.h5
seq_len = 64
micro_batch_size = 2
val_fraction = 0.05
[train]
steps = 10
lr = 3e-3
lr_min = 3e-4
warmup = 2
peak_tflops = 0.1
[eval]
every = 5
batches = 2
[output]
log_every = 10
DECK
# name | ranks | overrides (global batch 16 samples everywhere)
runs=(
  "1rank|1|--parallel.microbatches=8"
  "dp2|2|--parallel.microbatches=4"
  "zero1|2|--parallel.microbatches=4 --parallel.zero=1"
  "tp2|2|--parallel.tp=2 --parallel.microbatches=8"
  "tp2_sp|2|--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"
  "pp2_1f1b|2|--parallel.pp=2 --parallel.microbatches=8"
  "pp2_gpipe|2|--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=gpipe"
  "pp2_interleaved|2|--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=interleaved --parallel.virtual_stages=2"
  "tp2_pp2|4|--parallel.tp=2 --parallel.pp=2 --parallel.microbatches=8 --parallel.sequence_parallel=true"
  "tied|2|--parallel.pp=2 --parallel.microbatches=8 --model.tie_embeddings=true"
  "yarn|1|--parallel.microbatches=8 --rope.scaling=yarn --rope.factor=4 --rope.original_max_position=16"
  "fan_in_mha|1|--parallel.microbatches=8 --init.scheme=fan_in --model.n_kv_heads=4"
  "bf16|1|--parallel.microbatches=8 --train.precision=bf16"
)
for r in "${runs[@]}"; do
  IFS='|' read -r name ranks args <<< "$r"
  for which in old new; do
    bin=$old; [ $which = new ] && bin=$new
    # shellcheck disable=SC2086
    mpirun --oversubscribe -n "$ranks" "$bin" train "$work/deck" $args \
      --output.run_dir="$work/$which/$name" > "$work/$which/$name.log" 2>&1 \
      || { echo "FAILED: $which $name (log: $work/$which/$name.log)"; exit 1; }
  done
done
/usr/bin/python3 - "$work" "${runs[@]}" <<'PY'
import sys, h5py, numpy as np
work, runs = sys.argv[1], sys.argv[2:]
print(f"{'run':<18}{'loss max rel diff':>20}{'gnorm max rel diff':>20}{'eval max rel diff':>20}  bits")
worst = 0.0
for r in runs:
    name = r.split('|')[0]
    cols = {}
    for which in ("old", "new"):
        with h5py.File(f"{work}/{which}/{name}/metrics.h5", "r") as f:
            cols[which] = [f["/train/loss"][:], f["/train/grad_norm"][:], f["/eval/loss"][:]]
    rel = [float(np.max(np.abs(a - b) / np.abs(a))) for a, b in zip(cols["old"], cols["new"])]
    same = all(np.array_equal(a, b) for a, b in zip(cols["old"], cols["new"]))
    worst = max(worst, max(rel))
    print(f"{name:<18}{rel[0]:>20.3g}{rel[1]:>20.3g}{rel[2]:>20.3g}  {'identical' if same else 'differ'}")
print(f"largest relative difference: {worst:.3g}")
sys.exit(0 if worst <= 1e-6 else 1)
PY
# Step-0 checkpoints of every layout, new binary: bit-identical tensors.
for r in "1rank|1|" "tp2_sp|2|--parallel.tp=2 --parallel.sequence_parallel=true" "pp2|2|--parallel.pp=2" \
         "zero_dp2|2|--parallel.zero=1" "tp2_pp2|4|--parallel.tp=2 --parallel.pp=2"; do
  IFS='|' read -r name ranks args <<< "$r"
  # shellcheck disable=SC2086
  mpirun --oversubscribe -n "$ranks" "$new" train "$work/deck" $args --train.steps=0 \
    --output.run_dir="$work/step0/$name" > "$work/step0/$name.log" 2>&1 || { echo "FAILED step0 $name"; exit 1; }
done
/usr/bin/python3 - "$work" <<'PY'
import sys, glob, h5py, numpy as np
work = sys.argv[1]
def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
files = sorted(glob.glob(f"{work}/step0/*/checkpoints/step_00000000.h5"))
ref = tensors(files[0])
for p in files[1:]:
    t = tensors(p)
    assert t.keys() == ref.keys(), p
    for k in ref:
        assert np.array_equal(t[k].view(np.uint32), ref[k].view(np.uint32)), (p, k)
print(f"step-0 checkpoints: {len(files)} layouts, {len(ref)} tensors each, bit-identical")
PY
# A checkpoint written by the old binary resumes with the new one (same model, same curve).
mpirun --oversubscribe -n 2 "$new" train "$work/deck" --parallel.microbatches=4 --train.steps=10 \
  --checkpoint.resume="$(ls "$work"/old/dp2/checkpoints/step_*.h5 | tail -1)" \
  --output.run_dir="$work/resume_old" > "$work/resume_old.log" 2>&1 && grep -q "resumed from" "$work/resume_old.log" \
  && echo "a checkpoint of the old binary loads into the new one" || { echo "FAILED: old checkpoint"; exit 1; }
