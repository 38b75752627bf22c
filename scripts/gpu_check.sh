#!/usr/bin/env bash
# Everything the CUDA backend needs verified on a GPU, in one run (< 8 minutes on one H200):
#   0. the libraries: the system's if it has Open MPI, parallel HDF5, Boost.Program_options, BLIS
#      and GoogleTest, else the GPU bundle (.gpu-bundle/, scripts/gpu_bundle.sh) unpacked into a
#      private prefix (scripts/bundle_env.sh); NCCL from the system, the CUDA toolkit or the pip
#      package beside PyTorch
#   1. configure + build with -DQUINTET_CUDA=ON (for this GPU's architecture only, to save time)
#   2. ctest -L '^gpu$' (CUDA vs CPU, kernel by kernel; the model for 20 steps; NCCL on one rank)
#      and the emulated-kernel test
#   2b. `quintet train` for 20 steps of a tiny deck with train.device = cpu and = cuda, in fp32
#      and bf16 (1 rank; with 2+ GPUs also tp=2 and dp=2 with the overlapped reduction over
#      NCCL): cuda fp32 vs cpu fp32 to 1e-4, cuda bf16 vs cpu bf16 to 2e-3, bf16 vs fp32 to 2%;
#      and MLA (model.attention = mla) and MoE (moe.experts = 4), cuda vs cpu fp32 to 1e-4
#   3. quintet_cuda_bench: cuBLAS/cuBLASLt GEMM rates, then the training step of a ~125M and a
#      ~350M model at seq 1024 in bf16 and fp32 (tokens/s, MFU against the bf16 dense peak);
#      3b. --planner_gemms mc24: the GEMMs the GPU planner costs for the published H100 runs'
#      shapes, each measured beside the planner's own time for it (docs/planner.md §8)
#   4. a short report: $OUT/report.md (raw logs beside it), written even when a step fails (the
#      failed step and its log's tail); every step is cut to fit the time budget
#
#   scripts/gpu_check.sh            full run
#   scripts/gpu_check.sh --quick    small model only, fewer steps
#   scripts/gpu_check.sh --cpu      rehearsal without a GPU: steps 0-2b on the CPU backend
#                                   (-DQUINTET_CUDA=OFF; quintet and two MPI tests; the quickstart
#                                   deck on 1 and 2 ranks); tests/gpu_bundle runs it offline
# Environment: GPU_CHECK_OUT (runs/gpu_check), GPU_CHECK_BUILD (build-gpu), JOBS (nproc),
#   CUDA_ARCH (detected with nvidia-smi, else "80;90"), PEAK_TFLOPS (989: H100/H200 SXM bf16 dense),
#   GPU_CHECK_BUDGET (seconds for the whole run: 470, --cpu 3600), GPU_CHECK_BUNDLE (auto: the
#   bundle only if libraries are missing | yes | no), GPU_CHECK_COMMIT (shown when there is no git).
# Exit status: 0 only if every step succeeded (on a GPU; with --cpu, steps 0-2b on the CPU).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

OUT=${GPU_CHECK_OUT:-runs/gpu_check}
BUILD=${GPU_CHECK_BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
PEAK=${PEAK_TFLOPS:-989}
USE_BUNDLE=${GPU_CHECK_BUNDLE:-auto}
PRESETS="small,medium"
STEPS=10
CPU_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --quick) PRESETS="small"; STEPS=4 ;;
        --cpu) CPU_ONLY=1 ;;
        -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$arg' (valid: --quick, --cpu, --help)" >&2; exit 2 ;;
    esac
done
case "$USE_BUNDLE" in auto|yes|no) ;;
    *) echo "gpu_check.sh: GPU_CHECK_BUNDLE='$USE_BUNDLE' (valid: auto, yes, no)" >&2; exit 2 ;; esac
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: JOBS='$JOBS' is not a positive integer" >&2; exit 2; }
BUDGET=${GPU_CHECK_BUDGET:-$([[ $CPU_ONLY == 1 ]] && echo 3600 || echo 470)}
[[ $BUDGET =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: GPU_CHECK_BUDGET='$BUDGET' is not a number of seconds" >&2; exit 2; }

mkdir -p "$OUT" || { echo "gpu_check.sh: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd -P)
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[gpu_check $(elapsed)s] $*"; }
# The time a step may take: its own cap, cut to what is left of the budget (15 s kept for the report).
tmo() { local left=$(( BUDGET - $(elapsed) - 15 )); (( left < 1 )) && left=1; (( left < $1 )) && echo "$left" || echo "$1"; }
have_time() { (( BUDGET - $(elapsed) - 15 >= ${1:-20} )); }
# Step caps: a GPU machine's 16 cores, or (--cpu) whatever the budget allows.
if [[ $CPU_ONLY == 1 ]]; then CAP_CONFIGURE=$BUDGET CAP_BUILD=$BUDGET CAP_TEST=$BUDGET CAP_RUN=$BUDGET
else CAP_CONFIGURE=240 CAP_BUILD=300 CAP_TEST=240 CAP_RUN=120; fi
status_deps=FAIL status_build=FAIL status_tests="not run" status_emulated="not run" status_bench="not run"
status_train="not run" failed_logs=()
fail_log() { failed_logs+=("$1|$2"); }  # step name | log file

# ---- the machine ------------------------------------------------------------------------------
GPU_NAME="none" CAP=""
if [[ $CPU_ONLY == 0 ]] && command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
    GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
    CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
fi
ARCH=${CUDA_ARCH:-${CAP:-"80;90"}}
[[ -z "$ARCH" ]] && ARCH="80;90"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo "${GPU_CHECK_COMMIT:-unknown (no git)}")
DIRTY=$(git status --porcelain 2>/dev/null | grep -q . && echo " (+ uncommitted changes)" || true)
if [[ $CPU_ONLY == 1 ]]; then log "CPU rehearsal (--cpu); commit $COMMIT$DIRTY; budget ${BUDGET}s"
else log "GPU: ${GPU_NAME:-none}; CUDA arch $ARCH; commit $COMMIT$DIRTY; budget ${BUDGET}s"; fi

# ---- 0. the libraries -------------------------------------------------------------------------
# CMake (and ninja) may come as pip packages, in PyTorch's environment rather than on PATH.
for t in cmake ctest; do
    command -v $t >/dev/null 2>&1 || [[ ! -x /opt/torch/.venv/bin/$t ]] || export PATH="$PATH:/opt/torch/.venv/bin"
done
command -v cmake >/dev/null 2>&1 && command -v ctest >/dev/null 2>&1 ||
    { echo "gpu_check.sh: cmake/ctest not found on PATH (nor in /opt/torch/.venv/bin)" >&2; exit 2; }
# shellcheck source=scripts/bundle_env.sh
source scripts/bundle_env.sh
BUNDLE_CMAKE_ARGS=()
DEPS="system"
{
    if sys_missing=$(bundle_libraries_missing); then sys_ok=1; else sys_ok=0; fi
    echo "system libraries: $([[ $sys_ok == 1 ]] && echo "all present" || echo "missing: $sys_missing")"
    if [[ $USE_BUNDLE == yes || ( $USE_BUNDLE == auto && $sys_ok == 0 ) ]]; then
        if bundle_activate .gpu-bundle "$BUILD/bundle-prefix"; then
            n_b=$(grep -c '^bundle ' "$QUINTET_BUNDLE_PREFIX/unpack.log")
            n_s=$(grep -c '^system ' "$QUINTET_BUNDLE_PREFIX/unpack.log")
            DEPS="bundle: $n_b packages unpacked into $QUINTET_BUNDLE_PREFIX, $n_s left to the system's copies"
            if [[ $BUNDLE_FRESH == 1 && -f $BUILD/CMakeCache.txt ]]; then
                echo "the prefix was unpacked anew: dropping $BUILD's CMake cache (it may name files now gone)"
                rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
            fi
            cat "$QUINTET_BUNDLE_PREFIX/unpack.log"
            status_deps=ok
        fi
    elif [[ $sys_ok == 1 ]]; then
        status_deps=ok
    else
        echo "GPU_CHECK_BUNDLE=no but the system lacks: $sys_missing"
    fi
    echo "PATH=$PATH"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; env | grep -E '^(OPAL|PMIX|OMPI_MCA)_' || true
} > "$OUT/deps.log" 2>&1
[[ $status_deps == ok ]] || { DEPS="none usable"; fail_log "libraries" "$OUT/deps.log"; }
NCCL="not needed (--cpu)"
BUILD_ARGS=(-DQUINTET_CUDA=OFF)
if [[ $CPU_ONLY == 0 ]]; then
    BUILD_ARGS=(-DQUINTET_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH")
    if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
    if nccl=$(bundle_find_nccl "$BUILD/bundle-prefix" 2>> "$OUT/deps.log"); then
        NCCL_DIR=${nccl%%$'\t'*}; NCCL=${nccl#*$'\t'}
        BUILD_ARGS+=("-DNCCL_ROOT=$NCCL_DIR")
        export LD_LIBRARY_PATH="$NCCL_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        NCCL="NOT FOUND: the NCCL communicator is not built (see deps.log)"
    fi
fi
log "libraries: $status_deps ($DEPS); NCCL: $NCCL"
# ICU is not in the bundle (its size): without it the build leaves out tokenizer.json's NFC.
if [[ ! -f /usr/include/unicode/normalizer2.h ]]; then
    BUILD_ARGS+=(-DQUINTET_NFC=OFF)
    log "no ICU headers: building with -DQUINTET_NFC=OFF (tokenizer.json files with an NFC normalizer are refused)"
fi

# ---- 1. build ---------------------------------------------------------------------------------
GEN=()
[[ ! -f $BUILD/CMakeCache.txt ]] && command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
# Only what the steps below run (the other ~30 test programs would cost device minutes).
if [[ $CPU_ONLY == 1 ]]; then TARGETS=(--target quintet test_deck test_communicator)
else TARGETS=(--target quintet quintet_cuda_bench test_cuda_vs_cpu test_cuda_kernels_emulated); fi
if [[ $status_deps == ok ]]; then
    log "configure + build into $BUILD (-j$JOBS)"
    configure() {
        timeout "$(tmo "$CAP_CONFIGURE")" cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
            "${BUILD_ARGS[@]}" "${BUNDLE_CMAKE_ARGS[@]}" > "$OUT/configure.log" 2>&1
    }
    # A cache from an earlier, other configuration (system vs bundle, a failed try) can pin wrong
    # results (HDF5_IS_PARALLEL...): one retry from a clean cache.
    cfg_ok=0
    if [[ -f $BUILD/CMakeCache.txt ]]; then
        if configure; then cfg_ok=1; else
            log "configure failed with the existing cache: retrying from a clean one"
            rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
            GEN=(); command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
        fi
    fi
    [[ $cfg_ok == 1 ]] || { configure && cfg_ok=1; }
    if [[ $cfg_ok == 1 ]]; then
        limit=$(tmo "$CAP_BUILD")
        timeout "$limit" cmake --build "$BUILD" -j "$JOBS" "${TARGETS[@]}" > "$OUT/build.log" 2>&1
        rc=$?
        if [[ $rc == 0 ]]; then status_build=ok; else
            [[ $rc == 124 ]] && status_build="FAIL (stopped at its time limit, $limit s)"
            fail_log "build" "$OUT/build.log"
        fi
    else
        status_build="FAIL (configure)"; fail_log "configure" "$OUT/configure.log"
    fi
    grep -E "^-- quintet:|Found (MPI|HDF5|Boost|GTest|OpenMP|CUDAToolkit)" "$OUT/configure.log" > "$OUT/configure_summary.txt" 2>/dev/null
fi
BUILD_S=$(elapsed)
log "build: $status_build"

# ---- 2. tests ---------------------------------------------------------------------------------
if [[ $status_build == ok && $CPU_ONLY == 1 ]]; then
    log "ctest: test_deck (one process, MPI singleton) and test_communicator (4 ranks under mpiexec)"
    status_tests=FAIL
    timeout "$(tmo "$CAP_TEST")" ctest --test-dir "$BUILD" -R '^(test_deck|test_communicator)$' \
        --output-on-failure --timeout "$(tmo "$CAP_TEST")" > "$OUT/ctest_cpu.log" 2>&1 &&
        grep -q "100% tests passed, 0 tests failed out of 2" "$OUT/ctest_cpu.log" && status_tests=ok
    [[ $status_tests == ok ]] || fail_log "tests" "$OUT/ctest_cpu.log"
    log "tests: $status_tests"
elif [[ $status_build == ok ]]; then
    log "ctest -L '^gpu\$'"
    status_tests=FAIL
    timeout "$(tmo "$CAP_TEST")" ctest --test-dir "$BUILD" -L '^gpu$' --output-on-failure --timeout 200 -V \
        > "$OUT/ctest_gpu.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]] && ! grep -q "QUINTET_GPU_TESTS_SKIPPED" "$OUT/ctest_gpu.log" \
       && grep -q "\[  PASSED  \]" "$OUT/ctest_gpu.log"; then
        status_tests=ok
    elif grep -q "QUINTET_GPU_TESTS_SKIPPED" "$OUT/ctest_gpu.log"; then
        status_tests="SKIPPED (no usable GPU: $(grep -m1 -o 'QUINTET_GPU_TESTS_SKIPPED: .*' "$OUT/ctest_gpu.log" | head -1 | cut -d' ' -f2- | tr -d '\r'))"
    fi
    [[ $status_tests == ok ]] || fail_log "ctest -L '^gpu\$'" "$OUT/ctest_gpu.log"
    log "gpu tests: $status_tests"
    if have_time 30; then
        status_emulated=FAIL
        timeout "$(tmo 120)" ctest --test-dir "$BUILD" -R test_cuda_kernels_emulated --output-on-failure \
            > "$OUT/ctest_emulated.log" 2>&1 && status_emulated=ok
        [[ $status_emulated == ok ]] || fail_log "emulated kernels" "$OUT/ctest_emulated.log"
    else
        status_emulated="not run (out of time)"
    fi
    log "emulated kernels: $status_emulated"
fi

# ---- 2b. the trainer on the GPU vs the CPU ----------------------------------------------------
if [[ $status_build == ok ]]; then
    log "trainer: 20 steps, $([[ $CPU_ONLY == 1 ]] && echo "1 and 2 ranks, fp32 and bf16" || echo "cpu vs cuda")"
    Q="$BUILD/quintet"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    [[ $CPU_ONLY == 1 ]] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    # The mpiexec CMake found (the bundle's, or the system's that matches the build's MPI).
    MPIEXEC=$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$BUILD/CMakeCache.txt")
    [[ -x $MPIEXEC ]] || MPIEXEC=mpirun
    [[ -f data/quickstart.h5 ]] || { bash scripts/make_corpus.sh data/quickstart.txt >/dev/null &&
        "$Q" prepare --input data/quickstart.txt --tokenizer byte --output data/quickstart.h5 >/dev/null; } \
        > "$OUT/prepare.log" 2>&1
    common=(--train.steps=20 --eval.every=0 --checkpoint.every=0 --output.log_every=1 --train.peak_tflops="${PEAK}")
    ok=1
    if [[ $CPU_ONLY == 1 ]]; then
        runs=("1 cpu fp32" "1 cpu bf16" "2 cpu fp32 --parallel.tp=2")
    else
        # NCCL needs one GPU per rank: the 2-rank runs need two GPUs.
        NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
        runs=("1 cpu fp32" "1 cuda fp32" "1 cpu bf16" "1 cuda bf16")
        if [[ ${NGPU:-0} -ge 2 ]]; then
            runs+=("2 cuda fp32 --parallel.tp=2" "2 cuda bf16 --parallel.dp=2 --parallel.microbatches=2 --parallel.bucket_mb=0.05")
        else
            log "one GPU: the tp=2 / dp=2 NCCL runs need two (skipped)"
        fi
    fi
    train_run() {  # dir-name ranks device extra-args...: one `quintet train` under mpiexec
        local name=$1 n=$2 dev=$3; shift 3
        local dir="$OUT/$name"; rm -rf "$dir"
        if ! have_time 20; then echo "not run: out of time" > "$dir.log"; ok=0; return; fi
        timeout "$(tmo "$CAP_RUN")" "$MPIEXEC" --oversubscribe -n "$n" "$Q" train inputs/quickstart.deck "${common[@]}" \
            --train.device="$dev" --output.run_dir="$dir" "$@" > "$dir.log" 2>&1 ||
            { ok=0; fail_log "train $name" "$dir.log"; }
        rm -rf "$dir/checkpoints"   # the final one (11 MB each): not compared, not worth carrying back
    }
    for spec in "${runs[@]}"; do
        read -r n dev prec extra <<< "$spec"
        # shellcheck disable=SC2086
        train_run "train_${n}_${dev}_${prec}" "$n" "$dev" --train.precision="$prec" $extra
    done
    if [[ $CPU_ONLY == 0 ]]; then
        # MLA (model.attention = mla) on the same deck, CPU against CUDA.
        mla=(--model.attention=mla --model.n_kv_heads=0 --model.kv_lora_rank=32 --model.q_lora_rank=48
             --model.qk_nope_dim=16 --model.qk_rope_dim=8 --model.v_head_dim=16)
        # MoE (4 experts, top-2, a shared expert) likewise.
        moe=(--moe.experts=4 --moe.top_k=2 --moe.shared_experts=1 --moe.ffn_dim=64)
        for dev in cpu cuda; do
            train_run "train_1_${dev}_fp32_mla" 1 "$dev" "${mla[@]}"
            train_run "train_1_${dev}_fp32_moe" 1 "$dev" "${moe[@]}"
        done
    fi
    # A Python for the comparison: h5py reads metrics.h5; without it the losses come from the logs.
    PY=""
    for p in ${PYTHON:-} /opt/torch/.venv/bin/python3 python3 /usr/bin/python3; do
        command -v "$p" >/dev/null 2>&1 || continue
        [[ -z $PY ]] && PY=$p
        "$p" -c 'import h5py' >/dev/null 2>&1 && { PY=$p; break; }
    done
    if [[ -n $PY ]] && "$PY" - "$OUT" > "$OUT/train_compare.txt" 2>&1 <<'PYEOF'
import os, re, sys
out = sys.argv[1]
try:
    import h5py
except ImportError:
    h5py = None
    print("(no h5py: losses from the logs, 4 decimals; each limit widened by their rounding, 1e-4/|loss|)")
def loss(run):
    if h5py is not None:
        return list(h5py.File(f"{out}/{run}/metrics.h5")["/train/loss"][:])
    vals = {}
    for line in open(f"{out}/{run}.log"):
        m = re.search(r"step +(\d+)/\d+ \| loss ([-+0-9.naif]+)", line)
        if m:
            vals[int(m.group(1))] = float(m.group(2))
    return [vals[k] for k in sorted(vals)]
ok, n = True, 0
# (run, reference, tolerance)
checks = [("train_1_cuda_fp32", "train_1_cpu_fp32", 1e-4), ("train_1_cuda_bf16", "train_1_cpu_bf16", 2e-3),
          ("train_1_cuda_bf16", "train_1_cpu_fp32", 2e-2), ("train_2_cuda_fp32", "train_1_cpu_fp32", 1e-4),
          ("train_2_cuda_bf16", "train_1_cpu_bf16", 2e-3), ("train_1_cuda_fp32_mla", "train_1_cpu_fp32_mla", 1e-4),
          ("train_1_cuda_fp32_moe", "train_1_cpu_fp32_moe", 1e-4),
          ("train_1_cpu_bf16", "train_1_cpu_fp32", 2e-2), ("train_2_cpu_fp32", "train_1_cpu_fp32", 1e-4)]
for run, ref, tol in checks:
    if not (os.path.exists(f"{out}/{run}.log") and os.path.exists(f"{out}/{ref}.log")):
        continue
    a, b = loss(run), loss(ref)
    # The logs' 4 decimals can move each relative difference by up to 1e-4/|loss|.
    slack = [0.0 if h5py is not None else 1e-4 / abs(y) for y in b]
    rel = [abs(x - y) / abs(y) for x, y in zip(a, b)]
    worst = max(rel, default=float("inf"))
    good = len(a) == len(b) == 20 and all(r <= tol + e for r, e in zip(rel, slack))
    ok &= good
    n += 1
    limit = f"{tol:g}" + (f" + rounding {max(slack):.1e}" if h5py is None else "")
    print(f"{run} vs {ref}: worst relative difference {worst:.2e} (limit {limit}) {'ok' if good else 'FAIL'}")
    print("   ", " ".join(f"{x:.5f}" for x in a))
sys.exit(0 if ok and n > 0 else 1)
PYEOF
    then cmp_ok=1; else cmp_ok=0; [[ -n $PY ]] || echo "no python3 found" > "$OUT/train_compare.txt"; fi
    if [[ $ok == 1 && $cmp_ok == 1 ]]; then
        status_train="ok ($(grep -c ' ok$' "$OUT/train_compare.txt") comparisons)"
    else
        status_train="FAIL (see train_*.log, train_compare.txt)"; fail_log "train comparison" "$OUT/train_compare.txt"
    fi
    log "trainer: $status_train"
fi

# ---- 3. benchmark -----------------------------------------------------------------------------
BENCH="$BUILD/quintet_cuda_bench"
if [[ $CPU_ONLY == 1 ]]; then
    status_bench="not run (--cpu)"
elif [[ $status_build == ok && -x "$BENCH" ]]; then
    if have_time 60; then
        log "benchmark: presets $PRESETS, $STEPS steps each"
        status_bench=FAIL
        if timeout "$(tmo 360)" "$BENCH" --presets "$PRESETS" --precisions bf16,fp32 --steps "$STEPS" --peak_tflops "$PEAK" \
                > "$OUT/bench.log" 2>&1 && grep -q "^model " "$OUT/bench.log"; then
            status_bench=ok
            grep -q "finite=0" "$OUT/bench.log" && status_bench="FAIL (non-finite loss)"
        fi
        [[ $status_bench == ok ]] || fail_log "benchmark" "$OUT/bench.log"
    else
        status_bench="not run (out of time: $(elapsed) s of ${BUDGET})"
    fi
    log "benchmark: $status_bench"
    # 3b. the GEMMs the planner costs for the Megatron-Core H100 runs' shapes, measured beside its
    # own time for each (docs/planner.md §8: what a Hopper-specific GEMM efficiency needs).
    # The planner's description of this GPU (nvidia-smi's names); none: not comparable, not run.
    case "${GPU_NAME:-}" in
        *H200*) PLAN_HW=h200 ;;
        *H100*PCIe*|*H100*NVL*) PLAN_HW="" ;;
        *H100*) PLAN_HW=h100-sxm ;;
        *A100-SXM4-80GB*|*A100*SXM*80GB*) PLAN_HW=a100-sxm-80g ;;
        *) PLAN_HW="" ;;
    esac
    if [[ -z $PLAN_HW ]]; then
        status_planner="not run (no built-in planner description of ${GPU_NAME:-this GPU})"
    elif have_time 30; then
        status_planner=FAIL
        if timeout "$(tmo 120)" "$BENCH" --no_gemm --presets "" --planner_gemms mc24 --hardware "$PLAN_HW" \
                > "$OUT/planner_gemms.log" 2>&1 && grep -q "^planner_layer " "$OUT/planner_gemms.log"; then
            status_planner=ok
        fi
        [[ $status_planner == ok ]] || fail_log "planner GEMMs" "$OUT/planner_gemms.log"
    else
        status_planner="not run (out of time: $(elapsed) s of ${BUDGET})"
    fi
    log "planner GEMMs: $status_planner"
fi

# ---- 4. report --------------------------------------------------------------------------------
kv() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$2"; }
{
    echo "# quintet GPU check$([[ $CPU_ONLY == 1 ]] && echo " (--cpu rehearsal, no GPU)")"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT$DIRTY"
    echo "- GPU: ${GPU_NAME:-none} (CUDA arch $ARCH)"
    echo "- libraries: $DEPS; NCCL: $NCCL"
    echo "- total time: $(elapsed) s of a ${BUDGET} s budget (build done at ${BUILD_S} s)"
    echo
    echo "| step | result |"
    echo "|---|---|"
    echo "| libraries (system, or the bundle) | $status_deps |"
    echo "| build (-DQUINTET_CUDA=$([[ $CPU_ONLY == 1 ]] && echo OFF || echo ON)) | $status_build |"
    if [[ $CPU_ONLY == 1 ]]; then
        echo "| ctest test_deck + test_communicator (MPI singleton, mpiexec -n 4) | $status_tests |"
        echo "| quintet train, 20 steps: 1 rank fp32, bf16; 2 ranks (tp=2) | $status_train |"
    else
        echo "| ctest -L '^gpu$' (CUDA vs CPU, model 20 steps, NCCL 1 rank) | $status_tests |"
        echo "| emulated kernels (device code on CPU threads) | $status_emulated |"
        echo "| quintet train, 20 steps, cuda vs cpu, fp32 and bf16 | $status_train |"
    fi
    echo "| benchmark | $status_bench |"
    [[ $CPU_ONLY == 1 ]] || echo "| planner GEMMs measured (quintet_cuda_bench --planner_gemms mc24) | ${status_planner:-not run} |"
    echo
    if ((${#failed_logs[@]})); then
        echo "## What failed"
        echo
        for f in "${failed_logs[@]}"; do
            echo "### ${f%%|*} (${f#*|}, last 25 lines)"
            echo
            echo '```'
            tail -n 25 "${f#*|}" 2>/dev/null || echo "(no log)"
            echo '```'
            echo
        done
    fi
    if [[ -f "$OUT/ctest_gpu.log" ]]; then
        echo "## GPU tests"
        echo
        echo '```'
        grep -E "^([0-9]+: )?\[ +(OK|FAILED) +\]|tests passed|tests failed|\(Skipped\)" \
            "$OUT/ctest_gpu.log" | head -40
        grep -m1 "QUINTET_GPU_TESTS_SKIPPED" "$OUT/ctest_gpu.log"
        grep -E "Failure|Expected|actual|Which is" "$OUT/ctest_gpu.log" | head -20
        echo '```'
        echo
    fi
    if [[ -f "$OUT/train_compare.txt" ]]; then
        echo "## quintet train$([[ $CPU_ONLY == 0 ]] && echo ", cuda vs cpu")"
        echo
        echo '```'
        cat "$OUT/train_compare.txt"
        echo '```'
        echo
    fi
    if [[ -f "$OUT/bench.log" ]]; then
        echo "## Benchmark (training step; MFU against ${PEAK} TFLOP/s bf16 dense)"
        echo
        echo "| GEMM | size | TFLOP/s |"
        echo "|---|---|---|"
        while read -r line; do
            echo "| $(kv name "$line") | $(kv size "$line") | $(kv tflops "$line") |"
        done < <(grep "^gemm " "$OUT/bench.log")
        echo
        echo "| model | precision | matmul params | B x T | step ms | fwd ms | tokens/s | model TFLOP/s | MFU | loss first -> last | steady-state cudaMallocs |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|"
        while read -r line; do
            echo "| $(kv preset "$line") | $(kv precision "$line") | $(kv matmul_params "$line") | $(kv B "$line") x $(kv T "$line") | $(kv step_ms "$line") | $(kv fwd_ms "$line") | $(kv tokens_per_s "$line") | $(kv model_tflops "$line") | $(kv mfu "$line") | $(kv loss_first "$line") -> $(kv loss_last "$line") | $(kv steady_state_mallocs "$line") |"
        done < <(grep "^model " "$OUT/bench.log")
        grep -v -E "^(gemm|model|device) " "$OUT/bench.log" | head -20 | sed 's/^/    /'
        echo
    fi
    if [[ -f "$OUT/planner_gemms.log" ]]; then
        echo "## The planner's GEMMs, measured (bf16, cuBLASLt; planned/measured below 1: the planner is optimistic)"
        echo
        echo "| h | heads | tp | rows | layer ms | planned | planned/measured | head ms | planned | planned/measured |"
        echo "|---|---|---|---|---|---|---|---|---|---|"
        while read -r line; do
            echo "| $(kv h "$line") | $(kv heads "$line") | $(kv tp "$line") | $(kv rows "$line") | $(kv layer_ms "$line") | $(kv planned_layer_ms "$line") | $(kv layer_rate "$line") | $(kv head_ms "$line") | $(kv planned_head_ms "$line") | $(kv head_rate "$line") |"
        done < <(grep "^planner_layer " "$OUT/planner_gemms.log")
        echo
        echo "Per product: $OUT/planner_gemms.log (planner_gemm lines)."
        echo
    fi
    if [[ $CPU_ONLY == 0 ]]; then
        echo "Notes: the benchmark drives model/transformer on the CUDA backend directly (one ModelChunk,"
        echo "AdamW on fp32 master weights). bf16: cuBLASLt GEMMs with fp32 accumulation; the attention"
        echo "kernels are scalar fp32 in both precisions (no tensor cores), which bounds MFU; see"
        echo "docs/cuda.md."
    fi
    echo "Raw logs: $OUT/."
} > "$OUT/report.md"

log "report: $OUT/report.md"
cat "$OUT/report.md"
if [[ $CPU_ONLY == 1 ]]; then
    [[ $status_deps == ok && $status_build == ok && $status_tests == ok && $status_train == ok* ]]
else
    [[ $status_deps == ok && $status_build == ok && $status_tests == ok && $status_emulated == ok && $status_bench == ok && $status_train == ok* ]]
fi
