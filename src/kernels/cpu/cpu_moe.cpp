// The CPU kernels of Mixture-of-Experts routing (the twin of src/kernels/cuda/moe.cu; the maths
// in docs/math.md §9): the router's scores (softmax or sigmoid), its group-limited top-k and its
// backward, and the row gathers that move tokens to and from their experts. One row per OpenMP iteration, each output element
// written by one iteration, in a fixed order: the same bits for any thread count. The expert
// GEMMs themselves are ordinary GEMMs over contiguous row ranges (model/moe.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_backend.hpp"

namespace quintet::cpu {

namespace {

// The groups a row keeps (bit g: group g): the group_top_k best by group score, ties to the lower
// group (group g is kept when fewer than group_top_k groups beat it). A group's score, from the
// choice scores c = p + bias of its n experts: the largest (group_limited_greedy), or the sum of
// the two largest (noaux_tc).
uint64_t kept_groups(const float* p, const float* bias, int E, const MoeRouteRule& r) {
    if (r.method == MoeRouteRule::greedy || r.groups <= 1) return ~uint64_t(0);
    const int n = E / r.groups;
    float gs[64];
    for (int g = 0; g < r.groups; ++g) {
        float a = -INFINITY, b = -INFINITY;  // the largest and the second largest
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

}  // namespace

void CpuBackend::moe_route(float* probs, int32_t* expert, float* weight, const float* logits,
                           const float* bias, int N, int E, int k, const MoeRouteRule& rule) {
    const int n = rule.groups > 1 ? E / rule.groups : E;  // experts per group
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; ++t) {
        const float* z = logits + size_t(t) * E;
        float* p = probs + size_t(t) * E;
        if (rule.sigmoid) {
            for (int e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + std::exp(-z[e]));
        } else {
            float mx = z[0];
            for (int e = 1; e < E; ++e) mx = std::max(mx, z[e]);
            float sum = 0.0f;
            for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - mx));
            const float inv = 1.0f / sum;
            for (int e = 0; e < E; ++e) p[e] *= inv;
        }
        int32_t* ex = expert + size_t(t) * k;
        float* w = weight + size_t(t) * k;
        const uint64_t kept = kept_groups(p, bias, E, rule);
        // Top-k by c among the kept groups' experts: k passes, each the largest score not yet
        // taken (strictly larger replaces, so the lower index wins a tie).
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

void CpuBackend::moe_route_backward(float* dlogits, const float* dweight, const float* probs,
                                    const int32_t* expert, const float* weight, const float* daux,
                                    int N, int E, int k, const MoeRouteRule& rule) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; ++t) {
        const float* p = probs + size_t(t) * E;
        const int32_t* ex = expert + size_t(t) * k;
        const float* w = weight + size_t(t) * k;
        const float* dw = dweight + size_t(t) * k;
        float* dp = dlogits + size_t(t) * E;  // dL/dscores first, then dL/dlogits in place
        if (!daux) {
            for (int e = 0; e < E; ++e) dp[e] = 0.0f;
        } else if (!rule.sigmoid) {
            for (int e = 0; e < E; ++e) dp[e] = daux[e];
        } else {  // the balance loss sees q = s / sum(s): ds_e = (daux_e - sum_i daux_i q_i) / sum(s)
            float sum = 0.0f, dot = 0.0f;
            for (int e = 0; e < E; ++e) sum += p[e];
            for (int e = 0; e < E; ++e) dot += daux[e] * (p[e] / sum);
            for (int e = 0; e < E; ++e) dp[e] = (daux[e] - dot) / sum;
        }
        if (rule.norm) {  // w_j = r p_j / S, S = sum of the chosen p: dp_j = (r dw_j - sum_i dw_i w_i) / S
            float s = 0.0f, dot = 0.0f;
            for (int j = 0; j < k; ++j) s += p[ex[j]], dot += dw[j] * w[j];
            for (int j = 0; j < k; ++j) dp[ex[j]] += (rule.scale * dw[j] - dot) / s;
        } else {
            for (int j = 0; j < k; ++j) dp[ex[j]] += rule.scale * dw[j];
        }
        if (rule.sigmoid) {  // dz_e = dp_e s_e (1 - s_e)
            for (int e = 0; e < E; ++e) dp[e] = dp[e] * (p[e] * (1.0f - p[e]));
        } else {  // softmax: dz_e = p_e (dp_e - sum_i p_i dp_i)
            float dot = 0.0f;
            for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
            for (int e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - dot);
        }
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
