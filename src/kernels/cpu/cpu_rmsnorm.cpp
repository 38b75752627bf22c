// RMSNorm on the CPU (the twin of src/kernels/cuda/rmsnorm.cu): one row per OpenMP iteration
// for out, rstd and dinp; dw with the columns split over threads and the rows summed in order,
// so every element has one writer and a fixed summation order.
#include <omp.h>

#include <cmath>

#include "cpu_backend.hpp"

namespace quintet::cpu {

void CpuBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                                 int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        const float* x = inp + size_t(n) * C;
        float* y = out + size_t(n) * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; ++c) ss += x[c] * x[c];
        float r = 1.0f / std::sqrt(ss / C + eps);
        rstd[n] = r;
#pragma omp simd
        for (int c = 0; c < C; ++c) y[c] = x[c] * r * w[c];
    }
}

void CpuBackend::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                  const float* w, const float* rstd, int N, int C) {
    // dx = r*w*dy - x * r^3/C * sum(dy*w*x);  dw = sum_n dy * x * r. A null dinp or dw skips it.
    if (dinp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        const float* x = inp + size_t(n) * C;
        const float* dy = dout + size_t(n) * C;
        float* dx = dinp + size_t(n) * C;
        float r = rstd[n], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; ++c) dot += dy[c] * w[c] * x[c];
        float k = dot * r * r * r / C;
#pragma omp simd
        for (int c = 0; c < C; ++c) dx[c] += r * w[c] * dy[c] - k * x[c];
    }
    }
    if (!dw) return;
    // dw: columns split over threads, rows summed in order (deterministic).
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int c0 = int(long(C) * t / nt), c1 = int(long(C) * (t + 1) / nt);
        for (int n = 0; n < N; ++n) {
            const float* x = inp + size_t(n) * C;
            const float* dy = dout + size_t(n) * C;
            float r = rstd[n];
            for (int c = c0; c < c1; ++c) dw[c] += dy[c] * x[c] * r;
        }
    }
}

}  // namespace quintet::cpu
