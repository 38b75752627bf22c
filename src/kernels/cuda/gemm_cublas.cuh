// Row-major GEMMs on cuBLAS (fp32: cublasSgemm, TF32 off by default) and cuBLASLt (bf16
// inputs, fp32 accumulation, fp32 or bf16 output). Row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T: the same buffers with A and B swapped, no copies.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>

#include "device_pool.cuh"

namespace quintet::cuda {

class Blas {
public:
    Blas(cudaStream_t st, DevicePool& pool);
    ~Blas();
    Blas(const Blas&) = delete;
    Blas& operator=(const Blas&) = delete;

    void set_tf32(bool on);
    // C[M,N] = alpha op(A) op(B) + beta C, row-major, as Backend::gemm.
    void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);
    // The same with bf16 A, B; fp32 compute; C fp32 (c_bf16 = false) or bf16.
    void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
                   const uint16_t* B, int ldb, float beta, void* C, bool c_bf16, int ldc);

private:
    struct Plan {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        cublasLtMatmulAlgo_t algo{};
    };
    // (ta, tb, M, N, K, lda, ldb, ldc, c_bf16, align A, align B, align C)
    using PlanKey = std::array<int64_t, 12>;
    const Plan& plan(const PlanKey& key);

    cudaStream_t st_;
    DevicePool& pool_;
    cublasHandle_t handle_ = nullptr;
    cublasLtHandle_t lt_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 0;
    std::map<PlanKey, Plan> plans_;  // heuristics run once per shape
};

}  // namespace quintet::cuda
