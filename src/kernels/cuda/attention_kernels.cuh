// Device code of the tiled causal attention (see attention.cu for the design): forward, the
// D = rowsum(dO * O) kernel, and the two deterministic backward kernels, plus the shared-memory
// sizes the launchers need. Included by attention.cu and by emulate/.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace quintet::cuda::kern {

constexpr int kFwdTile = 32;      // query and key rows per forward tile: one lane per key
constexpr int kAttnThreads = 128;
static_assert(kFwdTile == 32, "the forward softmax maps one warp lane to one key of a tile");

// Shared-memory rows are padded to HD+1 floats: lanes reading different rows of one column
// then hit different banks.
inline size_t fwd_smem_bytes(int HD) {
    const size_t HDp = size_t(HD) + 1;
    return sizeof(float) * (4 * kFwdTile * HDp + size_t(kFwdTile) * (kFwdTile + 1) + 3 * kFwdTile);
}
inline size_t dkv_smem_bytes(int HD, int bt) {
    const size_t HDp = size_t(HD) + 1;
    return sizeof(float) * (6 * size_t(bt) * HDp + 2 * size_t(bt) * (bt + 1) + 2 * size_t(bt));
}
inline size_t dq_smem_bytes(int HD, int bt) {
    const size_t HDp = size_t(HD) + 1;
    return sizeof(float) * (5 * size_t(bt) * HDp + size_t(bt) * (bt + 1) + 2 * size_t(bt));
}

// Backward tile rows: 32 where the dK/dV kernel's shared memory fits, else 16 (head_dim above
// ~180 on sm_80).
inline int backward_tile(int HD, int max_smem_optin) {
    return dkv_smem_bytes(HD, 32) <= size_t(max_smem_optin) ? 32 : 16;
}

// One block per (query tile, head, batch). out[B*T, NH*HD]; lse[B, NH, T].
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(float* out, float* lse, const float* q, const float* k,
                             const float* v, int T, int NH, int NKV, int HD, int qs, int kvs,
                             float scale) {
    QUINTET_DYNAMIC_SMEM(sm);
    const int HDp = HD + 1, Sp = kFwdTile + 1;
    float* Qs = sm;                     // [tile][HDp]
    float* Ks = Qs + kFwdTile * HDp;    // [tile][HDp]
    float* Vs = Ks + kFwdTile * HDp;    // [tile][HDp]
    float* Os = Vs + kFwdTile * HDp;    // [tile][HDp] unnormalised output
    float* S = Os + kFwdTile * HDp;     // [tile][Sp]  scores, then probabilities
    float* mrow = S + kFwdTile * Sp;    // [tile] running max
    float* lrow = mrow + kFwdTile;      // [tile] running sum
    float* crow = lrow + kFwdTile;      // [tile] this key tile's rescale factor

    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (NH / NKV);
    const int t0 = qt * kFwdTile, nq = min(kFwdTile, T - t0);
    const int tid = threadIdx.x, nthr = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nwarps = nthr >> 5;
    const int ostride = NH * HD;

    const float* Q = q + (size_t(b) * T + t0) * qs + size_t(h) * HD;
    for (int idx = tid; idx < kFwdTile * HD; idx += nthr) {
        const int i = idx / HD, d = idx % HD;
        Qs[i * HDp + d] = i < nq ? Q[size_t(i) * qs + d] : 0.0f;
        Os[i * HDp + d] = 0.0f;
    }
    if (tid < kFwdTile) {
        mrow[tid] = -INFINITY;
        lrow[tid] = 0.0f;
    }
    const int kend = t0 + nq;  // causal: keys [0, kend)
    for (int s0 = 0; s0 < kend; s0 += kFwdTile) {
        const int nk = min(kFwdTile, kend - s0);
        __syncthreads();  // the previous tile's readers of Ks/Vs/S are done; init visible
        const size_t kv0 = (size_t(b) * T + s0) * kvs + size_t(g) * HD;
        for (int idx = tid; idx < kFwdTile * HD; idx += nthr) {
            const int j = idx / HD, d = idx % HD;
            const bool in = j < nk;
            Ks[j * HDp + d] = in ? k[kv0 + size_t(j) * kvs + d] : 0.0f;
            Vs[j * HDp + d] = in ? v[kv0 + size_t(j) * kvs + d] : 0.0f;
        }
        __syncthreads();
        // S = scale * Q K^T, -inf where masked (causal or past the tile's end)
        for (int idx = tid; idx < kFwdTile * kFwdTile; idx += nthr) {
            const int i = idx / kFwdTile, j = idx % kFwdTile;
            float s = -INFINITY;
            if (i < nq && j < nk && s0 + j <= t0 + i) {
                float acc = 0.0f;
                for (int d = 0; d < HD; ++d) acc += Qs[i * HDp + d] * Ks[j * HDp + d];
                s = scale * acc;
            }
            S[i * Sp + j] = s;
        }
        __syncthreads();
        // Online softmax, one warp per row, lane j = key j of the tile.
        for (int i = warp; i < kFwdTile; i += nwarps) {
            const float s = S[i * Sp + lane];
            const float m_old = mrow[i];
            const float m_new = fmaxf(m_old, warp_max(s));
            const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
            const float sum = warp_sum(p);
            S[i * Sp + lane] = p;
            if (lane == 0) {
                // m_old = -inf only before the first valid key (then l = O = 0 anyway).
                const float corr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                crow[i] = corr;
                lrow[i] = lrow[i] * corr + sum;
                mrow[i] = m_new;
            }
        }
        __syncthreads();
        // O = O * corr + P V
        for (int idx = tid; idx < kFwdTile * HD; idx += nthr) {
            const int i = idx / HD, d = idx % HD;
            float acc = 0.0f;
            for (int j = 0; j < nk; ++j) acc += S[i * Sp + j] * Vs[j * HDp + d];
            Os[i * HDp + d] = Os[i * HDp + d] * crow[i] + acc;
        }
    }
    __syncthreads();
    float* O = out + (size_t(b) * T + t0) * ostride + size_t(h) * HD;
    for (int idx = tid; idx < nq * HD; idx += nthr) {
        const int i = idx / HD, d = idx % HD;
        O[size_t(i) * ostride + d] = Os[i * HDp + d] * (1.0f / lrow[i]);
    }
    if (tid < nq) lse[(size_t(b) * NH + h) * T + t0 + tid] = mrow[tid] + logf(lrow[tid]);
}

// Dsum[b, h, t] = sum_d dout * out over head h's columns of row b*T+t; one warp per row.
__global__ void attention_dsum_kernel(float* Dsum, const float* dout, const float* out,
                                      size_t rows, int T, int NH, int HD) {
    const size_t r = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;  // the whole warp shares r
    const size_t t = r % T, bh = r / T;
    const size_t h = bh % NH, b = bh / NH;
    const size_t o = (b * T + t) * size_t(NH) * HD + h * HD;
    float s = 0.0f;
    for (int d = lane; d < HD; d += 32) s += dout[o + d] * out[o + d];
    s = warp_sum(s);
    if (lane == 0) Dsum[r] = s;
}

// One block per (key tile, kv head, batch): dK, dV of its keys (overwritten), summed over the
// group's query heads and every query tile that can see the keys.
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dkv_kernel(float* dk, float* dv, const float* dout, const float* lse,
                                  const float* Dsum, const float* q, const float* k,
                                  const float* v, int T, int NH, int NKV, int HD, int qs,
                                  int kvs, float scale, int bt) {
    QUINTET_DYNAMIC_SMEM(sm);
    const int HDp = HD + 1, btp = bt + 1;
    float* Ks = sm;               // [bt][HDp]
    float* Vs = Ks + bt * HDp;    // [bt][HDp]
    float* dKs = Vs + bt * HDp;   // [bt][HDp]
    float* dVs = dKs + bt * HDp;  // [bt][HDp]
    float* Qs = dVs + bt * HDp;   // [bt][HDp]
    float* dOs = Qs + bt * HDp;   // [bt][HDp]
    float* P = dOs + bt * HDp;    // [bt][btp]
    float* dS = P + bt * btp;     // [bt][btp]
    float* L = dS + bt * btp;     // [bt]
    float* Dr = L + bt;           // [bt]

    const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    const int s0 = kt * bt, nk = min(bt, T - s0);
    const int group = NH / NKV, ostride = NH * HD;
    const int tid = threadIdx.x, nthr = blockDim.x;
    const size_t kv0 = (size_t(b) * T + s0) * kvs + size_t(g) * HD;
    for (int idx = tid; idx < bt * HD; idx += nthr) {
        const int j = idx / HD, d = idx % HD;
        const bool in = j < nk;
        Ks[j * HDp + d] = in ? k[kv0 + size_t(j) * kvs + d] : 0.0f;
        Vs[j * HDp + d] = in ? v[kv0 + size_t(j) * kvs + d] : 0.0f;
        dKs[j * HDp + d] = 0.0f;
        dVs[j * HDp + d] = 0.0f;
    }
    const int nqt = (T + bt - 1) / bt;
    for (int h = g * group; h < (g + 1) * group; ++h) {
        for (int qt = s0 / bt; qt < nqt; ++qt) {  // query tiles holding some t >= s0
            const int t0 = qt * bt, nq = min(bt, T - t0);
            __syncthreads();  // previous readers of Qs/dOs/P/dS are done
            const size_t q0 = (size_t(b) * T + t0) * qs + size_t(h) * HD;
            const size_t o0 = (size_t(b) * T + t0) * ostride + size_t(h) * HD;
            for (int idx = tid; idx < bt * HD; idx += nthr) {
                const int i = idx / HD, d = idx % HD;
                const bool in = i < nq;
                Qs[i * HDp + d] = in ? q[q0 + size_t(i) * qs + d] : 0.0f;
                dOs[i * HDp + d] = in ? dout[o0 + size_t(i) * ostride + d] : 0.0f;
            }
            if (tid < bt) {
                const size_t r = (size_t(b) * NH + h) * T + t0 + tid;
                L[tid] = tid < nq ? lse[r] : 0.0f;
                Dr[tid] = tid < nq ? Dsum[r] : 0.0f;
            }
            __syncthreads();
            // P = exp(scale Q K^T - lse) (causal), dS = P * (dO V^T - D)
            for (int idx = tid; idx < bt * bt; idx += nthr) {
                const int i = idx / bt, j = idx % bt;
                float p = 0.0f, ds = 0.0f;
                if (i < nq && j < nk && s0 + j <= t0 + i) {
                    float sdot = 0.0f, pdot = 0.0f;
                    for (int d = 0; d < HD; ++d) {
                        sdot += Qs[i * HDp + d] * Ks[j * HDp + d];
                        pdot += dOs[i * HDp + d] * Vs[j * HDp + d];
                    }
                    p = expf(scale * sdot - L[i]);
                    ds = p * (pdot - Dr[i]);
                }
                P[i * btp + j] = p;
                dS[i * btp + j] = ds;
            }
            __syncthreads();
            // dV += P^T dO ; dK += scale * dS^T Q   (each (j, d) has one owner thread)
            for (int idx = tid; idx < bt * HD; idx += nthr) {
                const int j = idx / HD, d = idx % HD;
                float av = 0.0f, ak = 0.0f;
                for (int i = 0; i < nq; ++i) {
                    av += P[i * btp + j] * dOs[i * HDp + d];
                    ak += dS[i * btp + j] * Qs[i * HDp + d];
                }
                dVs[j * HDp + d] += av;
                dKs[j * HDp + d] += scale * ak;
            }
        }
    }
    __syncthreads();
    for (int idx = tid; idx < nk * HD; idx += nthr) {
        const int j = idx / HD, d = idx % HD;
        dk[kv0 + size_t(j) * kvs + d] = dKs[j * HDp + d];
        dv[kv0 + size_t(j) * kvs + d] = dVs[j * HDp + d];
    }
}

// One block per (query tile, head, batch): dQ of its rows (overwritten) over the causal keys.
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dq_kernel(float* dq, const float* dout, const float* lse,
                                 const float* Dsum, const float* q, const float* k,
                                 const float* v, int T, int NH, int NKV, int HD, int qs, int kvs,
                                 float scale, int bt) {
    QUINTET_DYNAMIC_SMEM(sm);
    const int HDp = HD + 1, btp = bt + 1;
    float* Qs = sm;               // [bt][HDp]
    float* dOs = Qs + bt * HDp;   // [bt][HDp]
    float* dQs = dOs + bt * HDp;  // [bt][HDp]
    float* Ks = dQs + bt * HDp;   // [bt][HDp]
    float* Vs = Ks + bt * HDp;    // [bt][HDp]
    float* dS = Vs + bt * HDp;    // [bt][btp]
    float* L = dS + bt * btp;     // [bt]
    float* Dr = L + bt;           // [bt]

    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (NH / NKV), ostride = NH * HD;
    const int t0 = qt * bt, nq = min(bt, T - t0);
    const int tid = threadIdx.x, nthr = blockDim.x;
    const size_t q0 = (size_t(b) * T + t0) * qs + size_t(h) * HD;
    const size_t o0 = (size_t(b) * T + t0) * ostride + size_t(h) * HD;
    for (int idx = tid; idx < bt * HD; idx += nthr) {
        const int i = idx / HD, d = idx % HD;
        const bool in = i < nq;
        Qs[i * HDp + d] = in ? q[q0 + size_t(i) * qs + d] : 0.0f;
        dOs[i * HDp + d] = in ? dout[o0 + size_t(i) * ostride + d] : 0.0f;
        dQs[i * HDp + d] = 0.0f;
    }
    if (tid < bt) {
        const size_t r = (size_t(b) * NH + h) * T + t0 + tid;
        L[tid] = tid < nq ? lse[r] : 0.0f;
        Dr[tid] = tid < nq ? Dsum[r] : 0.0f;
    }
    const int kend = t0 + nq;
    for (int s0 = 0; s0 < kend; s0 += bt) {
        const int nk = min(bt, kend - s0);
        __syncthreads();  // previous readers of Ks/Vs/dS are done; init visible
        const size_t kv0 = (size_t(b) * T + s0) * kvs + size_t(g) * HD;
        for (int idx = tid; idx < bt * HD; idx += nthr) {
            const int j = idx / HD, d = idx % HD;
            const bool in = j < nk;
            Ks[j * HDp + d] = in ? k[kv0 + size_t(j) * kvs + d] : 0.0f;
            Vs[j * HDp + d] = in ? v[kv0 + size_t(j) * kvs + d] : 0.0f;
        }
        __syncthreads();
        for (int idx = tid; idx < bt * bt; idx += nthr) {
            const int i = idx / bt, j = idx % bt;
            float ds = 0.0f;
            if (i < nq && j < nk && s0 + j <= t0 + i) {
                float sdot = 0.0f, pdot = 0.0f;
                for (int d = 0; d < HD; ++d) {
                    sdot += Qs[i * HDp + d] * Ks[j * HDp + d];
                    pdot += dOs[i * HDp + d] * Vs[j * HDp + d];
                }
                const float p = expf(scale * sdot - L[i]);
                ds = p * (pdot - Dr[i]);
            }
            dS[i * btp + j] = ds;
        }
        __syncthreads();
        // dQ += scale * dS K
        for (int idx = tid; idx < bt * HD; idx += nthr) {
            const int i = idx / HD, d = idx % HD;
            float acc = 0.0f;
            for (int j = 0; j < nk; ++j) acc += dS[i * btp + j] * Ks[j * HDp + d];
            dQs[i * HDp + d] += scale * acc;
        }
    }
    __syncthreads();
    for (int idx = tid; idx < nq * HD; idx += nthr) {
        const int i = idx / HD, d = idx % HD;
        dq[q0 + size_t(i) * qs + d] = dQs[i * HDp + d];
    }
}

}  // namespace quintet::cuda::kern
