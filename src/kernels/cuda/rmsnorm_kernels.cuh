// Device code of RMSNorm forward/backward (see rmsnorm.cu) and the dw chunking both the
// launcher and emulate/ use. Included by rmsnorm.cu and by emulate/.
#pragma once
#include <algorithm>
#include <cstddef>

#include "common.cuh"

namespace quintet::cuda::kern {

constexpr int kMaxChunks = 128;  // dw partial rows

// Rows per dw chunk: a function of N alone, so the summation order is too.
inline int dw_rows_per_chunk(int N) { return std::max(32, (N + kMaxChunks - 1) / kMaxChunks); }
inline int dw_chunks(int N) { return (N + dw_rows_per_chunk(N) - 1) / dw_rows_per_chunk(N); }

// out[n,:] = inp[n,:] * rstd[n] * w ; rstd[n] = 1 / sqrt(mean(inp[n,:]^2) + eps)
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w,
                                       int C, float eps) {
    __shared__ float sh[32];
    const size_t n = blockIdx.x;
    const float* x = inp + n * C;
    float* y = out + n * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / float(C) + eps);
    if (threadIdx.x == 0) rstd[n] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c] * r * w[c];
}

// dinp[n,:] += r*w*dy - x * r^3/C * sum(dy*w*x)   (accumulates: the residual stream)
__global__ void rmsnorm_backward_dx_kernel(float* dinp, const float* dout, const float* inp,
                                           const float* w, const float* rstd, int C) {
    __shared__ float sh[32];
    const size_t n = blockIdx.x;
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    float* dx = dinp + n * C;
    const float r = rstd[n];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += dy[c] * w[c] * x[c];
    dot = block_sum(dot, sh);
    const float k = dot * r * r * r / float(C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) dx[c] += r * w[c] * dy[c] - k * x[c];
}

// partial[p, c] = sum over rows of chunk p (in order) of dy*x*r.  grid (ceil(C/256), chunks)
__global__ void rmsnorm_dw_partial_kernel(float* partial, const float* dout, const float* inp,
                                          const float* rstd, int N, int C, int rows) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int p = blockIdx.y;
    const int n0 = p * rows, n1 = min(N, n0 + rows);
    float s = 0.0f;
    for (int n = n0; n < n1; ++n) s += dout[size_t(n) * C + c] * inp[size_t(n) * C + c] * rstd[n];
    partial[size_t(p) * C + c] = s;
}

// dw[c] += sum over chunks p (in order) of partial[p, c]
__global__ void rmsnorm_dw_final_kernel(float* dw, const float* partial, int chunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int p = 0; p < chunks; ++p) s += partial[size_t(p) * C + c];
    dw[c] += s;
}

}  // namespace quintet::cuda::kern
