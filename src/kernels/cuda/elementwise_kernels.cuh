// Device code of the element-wise kernels (see elementwise.cu): SwiGLU, add, scale, AdamW.
// Included by elementwise.cu and by emulate/.
#pragma once
#include <cmath>
#include <cstddef>

#include "common.cuh"

#define QUINTET_GRID_STRIDE(i, n)                                                     \
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);           \
         i += size_t(gridDim.x) * blockDim.x)

namespace quintet::cuda::kern {


// gu[N, 2F] = [gate | up]; out[N, F] = silu(gate) * up
__global__ void swiglu_forward_kernel(float* out, const float* gu, int N, int F) {
    const size_t total = size_t(N) * F;
    QUINTET_GRID_STRIDE(idx, total) {
        const size_t n = idx / F, f = idx % F;
        const float g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
        out[idx] = g / (1.0f + expf(-g)) * u;
    }
}

// dgu[N, 2F] (overwritten) from dout[N, F]
__global__ void swiglu_backward_kernel(float* dgu, const float* dout, const float* gu, int N,
                                       int F) {
    const size_t total = size_t(N) * F;
    QUINTET_GRID_STRIDE(idx, total) {
        const size_t n = idx / F, f = idx % F;
        const float g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
        const float dy = dout[idx];
        const float s = 1.0f / (1.0f + expf(-g));
        const float silu = g * s;
        dgu[n * 2 * F + F + f] = dy * silu;
        dgu[n * 2 * F + f] = dy * u * s * (1.0f + g * (1.0f - s));
    }
}

__global__ void add_kernel(float* a, const float* b, size_t n) {
    QUINTET_GRID_STRIDE(i, n) a[i] += b[i];
}

// dst[r*ld_dst + c] += src[r*ld_src + c] over rows x cols (one thread per element).
__global__ void add_2d_kernel(float* dst, size_t ld_dst, const float* src, size_t ld_src,
                              size_t rows, size_t cols) {
    QUINTET_GRID_STRIDE(i, rows * cols) {
        const size_t r = i / cols, c = i % cols;
        dst[r * ld_dst + c] += src[r * ld_src + c];
    }
}

__global__ void scale_kernel(float* x, size_t n, float s) {
    QUINTET_GRID_STRIDE(i, n) x[i] *= s;
}

// The step's scalars, as the CPU backend computes them (float expressions, on the host).
struct AdamwScalars {
    float step_size, bc2_sqrt, decay, one_minus_b1, b2, one_minus_b2, eps;
};
inline AdamwScalars adamw_scalars(float lr, float beta1, float beta2, float eps, float wd,
                                  float bc1, float bc2) {
    return {lr / bc1, std::sqrt(bc2), 1.0f - lr * wd, 1.0f - beta1, beta2, 1.0f - beta2, eps};
}

// PyTorch AdamW (non-foreach path), in the CPU backend's order: decoupled decay, moments
// (m via lerp), bias-corrected step with eps added after the sqrt.
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, size_t n,
                             AdamwScalars a) {
    const float step_size = a.step_size, bc2_sqrt = a.bc2_sqrt, decay = a.decay;
    const float one_minus_b1 = a.one_minus_b1, b2 = a.b2, one_minus_b2 = a.one_minus_b2;
    const float eps = a.eps;
    QUINTET_GRID_STRIDE(i, n) {
        const float gi = g[i];
        const float pi = p[i] * decay;
        const float mi = m[i] + (gi - m[i]) * one_minus_b1;  // torch: m.lerp_(g, 1-beta1)
        const float vi = v[i] * b2 + one_minus_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step_size * mi / denom;
    }
}

}  // namespace quintet::cuda::kern
