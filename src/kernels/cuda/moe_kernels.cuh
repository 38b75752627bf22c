// Device code of the MoE routing kernels (see moe.cu): the router's scores, its group-limited
// top-k and its backward (one thread per token row), and the row gathers between token order and expert
// order (one thread per output element). The same arithmetic, in the same order, as the CPU
// backend's cpu_moe.cpp. Included by moe.cu and by emulate/.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "quintet/kernels/backend.hpp"  // MoeRouteRule

#ifndef QUINTET_GRID_STRIDE
#define QUINTET_GRID_STRIDE(i, n)                                                     \
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);           \
         i += size_t(gridDim.x) * blockDim.x)
#endif

namespace quintet::cuda::kern {

// The groups a row keeps (bit g), as cpu_moe.cpp's kept_groups.
__device__ inline uint64_t moe_kept_groups(const float* p, const float* bias, int E, const MoeRouteRule& r) {
    if (r.method == MoeRouteRule::greedy || r.groups <= 1) return ~uint64_t(0);
    const int n = E / r.groups;
    float gs[64];
    for (int g = 0; g < r.groups; ++g) {
        float a = -INFINITY, b = -INFINITY;
        for (int e = g * n; e < (g + 1) * n; ++e) {
            const float c = bias ? p[e] + bias[e] : p[e];
            if (c > a) b = a, a = c;
            else if (c > b) b = c;
        }
        gs[g] = r.method == MoeRouteRule::group_top2 ? a + b : a;
    }
    uint64_t kept = 0;
    for (int g = 0; g < r.groups; ++g) {
        int beaten_by = 0;
        for (int h = 0; h < r.groups; ++h) beaten_by += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
        if (beaten_by < r.group_top_k) kept |= uint64_t(1) << g;
    }
    return kept;
}

__global__ void moe_route_kernel(float* probs, int32_t* expert, float* weight, const float* logits,
                                 const float* bias, int N, int E, int k, MoeRouteRule rule) {
    const int n = rule.groups > 1 ? E / rule.groups : E;
    QUINTET_GRID_STRIDE(row, size_t(N)) {
        const float* z = logits + row * E;
        float* p = probs + row * E;
        if (rule.sigmoid) {
            for (int e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + expf(-z[e]));
        } else {
            float mx = z[0];
            for (int e = 1; e < E; ++e) mx = fmaxf(mx, z[e]);
            float sum = 0.0f;
            for (int e = 0; e < E; ++e) sum += (p[e] = expf(z[e] - mx));
            const float inv = 1.0f / sum;
            for (int e = 0; e < E; ++e) p[e] *= inv;
        }
        int32_t* ex = expert + row * k;
        float* w = weight + row * k;
        const uint64_t kept = moe_kept_groups(p, bias, E, rule);
        float chosen = 0.0f;
        for (int j = 0; j < k; ++j) {
            int best = -1;
            float bs = 0.0f;
            for (int e = 0; e < E; ++e) {
                if (!((kept >> (e / n)) & 1)) continue;
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
        if (rule.norm)
            for (int j = 0; j < k; ++j) w[j] /= chosen;
        if (rule.scale != 1.0f)
            for (int j = 0; j < k; ++j) w[j] *= rule.scale;
    }
}

__global__ void moe_route_backward_kernel(float* dlogits, const float* dweight, const float* probs,
                                          const int32_t* expert, const float* weight,
                                          const float* daux, int N, int E, int k, MoeRouteRule rule) {
    QUINTET_GRID_STRIDE(row, size_t(N)) {
        const float* p = probs + row * E;
        const int32_t* ex = expert + row * k;
        const float* w = weight + row * k;
        const float* dw = dweight + row * k;
        float* dp = dlogits + row * E;
        if (!daux) {
            for (int e = 0; e < E; ++e) dp[e] = 0.0f;
        } else if (!rule.sigmoid) {
            for (int e = 0; e < E; ++e) dp[e] = daux[e];
        } else {
            float sum = 0.0f, dot = 0.0f;
            for (int e = 0; e < E; ++e) sum += p[e];
            for (int e = 0; e < E; ++e) dot += daux[e] * (p[e] / sum);
            for (int e = 0; e < E; ++e) dp[e] = (daux[e] - dot) / sum;
        }
        if (rule.norm) {
            float s = 0.0f, dot = 0.0f;
            for (int j = 0; j < k; ++j) s += p[ex[j]], dot += dw[j] * w[j];
            for (int j = 0; j < k; ++j) dp[ex[j]] += (rule.scale * dw[j] - dot) / s;
        } else {
            for (int j = 0; j < k; ++j) dp[ex[j]] += rule.scale * dw[j];
        }
        if (rule.sigmoid) {
            for (int e = 0; e < E; ++e) dp[e] = dp[e] * (p[e] * (1.0f - p[e]));
        } else {
            float dot = 0.0f;
            for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
            for (int e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - dot);
        }
    }
}

__global__ void gather_rows_kernel(float* dst, const float* src, const int32_t* idx, int n, int C) {
    QUINTET_GRID_STRIDE(i, size_t(n) * C) {
        const size_t r = i / C, c = i % C;
        dst[i] = src[size_t(idx[r]) * C + c];
    }
}

__global__ void moe_combine_kernel(float* out, const float* y, const int32_t* slot, const float* weight,
                                   int N, int k, int C) {
    QUINTET_GRID_STRIDE(i, size_t(N) * C) {
        const size_t t = i / C, c = i % C;
        float o = out[i];
        for (int j = 0; j < k; ++j) {
            const float w = weight ? weight[t * k + j] : 1.0f;
            o += w * y[size_t(slot[t * k + j]) * C + c];
        }
        out[i] = o;
    }
}

// One thread per (token, choice): C-long loops (deterministic, no atomics).
__global__ void moe_combine_backward_kernel(float* dy, float* dweight, const float* dout, const float* y,
                                            const int32_t* slot, const float* weight, int N, int k, int C) {
    QUINTET_GRID_STRIDE(tj, size_t(N) * k) {
        const size_t t = tj / k;
        const float w = weight[tj];
        const float* d = dout + t * C;
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

}  // namespace quintet::cuda::kern
