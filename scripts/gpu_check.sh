#!/usr/bin/env bash
# Everything the CUDA backend needs verified on a GPU, in one run (< 8 minutes on one H200):
#   1. configure + build with -DQUINTET_CUDA=ON (for this GPU's architecture only, to save time)
#   2. ctest -L gpu (CUDA vs CPU, kernel by kernel; the model for 20 steps; NCCL on one rank)
#      and the emulated-kernel test
#   2b. `quintet train` for 20 steps of a tiny deck with train.device = cpu and = cuda, in fp32
#      and bf16 (1 rank; with 2+ GPUs also tp=2 and dp=2 with the overlapped reduction over
#      NCCL): cuda fp32 vs cpu fp32 to 1e-4, cuda bf16 vs cpu bf16 to 2e-3, bf16 vs fp32 to 2%;
#      and MLA (model.attention = mla) and MoE (moe.experts = 4), cuda vs cpu fp32 to 1e-4
#   3. quintet_cuda_bench: cuBLAS/cuBLASLt GEMM rates, then the training step of a ~125M and a
#      ~350M model at seq 1024 in bf16 and fp32 (tokens/s, MFU against the bf16 dense peak)
#   4. a short report: $OUT/report.md (raw logs beside it)
#
#   scripts/gpu_check.sh            full run
#   scripts/gpu_check.sh --quick    small model only, fewer steps
# Environment: GPU_CHECK_OUT (runs/gpu_check), GPU_CHECK_BUILD (build-gpu), JOBS (nproc),
#   CUDA_ARCH (detected with nvidia-smi, else "80;90"), PEAK_TFLOPS (989: H100/H200 SXM bf16 dense).
# Exit status: 0 only if the build, the tests and the benchmark all succeeded on a GPU.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=${GPU_CHECK_OUT:-runs/gpu_check}
BUILD=${GPU_CHECK_BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
PEAK=${PEAK_TFLOPS:-989}
PRESETS="small,medium"
STEPS=10
for arg in "$@"; do
    case "$arg" in
        --quick) PRESETS="small"; STEPS=4 ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$arg' (valid: --quick, --help)" >&2; exit 2 ;;
    esac
done

mkdir -p "$OUT"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[gpu_check $(elapsed)s] $*"; }
status_build=FAIL status_tests=FAIL status_emulated=FAIL status_bench=FAIL

# ---- the machine ------------------------------------------------------------------------------
GPU_NAME="none"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
    GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
    CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
fi
ARCH=${CUDA_ARCH:-${CAP:-"80;90"}}
[[ -z "$ARCH" ]] && ARCH="80;90"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(git status --porcelain 2>/dev/null | grep -q . && echo " (+ uncommitted changes)" || true)
log "GPU: ${GPU_NAME:-none}; CUDA arch $ARCH; commit $COMMIT$DIRTY"

# ---- 1. build ---------------------------------------------------------------------------------
log "configure + build into $BUILD (-j$JOBS)"
if timeout 300 cmake -S . -B "$BUILD" -DQUINTET_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" > "$OUT/configure.log" 2>&1 \
   && timeout 300 cmake --build "$BUILD" -j "$JOBS" > "$OUT/build.log" 2>&1; then
    status_build=ok
fi
BUILD_S=$(elapsed)
log "build: $status_build"

# ---- 2. tests ---------------------------------------------------------------------------------
if [[ $status_build == ok ]]; then
    log "ctest -L gpu"
    timeout 240 ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 200 -V \
        > "$OUT/ctest_gpu.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]] && ! grep -q "QUINTET_GPU_TESTS_SKIPPED" "$OUT/ctest_gpu.log" \
       && grep -q "\[  PASSED  \]" "$OUT/ctest_gpu.log"; then
        status_tests=ok
    elif grep -q "QUINTET_GPU_TESTS_SKIPPED" "$OUT/ctest_gpu.log"; then
        status_tests="SKIPPED (no usable GPU: $(grep -m1 -o 'QUINTET_GPU_TESTS_SKIPPED: .*' "$OUT/ctest_gpu.log" | cut -d' ' -f2-))"
    fi
    log "gpu tests: $status_tests"
    timeout 120 ctest --test-dir "$BUILD" -R test_cuda_kernels_emulated --output-on-failure \
        > "$OUT/ctest_emulated.log" 2>&1 && status_emulated=ok
    log "emulated kernels: $status_emulated"
fi

# ---- 2b. the trainer on the GPU vs the CPU ----------------------------------------------------
status_train="not run"
if [[ $status_build == ok ]]; then
    log "trainer: 20 steps, cpu vs cuda"
    Q="$BUILD/quintet"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    [[ -f data/quickstart.h5 ]] || { bash scripts/make_corpus.sh data/quickstart.txt >/dev/null &&
        "$Q" prepare --input data/quickstart.txt --tokenizer byte --output data/quickstart.h5 >/dev/null; }
    common=(--train.steps=20 --eval.every=0 --checkpoint.every=0 --train.peak_tflops="${PEAK}")
    ok=1
    # NCCL needs one GPU per rank: the 2-rank runs need two GPUs.
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    runs=("1 cpu fp32" "1 cuda fp32" "1 cpu bf16" "1 cuda bf16")
    if [[ ${NGPU:-0} -ge 2 ]]; then
        runs+=("2 cuda fp32 --parallel.tp=2" "2 cuda bf16 --parallel.dp=2 --parallel.microbatches=2 --parallel.bucket_mb=0.05")
    else
        log "one GPU: the tp=2 / dp=2 NCCL runs need two (skipped)"
    fi
    for spec in "${runs[@]}"; do
        read -r n dev prec extra <<< "$spec"
        dir="$OUT/train_${n}_${dev}_${prec}"; rm -rf "$dir"
        # shellcheck disable=SC2086
        timeout 120 mpirun --oversubscribe -n "$n" "$Q" train inputs/quickstart.deck "${common[@]}" \
            --train.device="$dev" --train.precision="$prec" --output.run_dir="$dir" $extra \
            > "$dir.log" 2>&1 || ok=0
    done
    # MLA (model.attention = mla) on the same deck, CPU against CUDA.
    mla=(--model.attention=mla --model.n_kv_heads=0 --model.kv_lora_rank=32 --model.q_lora_rank=48
         --model.qk_nope_dim=16 --model.qk_rope_dim=8 --model.v_head_dim=16)
    # MoE (4 experts, top-2, a shared expert) likewise.
    moe=(--moe.experts=4 --moe.top_k=2 --moe.shared_experts=1 --moe.ffn_dim=64)
    for dev in cpu cuda; do
        dir="$OUT/train_1_${dev}_fp32_mla"; rm -rf "$dir"
        timeout 120 mpirun --oversubscribe -n 1 "$Q" train inputs/quickstart.deck "${common[@]}" "${mla[@]}" \
            --train.device="$dev" --output.run_dir="$dir" > "$dir.log" 2>&1 || ok=0
        dir="$OUT/train_1_${dev}_fp32_moe"; rm -rf "$dir"
        timeout 120 mpirun --oversubscribe -n 1 "$Q" train inputs/quickstart.deck "${common[@]}" "${moe[@]}" \
            --train.device="$dev" --output.run_dir="$dir" > "$dir.log" 2>&1 || ok=0
    done
    if [[ $ok == 1 ]] && "${PYTHON:-/usr/bin/python3}" - "$OUT" > "$OUT/train_compare.txt" 2>&1 <<'PYEOF'
import os, sys, h5py
out = sys.argv[1]
def loss(run):
    return h5py.File(f"{out}/{run}/metrics.h5")["/train/loss"][:]
ok = True
# (run, reference, tolerance)
checks = [("train_1_cuda_fp32", "train_1_cpu_fp32", 1e-4), ("train_1_cuda_bf16", "train_1_cpu_bf16", 2e-3),
          ("train_1_cuda_bf16", "train_1_cpu_fp32", 2e-2), ("train_2_cuda_fp32", "train_1_cpu_fp32", 1e-4),
          ("train_2_cuda_bf16", "train_1_cpu_bf16", 2e-3), ("train_1_cuda_fp32_mla", "train_1_cpu_fp32_mla", 1e-4),
          ("train_1_cuda_fp32_moe", "train_1_cpu_fp32_moe", 1e-4)]
for run, ref, tol in checks:
    if not os.path.exists(f"{out}/{run}/metrics.h5"):
        continue
    a, b = loss(run), loss(ref)
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    good = worst <= tol and len(a) == len(b) == 20
    ok &= good
    print(f"{run} vs {ref}: worst relative difference {worst:.2e} (limit {tol:g}) {'ok' if good else 'FAIL'}")
    print("   ", " ".join(f"{x:.5f}" for x in a))
sys.exit(0 if ok else 1)
PYEOF
    then status_train="ok ($(grep -c ' ok$' "$OUT/train_compare.txt") comparisons)"; else status_train="FAIL (see train_*.log, train_compare.txt)"; fi
    log "trainer: $status_train"
fi

# ---- 3. benchmark -----------------------------------------------------------------------------
BENCH="$BUILD/quintet_cuda_bench"
if [[ $status_build == ok && -x "$BENCH" ]]; then
    log "benchmark: presets $PRESETS, $STEPS steps each"
    if timeout 360 "$BENCH" --presets "$PRESETS" --precisions bf16,fp32 --steps "$STEPS" --peak_tflops "$PEAK" \
            > "$OUT/bench.log" 2>&1 && grep -q "^model " "$OUT/bench.log"; then
        status_bench=ok
        grep -q "finite=0" "$OUT/bench.log" && status_bench="FAIL (non-finite loss)"
    fi
    log "benchmark: $status_bench"
fi

# ---- 4. report --------------------------------------------------------------------------------
kv() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$2"; }
{
    echo "# quintet GPU check"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT$DIRTY"
    echo "- GPU: ${GPU_NAME:-none} (CUDA arch $ARCH)"
    echo "- total time: $(elapsed) s (build done at ${BUILD_S} s)"
    echo
    echo "| step | result |"
    echo "|---|---|"
    echo "| build (-DQUINTET_CUDA=ON) | $status_build |"
    echo "| ctest -L gpu (CUDA vs CPU, model 20 steps, NCCL 1 rank) | $status_tests |"
    echo "| emulated kernels (device code on CPU threads) | $status_emulated |"
    echo "| quintet train, 20 steps, cuda vs cpu, fp32 and bf16 | $status_train |"
    echo "| benchmark | $status_bench |"
    echo
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
    if [[ -f "$OUT/bench.log" ]]; then
        if [[ -f "$OUT/train_compare.txt" ]]; then
            echo "## quintet train, cuda vs cpu"
            echo
            echo '```'
            cat "$OUT/train_compare.txt"
            echo '```'
            echo
        fi
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
    echo "Notes: the benchmark drives model/transformer on the CUDA backend directly (one ModelChunk,"
    echo "AdamW on fp32 master weights). bf16: cuBLASLt GEMMs with fp32 accumulation; the attention"
    echo "kernels are scalar fp32 in both precisions (no tensor cores), which bounds MFU; see"
    echo "docs/cuda.md. Raw logs: $OUT/."
} > "$OUT/report.md"

log "report: $OUT/report.md"
cat "$OUT/report.md"
[[ $status_build == ok && $status_tests == ok && $status_emulated == ok && $status_bench == ok && $status_train == ok* ]]
