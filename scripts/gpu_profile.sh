#!/usr/bin/env bash
# The second device call (docs/cuda.md, "The first GPU run"): on the machine where
# scripts/gpu_check.sh has just run (its build folder, with the bundle's prefix, kept), where the
# training step of the benchmark spends its time, and the slowest kernel in detail.
#   1. nsys, if installed: quintet_cuda_bench's step, kernels by total GPU time -> kernels.txt
#   2. ncu, if installed: the slowest kernel of step 1 (else the first the benchmark launches) once,
#      full section set -> slowest_kernel.txt
#   3. neither: `quintet train --train.device=cuda --train.profile=true` on the quickstart data
#      with a d_model 1024 model (the trainer's own per-operation table) -> train_profile.txt
#
#   scripts/gpu_profile.sh [--preset medium] [--precision bf16] [--steps 3]
# Environment: GPU_PROFILE_OUT (runs/gpu_profile), GPU_CHECK_BUILD (build-gpu), GPU_PROFILE_BUDGET
#   (seconds, 200). Exit status 0 if at least one profile was written.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

die() { echo "gpu_profile.sh: $*" >&2; exit 2; }
PRESET=medium PRECISION=bf16 STEPS=3
while [[ $# -gt 0 ]]; do
    case "$1" in
        --preset) [[ ${2:-} =~ ^(small|medium)$ ]] || die "--preset: small or medium"; PRESET=$2; shift ;;
        --precision) [[ ${2:-} =~ ^(bf16|fp32)$ ]] || die "--precision: bf16 or fp32"; PRECISION=$2; shift ;;
        --steps) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--steps: a positive integer"; STEPS=$2; shift ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (valid: --preset, --precision, --steps, --help)" ;;
    esac
    shift
done
OUT=${GPU_PROFILE_OUT:-runs/gpu_profile}
BUILD=${GPU_CHECK_BUILD:-build-gpu}
BUDGET=${GPU_PROFILE_BUDGET:-200}
[[ $BUDGET =~ ^[1-9][0-9]*$ ]] || die "GPU_PROFILE_BUDGET='$BUDGET' is not a number of seconds"
BENCH=$BUILD/quintet_cuda_bench
[[ -x $BENCH ]] || die "$BENCH not found: run scripts/gpu_check.sh first (same machine, same GPU_CHECK_BUILD)"
mkdir -p "$OUT" || die "cannot create $OUT"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) - 10 )); }
log() { echo "[gpu_profile $(( $(date +%s) - T0 ))s] $*"; }

# The libraries as gpu_check.sh used them: its bundle prefix if it made one.
if [[ -f $BUILD/bundle-prefix/.unpacked ]]; then
    # shellcheck source=scripts/bundle_env.sh
    source scripts/bundle_env.sh
    bundle_activate .gpu-bundle "$BUILD/bundle-prefix" || die "the bundle's prefix cannot be used"
fi
[[ -d $BUILD/bundle-prefix/nccl/lib ]] && export LD_LIBRARY_PATH="$BUILD/bundle-prefix/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for d in /usr/local/cuda/bin /opt/nvidia/nsight-systems/*/bin /opt/nvidia/nsight-compute/*; do
    [[ -d $d ]] && PATH="$PATH:$d"
done
bench=("$BENCH" --presets "$PRESET" --precisions "$PRECISION" --steps "$STEPS" --no_gemm)
wrote=0 top=""

if command -v nsys >/dev/null 2>&1; then
    log "nsys: ${bench[*]}"
    if timeout "$(left)" nsys profile --force-overwrite=true -o "$OUT/bench" "${bench[@]}" > "$OUT/nsys.log" 2>&1; then
        nsys stats --report cuda_gpu_kern_sum --format csv "$OUT/bench.nsys-rep" > "$OUT/kernels.csv" 2>> "$OUT/nsys.log" ||
            nsys stats --report gpukernsum --format csv "$OUT/bench.nsys-rep" > "$OUT/kernels.csv" 2>> "$OUT/nsys.log"
        # Columns: Time (%), Total Time (ns), Instances, Avg, Med, Min, Max, StdDev, Name.
        python3 - "$OUT/kernels.csv" > "$OUT/kernels.txt" 2>> "$OUT/nsys.log" <<'PYEOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) >= 9]
head, body = rows[0], rows[1:]
print("time%  total_ms  calls  avg_us  kernel")
for r in body[:30]:
    print(f"{float(r[0]):5.1f} {float(r[1]) / 1e6:9.2f} {int(r[2]):6d} {float(r[3]) / 1e3:7.1f}  {r[-1][:160]}")
PYEOF
        [[ -s $OUT/kernels.txt ]] && wrote=1
        top=$(sed -n '2p' "$OUT/kernels.txt" | sed -E 's/^ *[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+  //')
        log "slowest kernel (total time): ${top:-?}"
    else
        log "nsys failed (nsys.log)"
    fi
    rm -f "$OUT/bench.nsys-rep" "$OUT/bench.sqlite"   # large; kernels.txt holds the summary
fi

if command -v ncu >/dev/null 2>&1 && (( $(left) > 30 )); then
    sel=()
    if [[ -n $top ]]; then
        # ncu matches the function name without namespace, template arguments or parameters.
        base=$(sed -E 's/^void //; s/[<(].*//; s/.*:://' <<< "$top")
        sel=(--kernel-name-base function --kernel-name "regex:^${base}$")
    fi
    log "ncu: ${base:-the first kernel}, one launch, full sections"
    timeout "$(left)" ncu --set full "${sel[@]}" --launch-count 1 "${bench[@]}" > "$OUT/slowest_kernel.txt" 2>&1 &&
        wrote=1 || log "ncu failed (slowest_kernel.txt)"
fi

if [[ $wrote == 0 ]] && (( $(left) > 30 )); then
    # The quickstart data (gpu_check.sh made it) with a model of the benchmark's medium size.
    big=(--model.d_model=1024 --model.n_layers=8 --model.n_heads=16 --model.n_kv_heads=4 --model.ffn_dim=2816
         --data.seq_len=1024 --data.micro_batch_size=8)
    log "no nsys/ncu result: the trainer's profile table (quickstart data, a d_model 1024 model, cuda, $PRECISION)"
    MPIEXEC=$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
    [[ -x $MPIEXEC ]] || MPIEXEC=mpirun
    timeout "$(left)" "$MPIEXEC" -n 1 "$BUILD/quintet" train inputs/quickstart.deck "${big[@]}" --train.device=cuda \
        --train.precision="$PRECISION" --train.steps=$(( STEPS + 2 )) --train.profile=true --eval.every=0 \
        --checkpoint.every=0 --output.run_dir="$BUILD/profile_train" --train.peak_tflops="${PEAK_TFLOPS:-989}" \
        > "$OUT/train_profile.txt" 2>&1 && wrote=1 || log "the profiled training run failed (train_profile.txt)"
    rm -rf "$BUILD/profile_train"   # its final checkpoint is ~1 GB, and nothing reads it
fi
log "done: $OUT ($(ls "$OUT" | tr '\n' ' '))"
[[ $wrote == 1 ]]
