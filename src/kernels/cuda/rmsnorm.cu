// RMSNorm forward/backward on the GPU: one block per row for out/rstd/dinp (block reductions in
// a fixed order), and dw in two deterministic passes (per-chunk partials, then chunks in order).
#include <algorithm>

#include "common.cuh"
#include "rmsnorm_kernels.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"

namespace quintet::cuda {

using namespace kern;

void rmsnorm_forward(cudaStream_t st, float* out, float* rstd, const float* inp, const float* w,
                     int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    rmsnorm_forward_kernel<<<N, kThreads, 0, st>>>(out, rstd, inp, w, C, eps);
    QUINTET_CUDA_LAUNCHED();
}

size_t rmsnorm_backward_scratch_bytes(int N, int C) {
    return size_t(std::max(dw_chunks(N), 1)) * size_t(C) * sizeof(float);
}

void rmsnorm_backward(cudaStream_t st, float* dinp, float* dw, const float* dout,
                      const float* inp, const float* w, const float* rstd, int N, int C,
                      float* scratch) {
    if (N <= 0 || C <= 0) return;
    if (dinp) {  // a null part is skipped (the split backward: dinp in B, dw in W)
        rmsnorm_backward_dx_kernel<<<N, kThreads, 0, st>>>(dinp, dout, inp, w, rstd, C);
        QUINTET_CUDA_LAUNCHED();
    }
    if (!dw) return;
    const int rows = dw_rows_per_chunk(N), chunks = dw_chunks(N);
    const unsigned cblocks = unsigned((C + kThreads - 1) / kThreads);
    rmsnorm_dw_partial_kernel<<<dim3(cblocks, unsigned(chunks)), kThreads, 0, st>>>(
        scratch, dout, inp, rstd, N, C, rows);
    QUINTET_CUDA_LAUNCHED();
    rmsnorm_dw_final_kernel<<<cblocks, kThreads, 0, st>>>(dw, scratch, chunks, C);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
