// cuBLAS / cuBLASLt GEMMs (see gemm_cublas.cuh for the row-major convention).
#include "cuda_check.cuh"
#include "gemm_cublas.cuh"

namespace quintet::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS' recommendation for sm_90

// Largest power of two (<= 256) dividing the address: the alignment cuBLASLt may assume.
int64_t alignment_of(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    int64_t al = 256;
    while (al > 1 && (a % uintptr_t(al)) != 0) al >>= 1;
    return al;
}

}  // namespace

Blas::Blas(cudaStream_t st, DevicePool& pool) : st_(st), pool_(pool) {
    QUINTET_CUBLAS_CHECK(cublasCreate(&handle_));
    QUINTET_CUBLAS_CHECK(cublasSetStream(handle_, st_));
    QUINTET_CUBLAS_CHECK(cublasLtCreate(&lt_));
    // An explicit workspace: cuBLAS never allocates behind our back, and the results do not
    // depend on which internal workspace a call happened to get.
    workspace_ = pool_.alloc(kWorkspaceBytes);
    workspace_bytes_ = kWorkspaceBytes;
    QUINTET_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
    set_tf32(false);
}

Blas::~Blas() {
    for (auto& [key, p] : plans_) {
        cublasLtMatrixLayoutDestroy(p.a);
        cublasLtMatrixLayoutDestroy(p.b);
        cublasLtMatrixLayoutDestroy(p.c);
        cublasLtMatmulDescDestroy(p.op);
    }
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    if (handle_ != nullptr) cublasDestroy(handle_);
    pool_.release(workspace_);
}

void Blas::set_tf32(bool on) {
    // CUBLAS_DEFAULT_MATH computes fp32 GEMMs in fp32 (unless NVIDIA_TF32_OVERRIDE=1 is set).
    QUINTET_CUBLAS_CHECK(
        cublasSetMathMode(handle_, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

void Blas::sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    // Column-major: C^T[N,M] = op(B)^T[N,K] op(A)^T[K,M]; the row-major buffers read
    // column-major are the transposes, so the flags carry over unchanged.
    QUINTET_CUBLAS_CHECK(cublasSgemm(handle_, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A,
                                     lda, &beta, C, ldc));
}

const Blas::Plan& Blas::plan(const PlanKey& key) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    const bool ta = key[0] != 0, tb = key[1] != 0;
    const int64_t M = key[2], N = key[3], K = key[4], lda = key[5], ldb = key[6], ldc = key[7];
    const bool c_bf16 = key[8] != 0;
    Plan p;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // cuBLASLt's "A" is the row-major B buffer, its "B" the row-major A buffer (see sgemm).
    const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                        sizeof(op_a)));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                        sizeof(op_b)));
    // Stored column-major shapes (rows, cols, ld).
    QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, tb ? K : N, tb ? N : K, ldb));
    QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, ta ? M : K, ta ? K : M, lda));
    QUINTET_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p.c, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, ldc));

    cublasLtMatmulPreference_t pref = nullptr;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    const auto al_a = uint32_t(key[10]), al_b = uint32_t(key[9]), al_c = uint32_t(key[11]);
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t rc =
        cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (rc != CUBLAS_STATUS_SUCCESS || found == 0) {
        cublasLtMatrixLayoutDestroy(p.a);
        cublasLtMatrixLayoutDestroy(p.b);
        cublasLtMatrixLayoutDestroy(p.c);
        cublasLtMatmulDescDestroy(p.op);
        QUINTET_CUBLAS_CHECK(rc);
        rank_fail("cuBLASLt found no bf16 GEMM algorithm for M=" + std::to_string(M) +
                  " N=" + std::to_string(N) + " K=" + std::to_string(K) + " lda=" +
                  std::to_string(lda) + " ldb=" + std::to_string(ldb) +
                  " ldc=" + std::to_string(ldc));
    }
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
}

void Blas::gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A,
                     int lda, const uint16_t* B, int ldb, float beta, void* C, bool c_bf16,
                     int ldc) {
    if (M <= 0 || N <= 0) return;
    const PlanKey key{ta, tb, M, N, K, lda, ldb, ldc, c_bf16, alignment_of(A), alignment_of(B),
                      alignment_of(C)};
    const Plan& p = plan(key);
    QUINTET_CUBLAS_CHECK(cublasLtMatmul(lt_, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c,
                                        &p.algo, workspace_, workspace_bytes_, st_));
}

}  // namespace quintet::cuda
