// Device code of the deterministic sum of squares (see reduce.cu). Included by reduce.cu and
// by emulate/.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace quintet::cuda::kern {

constexpr int kSumsqBlocks = 1024;

// Blocks of the partial pass: a function of n alone, so the summation order is too.
inline int sumsq_blocks(size_t n) {
    const size_t want = (n + kThreads - 1) / kThreads;
    return int(want < 1 ? 1 : (want > size_t(kSumsqBlocks) ? size_t(kSumsqBlocks) : want));
}

__global__ void sumsq_partial_kernel(double* partial, const float* x, size_t n) {
    __shared__ double sh[32];
    double s = 0.0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        s += double(x[i]) * double(x[i]);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double* out, const double* partial, int blocks) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *out = s;
}

}  // namespace quintet::cuda::kern
