// Device code of the general attention operation (see attention.cu for the design): forward,
// the log-sum-exp merge, the D = rowsum(dO * O) kernel, and the two deterministic backward
// kernels, plus the shared-memory sizes the launchers need. Included by attention.cu and by
// emulate/. Queries and keys have their own lengths, head dims (Dqk for q.k, Dv for v and the
// output) and row strides; the causal mask compares global positions, and document ids (when
// given) keep attention inside a document. Fully masked tiles are skipped.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace quintet::cuda::kern {

constexpr int kFwdTile = 32;      // query and key rows per forward tile: one lane per key
constexpr int kAttnThreads = 128;
static_assert(kFwdTile == 32, "the forward softmax maps one warp lane to one key of a tile");

// Backend's AttentionArgs, as a kernel argument.
struct AttnShape {
    int B, Tq, Tk, NH, NKV, Dqk, Dv;
    int qs, ks, vs, os;  // row strides of q, k, v, out (and of dq, dk, dv, dout)
    float scale;
    int causal;
    const int32_t* qpos;
    const int32_t* kpos;
    const int32_t* qdoc;  // null: no document mask
    const int32_t* kdoc;
};

// Shared-memory rows are padded to D+1 floats: lanes reading different rows of one column
// then hit different banks.
inline size_t fwd_smem_bytes(int Dqk, int Dv) {
    const size_t Qp = size_t(Dqk) + 1, Vp = size_t(Dv) + 1;
    return sizeof(float) * (2 * kFwdTile * Qp + 2 * kFwdTile * Vp +
                            size_t(kFwdTile) * (kFwdTile + 1) + 3 * kFwdTile);
}
inline size_t dkv_smem_bytes(int Dqk, int Dv, int bt) {
    const size_t Qp = size_t(Dqk) + 1, Vp = size_t(Dv) + 1;
    return sizeof(float) * (3 * size_t(bt) * Qp + 3 * size_t(bt) * Vp +
                            2 * size_t(bt) * (bt + 1) + 2 * size_t(bt));
}
inline size_t dq_smem_bytes(int Dqk, int Dv, int bt) {
    const size_t Qp = size_t(Dqk) + 1, Vp = size_t(Dv) + 1;
    return sizeof(float) * (3 * size_t(bt) * Qp + 2 * size_t(bt) * Vp + size_t(bt) * (bt + 1) +
                            2 * size_t(bt));
}

// Backward tile rows: 32 where the dK/dV kernel's shared memory fits, else 16 (head dims above
// ~180 on sm_80).
inline int backward_tile(int Dqk, int Dv, int max_smem_optin) {
    return dkv_smem_bytes(Dqk, Dv, 32) <= size_t(max_smem_optin) ? 32 : 16;
}

__device__ inline int warp_min_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ inline int warp_max_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Bounds of rows [r0, r0 + n) of one sequence: out[0..3] = min/max position, min/max document.
// Called by warp 0 of the block for tiles of up to 32 rows (lane = row); lane 0 writes.
__device__ inline void tile_bounds(int* out, const int32_t* pos, const int32_t* doc, size_t r0,
                                   int n) {
    const int lane = threadIdx.x & 31;
    const bool in = lane < n;
    const int p = in ? pos[r0 + lane] : 0, d = (in && doc) ? doc[r0 + lane] : 0;
    const int pmin = warp_min_i(in ? p : 0x7fffffff), pmax = warp_max_i(in ? p : -0x7fffffff);
    const int dmin = warp_min_i(in ? d : 0x7fffffff), dmax = warp_max_i(in ? d : -0x7fffffff);
    if (lane == 0) {
        out[0] = pmin;
        out[1] = pmax;
        out[2] = dmin;
        out[3] = dmax;
    }
}

// True when no query of bounds q sees any key of bounds k.
__device__ inline bool tile_skipped(const int* q, const int* k, const AttnShape& a) {
    if (a.causal && k[0] > q[1]) return true;
    if (a.qdoc && (k[3] < q[2] || k[2] > q[3])) return true;
    return false;
}

__device__ inline bool visible(const AttnShape& a, size_t qrow, size_t krow) {
    if (a.causal && a.kpos[krow] > a.qpos[qrow]) return false;
    if (a.qdoc && a.kdoc[krow] != a.qdoc[qrow]) return false;
    return true;
}

// One block per (query tile, head, batch). out[B*Tq, os]; lse[B, NH, Tq].
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(float* out, float* lse, const float* q, const float* k,
                             const float* v, AttnShape a) {
    QUINTET_DYNAMIC_SMEM(sm);
    __shared__ int qb[4], kb[4];
    const int Dqk = a.Dqk, Dv = a.Dv;
    const int Qp = Dqk + 1, Vp = Dv + 1, Sp = kFwdTile + 1;
    float* Qs = sm;                     // [tile][Qp]
    float* Ks = Qs + kFwdTile * Qp;     // [tile][Qp]
    float* Vs = Ks + kFwdTile * Qp;     // [tile][Vp]
    float* Os = Vs + kFwdTile * Vp;     // [tile][Vp] unnormalised output
    float* S = Os + kFwdTile * Vp;      // [tile][Sp]  scores, then probabilities
    float* mrow = S + kFwdTile * Sp;    // [tile] running max
    float* lrow = mrow + kFwdTile;      // [tile] running sum
    float* crow = lrow + kFwdTile;      // [tile] this key tile's rescale factor

    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (a.NH / a.NKV);
    const int t0 = qt * kFwdTile, nq = min(kFwdTile, a.Tq - t0);
    const int tid = threadIdx.x, nthr = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nwarps = nthr >> 5;
    const size_t qrow0 = size_t(b) * a.Tq + t0;

    const float* Q = q + qrow0 * a.qs + size_t(h) * Dqk;
    for (int idx = tid; idx < kFwdTile * Dqk; idx += nthr) {
        const int i = idx / Dqk, d = idx % Dqk;
        Qs[i * Qp + d] = i < nq ? Q[size_t(i) * a.qs + d] : 0.0f;
    }
    for (int idx = tid; idx < kFwdTile * Dv; idx += nthr) Os[(idx / Dv) * Vp + idx % Dv] = 0.0f;
    if (tid < kFwdTile) {
        mrow[tid] = -INFINITY;
        lrow[tid] = 0.0f;
    }
    if (warp == 0) tile_bounds(qb, a.qpos, a.qdoc, qrow0, nq);
    for (int s0 = 0; s0 < a.Tk; s0 += kFwdTile) {
        const int nk = min(kFwdTile, a.Tk - s0);
        const size_t krow0 = size_t(b) * a.Tk + s0;
        __syncthreads();  // the previous tile's readers of Ks/Vs/S/kb are done; init visible
        if (warp == 0) tile_bounds(kb, a.kpos, a.kdoc, krow0, nk);
        __syncthreads();
        if (tile_skipped(qb, kb, a)) continue;  // uniform over the block
        for (int idx = tid; idx < kFwdTile * Dqk; idx += nthr) {
            const int j = idx / Dqk, d = idx % Dqk;
            Ks[j * Qp + d] = j < nk ? k[(krow0 + j) * a.ks + size_t(g) * Dqk + d] : 0.0f;
        }
        for (int idx = tid; idx < kFwdTile * Dv; idx += nthr) {
            const int j = idx / Dv, d = idx % Dv;
            Vs[j * Vp + d] = j < nk ? v[(krow0 + j) * a.vs + size_t(g) * Dv + d] : 0.0f;
        }
        __syncthreads();
        // S = scale * Q K^T, -inf where masked (or past the tile's end)
        for (int idx = tid; idx < kFwdTile * kFwdTile; idx += nthr) {
            const int i = idx / kFwdTile, j = idx % kFwdTile;
            float s = -INFINITY;
            if (i < nq && j < nk && visible(a, qrow0 + i, krow0 + j)) {
                float acc = 0.0f;
                for (int d = 0; d < Dqk; ++d) acc += Qs[i * Qp + d] * Ks[j * Qp + d];
                s = a.scale * acc;
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
                // m_old = -inf only before the first visible key (then l = O = 0 anyway).
                const float corr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                crow[i] = corr;
                lrow[i] = lrow[i] * corr + sum;
                mrow[i] = m_new;
            }
        }
        __syncthreads();
        // O = O * corr + P V
        for (int idx = tid; idx < kFwdTile * Dv; idx += nthr) {
            const int i = idx / Dv, d = idx % Dv;
            float acc = 0.0f;
            for (int j = 0; j < nk; ++j) acc += S[i * Sp + j] * Vs[j * Vp + d];
            Os[i * Vp + d] = Os[i * Vp + d] * crow[i] + acc;
        }
    }
    __syncthreads();
    float* O = out + qrow0 * a.os + size_t(h) * Dv;
    for (int idx = tid; idx < nq * Dv; idx += nthr) {
        const int i = idx / Dv, d = idx % Dv;
        O[size_t(i) * a.os + d] = lrow[i] > 0.0f ? Os[i * Vp + d] * (1.0f / lrow[i]) : 0.0f;
    }
    if (tid < nq)
        lse[(size_t(b) * a.NH + h) * a.Tq + t0 + tid] =
            lrow[tid] > 0.0f ? mrow[tid] + logf(lrow[tid]) : -INFINITY;
}

// (out, lse) <- merge with (out2, lse2), element-wise: one thread per (row, head, column).
__global__ void attention_merge_kernel(float* out, float* lse, const float* out2,
                                       const float* lse2, AttnShape a) {
    const size_t total = size_t(a.B) * a.Tq * a.NH * a.Dv;
    for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += size_t(gridDim.x) * blockDim.x) {
        const int d = int(idx % a.Dv);
        const size_t rh = idx / a.Dv;
        const int h = int(rh % a.NH);
        const size_t r = rh / a.NH;
        const size_t b = r / a.Tq, t = r % a.Tq;
        const size_t li = (b * a.NH + h) * a.Tq + t;
        const float la = lse[li], lb = lse2[li];
        float* o = out + r * a.os + size_t(h) * a.Dv + d;
        const float o2 = out2[r * a.os + size_t(h) * a.Dv + d];
        if (lb == -INFINITY) continue;
        if (la == -INFINITY) {
            *o = o2;
        } else {
            const float m = fmaxf(la, lb);
            const float wa = expf(la - m), wb = expf(lb - m), s = wa + wb;
            *o = (wa / s) * *o + (wb / s) * o2;
        }
    }
}

// The lse half of the merge, after the outputs (which read the old lse): one thread per row/head.
__global__ void attention_merge_lse_kernel(float* lse, const float* lse2, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float la = lse[i], lb = lse2[i];
        if (lb == -INFINITY) continue;
        if (la == -INFINITY) {
            lse[i] = lb;
            continue;
        }
        const float m = fmaxf(la, lb);
        lse[i] = m + logf(expf(la - m) + expf(lb - m));
    }
}

// Dsum[b, h, t] = sum_d dout * out over head h's columns of row b*Tq+t; one warp per row.
__global__ void attention_dsum_kernel(float* Dsum, const float* dout, const float* out, AttnShape a) {
    const size_t rows = size_t(a.B) * a.NH * a.Tq;
    const size_t r = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;  // the whole warp shares r
    const size_t t = r % a.Tq, bh = r / a.Tq;
    const size_t h = bh % a.NH, b = bh / a.NH;
    const size_t o = (b * a.Tq + t) * size_t(a.os) + h * a.Dv;
    float s = 0.0f;
    for (int d = lane; d < a.Dv; d += 32) s += dout[o + d] * out[o + d];
    s = warp_sum(s);
    if (lane == 0) Dsum[r] = s;
}

// One block per (key tile, kv head, batch): dK, dV of its keys (accumulated: +=), summed over
// the group's query heads and every query tile that sees some of the keys.
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dkv_kernel(float* dk, float* dv, const float* dout, const float* lse,
                                  const float* Dsum, const float* q, const float* k,
                                  const float* v, AttnShape a, int bt) {
    QUINTET_DYNAMIC_SMEM(sm);
    __shared__ int qb[4], kb[4];
    const int Dqk = a.Dqk, Dv = a.Dv;
    const int Qp = Dqk + 1, Vp = Dv + 1, btp = bt + 1;
    float* Ks = sm;               // [bt][Qp]
    float* dKs = Ks + bt * Qp;    // [bt][Qp]
    float* Qs = dKs + bt * Qp;    // [bt][Qp]
    float* Vs = Qs + bt * Qp;     // [bt][Vp]
    float* dVs = Vs + bt * Vp;    // [bt][Vp]
    float* dOs = dVs + bt * Vp;   // [bt][Vp]
    float* P = dOs + bt * Vp;     // [bt][btp]
    float* dS = P + bt * btp;     // [bt][btp]
    float* L = dS + bt * btp;     // [bt]
    float* Dr = L + bt;           // [bt]

    const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    const int s0 = kt * bt, nk = min(bt, a.Tk - s0);
    const int group = a.NH / a.NKV;
    const int tid = threadIdx.x, nthr = blockDim.x, warp = tid >> 5;
    const size_t krow0 = size_t(b) * a.Tk + s0;
    for (int idx = tid; idx < bt * Dqk; idx += nthr) {
        const int j = idx / Dqk, d = idx % Dqk;
        Ks[j * Qp + d] = j < nk ? k[(krow0 + j) * a.ks + size_t(g) * Dqk + d] : 0.0f;
        dKs[j * Qp + d] = 0.0f;
    }
    for (int idx = tid; idx < bt * Dv; idx += nthr) {
        const int j = idx / Dv, d = idx % Dv;
        Vs[j * Vp + d] = j < nk ? v[(krow0 + j) * a.vs + size_t(g) * Dv + d] : 0.0f;
        dVs[j * Vp + d] = 0.0f;
    }
    if (warp == 0) tile_bounds(kb, a.kpos, a.kdoc, krow0, nk);
    const int nqt = (a.Tq + bt - 1) / bt;
    for (int h = g * group; h < (g + 1) * group; ++h) {
        for (int qt = 0; qt < nqt; ++qt) {
            const int t0 = qt * bt, nq = min(bt, a.Tq - t0);
            const size_t qrow0 = size_t(b) * a.Tq + t0;
            __syncthreads();  // previous readers of Qs/dOs/P/dS/qb are done
            if (warp == 0) tile_bounds(qb, a.qpos, a.qdoc, qrow0, nq);
            __syncthreads();
            if (tile_skipped(qb, kb, a)) continue;
            for (int idx = tid; idx < bt * Dqk; idx += nthr) {
                const int i = idx / Dqk, d = idx % Dqk;
                Qs[i * Qp + d] = i < nq ? q[(qrow0 + i) * a.qs + size_t(h) * Dqk + d] : 0.0f;
            }
            for (int idx = tid; idx < bt * Dv; idx += nthr) {
                const int i = idx / Dv, d = idx % Dv;
                dOs[i * Vp + d] = i < nq ? dout[(qrow0 + i) * a.os + size_t(h) * Dv + d] : 0.0f;
            }
            if (tid < bt) {
                const size_t r = (size_t(b) * a.NH + h) * a.Tq + t0 + tid;
                L[tid] = tid < nq ? lse[r] : -INFINITY;
                Dr[tid] = tid < nq ? Dsum[r] : 0.0f;
            }
            __syncthreads();
            // P = exp(scale Q K^T - lse) (masked), dS = P * (dO V^T - D)
            for (int idx = tid; idx < bt * bt; idx += nthr) {
                const int i = idx / bt, j = idx % bt;
                float p = 0.0f, ds = 0.0f;
                if (i < nq && j < nk && L[i] != -INFINITY && visible(a, qrow0 + i, krow0 + j)) {
                    float sdot = 0.0f, pdot = 0.0f;
                    for (int d = 0; d < Dqk; ++d) sdot += Qs[i * Qp + d] * Ks[j * Qp + d];
                    for (int d = 0; d < Dv; ++d) pdot += dOs[i * Vp + d] * Vs[j * Vp + d];
                    p = expf(a.scale * sdot - L[i]);
                    ds = p * (pdot - Dr[i]);
                }
                P[i * btp + j] = p;
                dS[i * btp + j] = ds;
            }
            __syncthreads();
            // dV += P^T dO ; dK += scale * dS^T Q   (each (j, d) has one owner thread)
            for (int idx = tid; idx < bt * Dv; idx += nthr) {
                const int j = idx / Dv, d = idx % Dv;
                float av = 0.0f;
                for (int i = 0; i < nq; ++i) av += P[i * btp + j] * dOs[i * Vp + d];
                dVs[j * Vp + d] += av;
            }
            for (int idx = tid; idx < bt * Dqk; idx += nthr) {
                const int j = idx / Dqk, d = idx % Dqk;
                float ak = 0.0f;
                for (int i = 0; i < nq; ++i) ak += dS[i * btp + j] * Qs[i * Qp + d];
                dKs[j * Qp + d] += a.scale * ak;
            }
        }
    }
    __syncthreads();
    for (int idx = tid; idx < nk * Dqk; idx += nthr) {
        const int j = idx / Dqk, d = idx % Dqk;
        dk[(krow0 + j) * a.ks + size_t(g) * Dqk + d] += dKs[j * Qp + d];
    }
    for (int idx = tid; idx < nk * Dv; idx += nthr) {
        const int j = idx / Dv, d = idx % Dv;
        dv[(krow0 + j) * a.vs + size_t(g) * Dv + d] += dVs[j * Vp + d];
    }
}

// One block per (query tile, head, batch): dQ of its rows (accumulated: +=) over the visible keys.
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dq_kernel(float* dq, const float* dout, const float* lse,
                                 const float* Dsum, const float* q, const float* k,
                                 const float* v, AttnShape a, int bt) {
    QUINTET_DYNAMIC_SMEM(sm);
    __shared__ int qb[4], kb[4];
    const int Dqk = a.Dqk, Dv = a.Dv;
    const int Qp = Dqk + 1, Vp = Dv + 1, btp = bt + 1;
    float* Qs = sm;               // [bt][Qp]
    float* dQs = Qs + bt * Qp;    // [bt][Qp]
    float* Ks = dQs + bt * Qp;    // [bt][Qp]
    float* dOs = Ks + bt * Qp;    // [bt][Vp]
    float* Vs = dOs + bt * Vp;    // [bt][Vp]
    float* dS = Vs + bt * Vp;     // [bt][btp]
    float* L = dS + bt * btp;     // [bt]
    float* Dr = L + bt;           // [bt]

    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (a.NH / a.NKV);
    const int t0 = qt * bt, nq = min(bt, a.Tq - t0);
    const int tid = threadIdx.x, nthr = blockDim.x, warp = tid >> 5;
    const size_t qrow0 = size_t(b) * a.Tq + t0;
    for (int idx = tid; idx < bt * Dqk; idx += nthr) {
        const int i = idx / Dqk, d = idx % Dqk;
        Qs[i * Qp + d] = i < nq ? q[(qrow0 + i) * a.qs + size_t(h) * Dqk + d] : 0.0f;
        dQs[i * Qp + d] = 0.0f;
    }
    for (int idx = tid; idx < bt * Dv; idx += nthr) {
        const int i = idx / Dv, d = idx % Dv;
        dOs[i * Vp + d] = i < nq ? dout[(qrow0 + i) * a.os + size_t(h) * Dv + d] : 0.0f;
    }
    if (tid < bt) {
        const size_t r = (size_t(b) * a.NH + h) * a.Tq + t0 + tid;
        L[tid] = tid < nq ? lse[r] : -INFINITY;
        Dr[tid] = tid < nq ? Dsum[r] : 0.0f;
    }
    if (warp == 0) tile_bounds(qb, a.qpos, a.qdoc, qrow0, nq);
    for (int s0 = 0; s0 < a.Tk; s0 += bt) {
        const int nk = min(bt, a.Tk - s0);
        const size_t krow0 = size_t(b) * a.Tk + s0;
        __syncthreads();  // previous readers of Ks/Vs/dS/kb are done; init visible
        if (warp == 0) tile_bounds(kb, a.kpos, a.kdoc, krow0, nk);
        __syncthreads();
        if (tile_skipped(qb, kb, a)) continue;
        for (int idx = tid; idx < bt * Dqk; idx += nthr) {
            const int j = idx / Dqk, d = idx % Dqk;
            Ks[j * Qp + d] = j < nk ? k[(krow0 + j) * a.ks + size_t(g) * Dqk + d] : 0.0f;
        }
        for (int idx = tid; idx < bt * Dv; idx += nthr) {
            const int j = idx / Dv, d = idx % Dv;
            Vs[j * Vp + d] = j < nk ? v[(krow0 + j) * a.vs + size_t(g) * Dv + d] : 0.0f;
        }
        __syncthreads();
        for (int idx = tid; idx < bt * bt; idx += nthr) {
            const int i = idx / bt, j = idx % bt;
            float ds = 0.0f;
            if (i < nq && j < nk && L[i] != -INFINITY && visible(a, qrow0 + i, krow0 + j)) {
                float sdot = 0.0f, pdot = 0.0f;
                for (int d = 0; d < Dqk; ++d) sdot += Qs[i * Qp + d] * Ks[j * Qp + d];
                for (int d = 0; d < Dv; ++d) pdot += dOs[i * Vp + d] * Vs[j * Vp + d];
                const float p = expf(a.scale * sdot - L[i]);
                ds = p * (pdot - Dr[i]);
            }
            dS[i * btp + j] = ds;
        }
        __syncthreads();
        // dQ += scale * dS K
        for (int idx = tid; idx < bt * Dqk; idx += nthr) {
            const int i = idx / Dqk, d = idx % Dqk;
            float acc = 0.0f;
            for (int j = 0; j < nk; ++j) acc += dS[i * btp + j] * Ks[j * Qp + d];
            dQs[i * Qp + d] += a.scale * acc;
        }
    }
    __syncthreads();
    for (int idx = tid; idx < nq * Dqk; idx += nthr) {
        const int i = idx / Dqk, d = idx % Dqk;
        dq[(qrow0 + i) * a.qs + size_t(h) * Dqk + d] += dQs[i * Qp + d];
    }
}

}  // namespace quintet::cuda::kern
