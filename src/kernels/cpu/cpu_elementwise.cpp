// Element-wise kernels on the CPU (the twin of src/kernels/cuda/elementwise.cu): SwiGLU
// forward/backward, copy_2d, add, scale, the AdamW step and the fp32 <-> bf16 conversions.
// Each element is computed on its own, so the thread split never changes a bit; the sigmoid
// uses exp_fast (cpu_math.hpp) so that the SwiGLU loops vectorise.
#include <cmath>
#include <cstring>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace quintet::cpu {

void CpuBackend::swiglu_forward(float* out, const float* gu, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        const float* g = gu + size_t(n) * 2 * F;
        const float* u = g + F;
        float* o = out + size_t(n) * F;
#pragma omp simd
        for (int f = 0; f < F; ++f) o[f] = g[f] / (1.0f + exp_fast(-g[f])) * u[f];
    }
}
void CpuBackend::swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        const float* g = gu + size_t(n) * 2 * F;
        const float* u = g + F;
        const float* dy = dout + size_t(n) * F;
        float* dg = dgu + size_t(n) * 2 * F;
        float* du = dg + F;
#pragma omp simd
        for (int f = 0; f < F; ++f) {
            float s = 1.0f / (1.0f + exp_fast(-g[f]));
            float silu = g[f] * s;
            du[f] = dy[f] * silu;
            dg[f] = dy[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
        }
    }
}

void CpuBackend::copy_2d(float* dst, size_t ld_dst, const float* src, size_t ld_src, size_t rows,
                         size_t cols, bool accumulate) {
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
    for (size_t r = 0; r < rows; ++r) {
        float* d = dst + r * ld_dst;
        const float* s = src + r * ld_src;
        if (accumulate) {
#pragma omp simd
            for (size_t c = 0; c < cols; ++c) d[c] += s[c];
        } else {
            std::memcpy(d, s, cols * sizeof(float));
        }
    }
}

void CpuBackend::add_inplace(float* a, const float* b, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

void CpuBackend::scale(float* x, size_t n, float s) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) x[i] *= s;
}

void CpuBackend::adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1,
                       float b2, float eps, float wd, float bc1, float bc2) {
    // PyTorch's AdamW (non-foreach, non-fused path): decay, moments, bias-corrected step.
    const float step_size = lr / bc1;
    const float bc2_sqrt = std::sqrt(bc2);
    const float decay = 1.0f - lr * wd;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
        float pi = p[i] * decay;
        float mi = m[i] + (g[i] - m[i]) * (1.0f - b1);  // torch: m.lerp_(g, 1-beta1)
        float vi = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        float denom = std::sqrt(vi) / bc2_sqrt + eps;
        p[i] = pi - step_size * mi / denom;
    }
}

void CpuBackend::to_bf16(bf16_bits* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

void CpuBackend::from_bf16(float* dst, const bf16_bits* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

}  // namespace quintet::cpu
