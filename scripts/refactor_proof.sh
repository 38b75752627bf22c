#!/usr/bin/env bash
# The proof that a refactor changed nothing: runs the same decks with two quintet binaries (the
# commit before, the commit after) and compares their 10-step loss and grad-norm curves, per
# layout, reporting the largest relative difference and whether the curves are bit-identical;
# then checks that every layout of the new binary writes the same step-0 checkpoint and that a
# checkpoint written by the old binary still loads.
#   scripts/refactor_proof.sh OLD_QUINTET NEW_QUINTET [WORK_DIR]
# PROOF_TOLERANCE=x accepts curves whose largest relative difference is at most x (default 0:
# bit-identical, as a refactor must be; a change of arithmetic states its tolerance).
# Tiny models, one thread per rank (as the tests run): a few minutes on 2 cores.
set -euo pipefail
old=$(readlink -f "$1"); new=$(readlink -f "$2"); work=${3:-/tmp/quintet_refactor_proof}
cd "$(dirname "$0")/.."
root=$(pwd)
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1
rm -rf "$work"; mkdir -p "$work/old" "$work/new" "$work/step0" "$work/step0_moe"
[ -f data/quickstart.txt ] || bash scripts/make_corpus.sh data/quickstart.txt
"$new" prepare --input data/quickstart.txt --tokenizer byte --output "$work/data.h5" > /dev/null
# The same tokens in the old binary's token-file format (byte tokenizer: one token per byte), for
# an old binary that reads an earlier format version.
"$old" prepare --input data/quickstart.txt --tokenizer byte --output "$work/data_old.h5" > /dev/null 2>&1 ||
  "$old" prepare --input data/quickstart.txt --tokenizer bytes --output "$work/data_old.h5" > /dev/null 2>&1 ||
  cp "$work/data.h5" "$work/data_old.h5"
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
# The attention and feed-forward kinds beside the default GQA + SwiGLU (tiny, as above).
MLA="--model.attention=mla --model.n_kv_heads=0 --model.kv_lora_rank=32 --model.q_lora_rank=48 --model.qk_nope_dim=16 --model.qk_rope_dim=8 --model.v_head_dim=16"
MOE="--moe.experts=4 --moe.top_k=2 --moe.shared_experts=1 --moe.ffn_dim=64 --moe.aux_coef=0.01"
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
  "recompute_full|2|--parallel.pp=2 --parallel.microbatches=8 --train.recompute=full"
  "recompute_sel|2|--parallel.tp=2 --parallel.microbatches=8 --train.recompute=selective"
  "cp2|2|--parallel.cp=2 --parallel.microbatches=8"
  "cp2_docs|2|--parallel.cp=2 --parallel.microbatches=8 --data.document_mask=true --data.eos_id=10"
  "mla|1|--parallel.microbatches=8 $MLA"
  "mla_tp2_cp2|4|--parallel.tp=2 --parallel.cp=2 --parallel.microbatches=8 $MLA"
  "mla_bf16_full|1|--parallel.microbatches=8 --train.precision=bf16 --train.recompute=full $MLA"
  "moe|1|--parallel.microbatches=8 $MOE"
  "moe_ep2|2|--parallel.ep=2 --parallel.microbatches=4 $MOE"
  "moe_tp2_sp|2|--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8 $MOE"
  "moe_auxfree_ep2_pp2|4|--parallel.ep=2 --parallel.pp=2 --parallel.microbatches=4 --moe.balance=aux_free --moe.bias_rate=0.01 --moe.layers=1,2,3 $MOE"
  "mla_moe_bf16_sel|2|--parallel.ep=2 --parallel.microbatches=4 --train.precision=bf16 --train.recompute=selective $MLA $MOE"
  "zero2|2|--parallel.microbatches=4 --parallel.zero=2"
  "zero3|2|--parallel.microbatches=4 --parallel.zero=3"
  "zero3_bf16_tied|2|--parallel.microbatches=4 --parallel.zero=3 --train.precision=bf16 --model.tie_embeddings=true"
  "zero3_moe_ep2|2|--parallel.ep=2 --parallel.microbatches=4 --parallel.zero=3 $MOE"
  "zero2_pp2_mla|4|--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=2 $MLA"
  "pp2_zbh1|2|--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zb_h1"
  "pp2_zbv|2|--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zbv --parallel.virtual_stages=2"
  "zbv_tied_bf16|2|--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zbv --parallel.virtual_stages=2 --model.tie_embeddings=true --train.precision=bf16"
  "zbh1_full|2|--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zb_h1 --train.recompute=full"
  "zbh1_sel_mla|2|--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zb_h1 --train.recompute=selective $MLA"
  "zbh1_mla_moe_bf16|2|--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zb_h1 --train.precision=bf16 $MLA $MOE"
  "zbv_zero3_moe|4|--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=zbv --parallel.virtual_stages=2 --parallel.zero=3 $MOE"
)
# PROOF_ONLY=regex runs the layouts whose names match it (then the checkpoint checks as always).
if [ -n "${PROOF_ONLY:-}" ]; then
  kept=(); for r in "${runs[@]}"; do [[ "${r%%|*}" =~ $PROOF_ONLY ]] && kept+=("$r"); done; runs=("${kept[@]}")
fi
for r in "${runs[@]}"; do
  IFS='|' read -r name ranks args <<< "$r"
  for which in old new; do
    bin=$old data=$work/data_old.h5; [ $which = new ] && bin=$new data=$work/data.h5
    # shellcheck disable=SC2086
    mpirun --oversubscribe -n "$ranks" "$bin" train "$work/deck" $args --data.path="$data" \
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
tol = float(__import__("os").environ.get("PROOF_TOLERANCE", "0"))
sys.exit(0 if worst <= tol else 1)
PY
# Step-0 checkpoints of every layout, new binary: bit-identical tensors.
for r in "1rank|1|" "tp2_sp|2|--parallel.tp=2 --parallel.sequence_parallel=true" "pp2|2|--parallel.pp=2" \
         "zero_dp2|2|--parallel.zero=1" "tp2_pp2|4|--parallel.tp=2 --parallel.pp=2" \
         "cp2|2|--parallel.cp=2"; do
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
# The same for an MLA + MoE model (experts split over ep, latent projections over tp).
for r in "1rank|1|" "ep2|2|--parallel.ep=2" "tp2_sp|2|--parallel.tp=2 --parallel.sequence_parallel=true" \
         "pp2_ep2|4|--parallel.pp=2 --parallel.ep=2" "zero_ep2|2|--parallel.ep=2 --parallel.zero=1"; do
  IFS='|' read -r name ranks args <<< "$r"
  # shellcheck disable=SC2086
  mpirun --oversubscribe -n "$ranks" "$new" train "$work/deck" $args $MLA $MOE --moe.layers=1,2,3 --train.steps=0 \
    --output.run_dir="$work/step0_moe/$name" > "$work/step0_moe/$name.log" 2>&1 || { echo "FAILED step0 moe $name"; exit 1; }
done
/usr/bin/python3 - "$work/step0_moe" <<'PY'
import sys, glob, h5py, numpy as np
work = sys.argv[1]
def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
files = sorted(glob.glob(f"{work}/*/checkpoints/step_00000000.h5"))
ref = tensors(files[0])
for p in files[1:]:
    t = tensors(p)
    assert t.keys() == ref.keys(), p
    for k in ref:
        assert np.array_equal(t[k].view(np.uint32), ref[k].view(np.uint32)), (p, k)
print(f"step-0 checkpoints, MLA + MoE: {len(files)} layouts, {len(ref)} tensors each, bit-identical")
PY
# The old binary's step-0 checkpoint against the new one's, bit for bit.
mpirun --oversubscribe -n 1 "$old" train "$work/deck" --train.steps=0 --data.path="$work/data_old.h5" \
  --output.run_dir="$work/step0_old" \
  > "$work/step0_old.log" 2>&1 || { echo "FAILED step0 old"; exit 1; }
/usr/bin/python3 - "$work/step0_old/checkpoints/step_00000000.h5" "$work/step0/1rank/checkpoints/step_00000000.h5" <<'PY'
import sys, h5py, numpy as np
def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
# A format may grow (a new state dataset) but never lose what an older one wrote.
assert set(a) <= set(b), f"datasets the new binary no longer writes: {sorted(set(a) - set(b))}"
for k in a:
    assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k
added = sorted(set(b) - set(a))
print(f"step-0 checkpoint of the old binary = the new one's ({len(a)} tensors, bit for bit)"
      + (f"; the new one adds {', '.join(added)}" if added else ""))
PY
# A checkpoint written by the old binary resumes with the new one (same model, same curve).
mpirun --oversubscribe -n 2 "$new" train "$work/deck" --parallel.microbatches=4 --train.steps=10 \
  --checkpoint.resume="$(ls "$work"/old/dp2/checkpoints/step_*.h5 | tail -1)" \
  --output.run_dir="$work/resume_old" > "$work/resume_old.log" 2>&1 && grep -q "resumed from" "$work/resume_old.log" \
  && echo "a checkpoint of the old binary loads into the new one" || { echo "FAILED: old checkpoint"; exit 1; }
