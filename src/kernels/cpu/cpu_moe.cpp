// The CPU kernels of Mixture-of-Experts routing (the twin of src/kernels/cuda/moe.cu; the maths
// in docs/math.md §9): the router's softmax and top-k, its backward, and the row gathers that
// move tokens to and from their experts. One row per OpenMP iteration, each output element
// written by one iteration, in a fixed order: the same bits for any thread count. The expert
// GEMMs themselves are ordinary GEMMs over contiguous row ranges (model/moe.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_backend.hpp"

namespace quintet::cpu {

void CpuBackend::moe_route(float* probs, int32_t* expert, float* weight, const float* logits,
                           const float* bias, int N, int E, int k, bool norm) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; ++t) {
        const float* z = logits + size_t(t) * E;
        float* p = probs + size_t(t) * E;
        float mx = z[0];
        for (int e = 1; e < E; ++e) mx = std::max(mx, z[e]);
        float sum = 0.0f;
        for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - mx));
        const float inv = 1.0f / sum;
        for (int e = 0; e < E; ++e) p[e] *= inv;
        // Top-k by p + bias: k passes, each the largest score not yet taken (strictly larger
        // replaces, so the lower index wins a tie).
        int32_t* ex = expert + size_t(t) * k;
        float* w = weight + size_t(t) * k;
        float chosen = 0.0f;
        for (int j = 0; j < k; ++j) {
            int best = -1;
            float bs = 0.0f;
            for (int e = 0; e < E; ++e) {
                bool taken = false;
                for (int i = 0; i < j; ++i) taken |= ex[i] == e;
                if (taken) continue;
                const float s = bias ? p[e] + bias[e] : p[e];
                if (best < 0 || s > bs) best = e, bs = s;
            }
            ex[j] = best;
            w[j] = p[best];
            chosen += p[best];
        }
        if (norm)
            for (int j = 0; j < k; ++j) w[j] /= chosen;
    }
}

void CpuBackend::moe_route_backward(float* dlogits, const float* dweight, const float* probs,
                                    const int32_t* expert, const float* weight, const float* daux,
                                    int N, int E, int k, bool norm) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; ++t) {
        const float* p = probs + size_t(t) * E;
        const int32_t* ex = expert + size_t(t) * k;
        const float* w = weight + size_t(t) * k;
        const float* dw = dweight + size_t(t) * k;
        float* dp = dlogits + size_t(t) * E;  // dL/dprobs first, then dL/dlogits in place
        for (int e = 0; e < E; ++e) dp[e] = daux ? daux[e] : 0.0f;
        if (norm) {  // w_j = p_j / S, S = sum of the chosen p: dp_j = (dw_j - sum_i dw_i w_i) / S
            float s = 0.0f, dot = 0.0f;
            for (int j = 0; j < k; ++j) s += p[ex[j]], dot += dw[j] * w[j];
            for (int j = 0; j < k; ++j) dp[ex[j]] += (dw[j] - dot) / s;
        } else {
            for (int j = 0; j < k; ++j) dp[ex[j]] += dw[j];
        }
        float dot = 0.0f;  // softmax: dz_e = p_e (dp_e - sum_i p_i dp_i)
        for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
        for (int e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - dot);
    }
}

void CpuBackend::gather_rows(float* dst, const float* src, const int32_t* idx, int n, int C) {
#pragma omp parallel for schedule(static) if (size_t(n) * C > (1 << 15))
    for (int r = 0; r < n; ++r) std::memcpy(dst + size_t(r) * C, src + size_t(idx[r]) * C, size_t(C) * 4);
}

void CpuBackend::moe_combine(float* out, const float* y, const int32_t* slot, const float* weight,
                             int N, int k, int C) {
#pragma omp parallel for schedule(static) if (size_t(N) * C > (1 << 15))
    for (int t = 0; t < N; ++t) {
        float* o = out + size_t(t) * C;
        for (int j = 0; j < k; ++j) {
            const float w = weight ? weight[size_t(t) * k + j] : 1.0f;
            const float* r = y + size_t(slot[size_t(t) * k + j]) * C;
#pragma omp simd
            for (int c = 0; c < C; ++c) o[c] += w * r[c];
        }
    }
}

void CpuBackend::moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y,
                                      const int32_t* slot, const float* weight, int N, int k, int C) {
#pragma omp parallel for schedule(static) if (size_t(N) * C > (1 << 15))
    for (int t = 0; t < N; ++t) {
        const float* d = dout + size_t(t) * C;
        for (int j = 0; j < k; ++j) {
            const size_t tj = size_t(t) * k + j;
            const float w = weight[tj];
            const float* r = y + size_t(slot[tj]) * C;
            float* g = dy + size_t(slot[tj]) * C;
            float dot = 0.0f;
            for (int c = 0; c < C; ++c) {
                g[c] = w * d[c];
                dot += d[c] * r[c];
            }
            dweight[tj] = dot;
        }
    }
}

}  // namespace quintet::cpu
