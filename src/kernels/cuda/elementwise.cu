// Element-wise kernels: SwiGLU forward/backward, add, scale, the fused AdamW step (PyTorch
// semantics, the CPU backend's expression order) and the fp32 <-> bf16 conversions.
// Grid-stride loops; every element is written by exactly one thread.
#include <cuda_bf16.h>

#include <cmath>

#include "common.cuh"
#include "elementwise_kernels.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"

namespace quintet::cuda {

using namespace kern;

namespace {

__global__ void f32_to_bf16_kernel(uint16_t* dst, const float* src, size_t n) {
    QUINTET_GRID_STRIDE(i, n) dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
}

__global__ void bf16_to_f32_kernel(float* dst, const uint16_t* src, size_t n) {
    QUINTET_GRID_STRIDE(i, n) dst[i] = __bfloat162float(__ushort_as_bfloat16(src[i]));
}

}  // namespace

void swiglu_forward(cudaStream_t st, float* out, const float* gu, int N, int F) {
    const size_t total = size_t(N) * F;
    if (total == 0) return;
    swiglu_forward_kernel<<<grid_for(total), kThreads, 0, st>>>(out, gu, N, F);
    QUINTET_CUDA_LAUNCHED();
}

void swiglu_backward(cudaStream_t st, float* dgu, const float* dout, const float* gu, int N,
                     int F) {
    const size_t total = size_t(N) * F;
    if (total == 0) return;
    swiglu_backward_kernel<<<grid_for(total), kThreads, 0, st>>>(dgu, dout, gu, N, F);
    QUINTET_CUDA_LAUNCHED();
}

void add_inplace(cudaStream_t st, float* a, const float* b, size_t n) {
    if (n == 0) return;
    add_kernel<<<grid_for(n), kThreads, 0, st>>>(a, b, n);
    QUINTET_CUDA_LAUNCHED();
}

void copy_2d(cudaStream_t st, float* dst, size_t ld_dst, const float* src, size_t ld_src,
             size_t rows, size_t cols, bool accumulate) {
    if (rows == 0 || cols == 0) return;
    if (!accumulate) {
        QUINTET_CUDA_CHECK(cudaMemcpy2DAsync(dst, ld_dst * sizeof(float), src, ld_src * sizeof(float),
                                             cols * sizeof(float), rows, cudaMemcpyDeviceToDevice, st));
        return;
    }
    add_2d_kernel<<<grid_for(rows * cols), kThreads, 0, st>>>(dst, ld_dst, src, ld_src, rows, cols);
    QUINTET_CUDA_LAUNCHED();
}

void scale(cudaStream_t st, float* x, size_t n, float s) {
    if (n == 0) return;
    scale_kernel<<<grid_for(n), kThreads, 0, st>>>(x, n, s);
    QUINTET_CUDA_LAUNCHED();
}

void adamw(cudaStream_t st, float* p, const float* g, float* m, float* v, size_t n, float lr,
           float beta1, float beta2, float eps, float wd, float bc1, float bc2) {
    if (n == 0) return;
    adamw_kernel<<<grid_for(n), kThreads, 0, st>>>(
        p, g, m, v, n, adamw_scalars(lr, beta1, beta2, eps, wd, bc1, bc2));
    QUINTET_CUDA_LAUNCHED();
}

void f32_to_bf16(cudaStream_t st, uint16_t* dst, const float* src, size_t n) {
    if (n == 0) return;
    f32_to_bf16_kernel<<<grid_for(n), kThreads, 0, st>>>(dst, src, n);
    QUINTET_CUDA_LAUNCHED();
}

void bf16_to_f32(cudaStream_t st, float* dst, const uint16_t* src, size_t n) {
    if (n == 0) return;
    bf16_to_f32_kernel<<<grid_for(n), kThreads, 0, st>>>(dst, src, n);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
