// The Backend's matmuls on the CPU (the twin of src/kernels/cuda/gemm_cublas.cu): every gemm
// goes through sgemm below, which runs quintet's own GEMM for the host's ISA (cpu_gemm.cpp,
// chosen once by QUINTET_CPU_GEMM) or else the BLAS's cblas_sgemm.
//
// bf16 on the CPU exists to run the mixed-precision model path (and check its numerics) on
// machines without a GPU: this CPU has no bf16 arithmetic, so gemm_bf16 widens its operands
// into scratch (grown once, reused) and runs sgemm -- exact products, fp32 sums, like a
// tensor core; slower than fp32, not faster.
#include <cblas.h>

#include "cpu_backend.hpp"

namespace quintet::cpu {

void CpuBackend::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                      const float* B, int ldb, float beta, float* C, int ldc) {
    sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void CpuBackend::gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha,
                           const bf16_bits* A, int lda, const bf16_bits* B, int ldb, float beta,
                           float* C, int ldc) {
    // op(A) is M x K: stored rows x cols = (ta ? K x M : M x K); likewise B.
    const float* a = widen(wide_a_, A, ta ? K : M, ta ? M : K, lda);
    const float* b = widen(wide_b_, B, tb ? N : K, tb ? K : N, ldb);
    sgemm(ta, tb, M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, C, ldc);
}

// Every matmul: quintet's GEMM for the host's ISA (cpu_gemm.hpp), else the BLAS.
void CpuBackend::sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                       const float* B, int ldb, float beta, float* C, int ldc) {
    if (gemm_ != GemmKernel::blas)
        return own_sgemm(gemm_, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads_);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// rows x cols of a bf16 matrix with leading dimension ld, widened into dense fp32 scratch.
const float* CpuBackend::widen(std::vector<float>& buf, const bf16_bits* x, int rows, int cols,
                               int ld) {
    const size_t n = size_t(rows) * cols;
    if (buf.size() < n) buf.resize(n);  // grows during the first step only
    float* out = buf.data();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) out[size_t(r) * cols + c] = bf16_to_float(x[size_t(r) * ld + c]);
    return out;
}

}  // namespace quintet::cpu
