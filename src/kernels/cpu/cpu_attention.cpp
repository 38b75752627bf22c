// The CPU attention kernels (the twin of src/kernels/cuda/attention.cu): Backend's one general
// attention operation, forward, merge and backward. RoPE is in cpu_rope.cpp.
//
// Work split. Forward: one task per (batch, head, query tile), each writing its own rows of out
// and lse, scheduled dynamically. Backward: dQ rows belong to one (batch, head, query tile) task,
// dK/dV rows to all the tasks of a (batch, kv head) pair. With enough pairs for the threads, one
// dynamically scheduled task per pair (one writer per dK/dV row, the bits of a plain loop for any
// thread count); with few pairs (fewer than the threads, or an uneven split: one sequence of MQA
// on 2 threads, say) the
// (batch, head, query tile) tasks are dealt to threads by cost so that none idles, thread 0
// accumulating straight into dk/dv and the others into private buffers added afterwards in
// thread order -- a pure function of the shapes and the thread count, so a given thread count
// gives the same bits every run.
//
// Products. Each call first packs every key tile's K^T and V (forward; K^T, V^T and K in the
// backward) into panels for cpu_tile_gemm.hpp, work-shared over threads: a key tile serves every
// query tile and every head of its kv group, so it is read from memory and packed once. A task
// packs its query tile's Q (and dO) once for all its key tiles; the score tile is read in place.
// A causal tile on the diagonal is a triangle: its products are cut per 6-row block at the
// causal frontier (TileLimits), ~40% of such a tile's work, 9-17% of the whole at T 256-512.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"
#include "cpu_tile_gemm.hpp"

namespace quintet::cpu {

namespace {

constexpr int kBq = 64;  // query rows per attention tile
constexpr int kBk = 64;  // key rows per attention tile
constexpr int kBlocks = (std::max(kBq, kBk) + kTileMR - 1) / kTileMR;  // 6-row blocks per tile

// Per (b, tile) bounds of positions and documents: [pmin, pmax, dmin, dmax].
void tile_bounds(std::vector<int32_t>& out, const int32_t* pos, const int32_t* doc, int B, int T,
                 int tile) {
    const int nt = (T + tile - 1) / tile;
    out.resize(size_t(B) * nt * 4);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < nt; ++t) {
            int32_t pmin = INT32_MAX, pmax = INT32_MIN, dmin = INT32_MAX, dmax = INT32_MIN;
            for (int i = t * tile; i < std::min(T, (t + 1) * tile); ++i) {
                const size_t r = size_t(b) * T + i;
                pmin = std::min(pmin, pos[r]);
                pmax = std::max(pmax, pos[r]);
                if (doc) {
                    dmin = std::min(dmin, doc[r]);
                    dmax = std::max(dmax, doc[r]);
                }
            }
            int32_t* o = out.data() + (size_t(b) * nt + t) * 4;
            o[0] = pmin, o[1] = pmax, o[2] = dmin, o[3] = dmax;
        }
}

// What one (query tile, key tile) pair needs: skip, a full tile, or per-element masks.
enum class TileKind { skip, full, masked };

struct Masker {
    const AttentionArgs& a;
    const int32_t *qb, *kb;  // tile bounds
    int nqt, nkt;
    TileKind kind(int b, int qt, int kt) const {
        const int32_t* Q = qb + (size_t(b) * nqt + qt) * 4;
        const int32_t* K = kb + (size_t(b) * nkt + kt) * 4;
        if (a.causal && K[0] > Q[1]) return TileKind::skip;
        if (a.q_doc && (K[3] < Q[2] || K[2] > Q[3])) return TileKind::skip;
        const bool causal_full = !a.causal || K[1] <= Q[0];
        const bool doc_full = !a.q_doc || (Q[2] == Q[3] && K[2] == K[3] && Q[2] == K[2]);
        return causal_full && doc_full ? TileKind::full : TileKind::masked;
    }
    // Keys of the tile at s0 past the last one any query of tile qt can see (causal) are dropped from
    // the tile's GEMMs: the causal frontier, as a plain loop over visible keys would have it.
    int keys(int b, int qt, int s0, int nk) const {
        if (!a.causal) return nk;
        return keys_up_to(qb[(size_t(b) * nqt + qt) * 4 + 1], a.k_pos + size_t(b) * a.Tk + s0, nk);
    }
    // Of nk keys at positions kp, how many remain once the trailing ones past position qmax go.
    static int keys_up_to(int32_t qmax, const int32_t* kp, int nk) {
        int n = nk;
        while (n > 0 && kp[n - 1] > qmax) --n;
        return n;
    }
    // A causal tile's triangle, per 6-row block (TileLimits): for each block of its nq queries
    // from qrow0, the keys (of nk from krow0) past which none of the block sees any, as keys()
    // finds for the whole tile; for each block of keys, the queries before the first that sees
    // any of them.
    void query_limits(int* n_end, size_t qrow0, int nq, size_t krow0, int nk) const {
        const int32_t* kp = a.k_pos + krow0;
        for (int i0 = 0, ib = 0; i0 < nq; i0 += kTileMR, ++ib) {
            int32_t qmax = INT32_MIN;
            for (int i = i0; i < std::min(nq, i0 + kTileMR); ++i) qmax = std::max(qmax, a.q_pos[qrow0 + i]);
            n_end[ib] = keys_up_to(qmax, kp, nk);
        }
    }
    void key_limits(int* p_begin, size_t qrow0, int nq, size_t krow0, int nk) const {
        const int32_t* qp = a.q_pos + qrow0;
        for (int j0 = 0, jb = 0; j0 < nk; j0 += kTileMR, ++jb) {
            int32_t kmin = INT32_MAX;
            for (int j = j0; j < std::min(nk, j0 + kTileMR); ++j) kmin = std::min(kmin, a.k_pos[krow0 + j]);
            int p = 0;
            while (p < nq && qp[p] < kmin) ++p;
            p_begin[jb] = p;
        }
    }
    // Scores of keys krow0.. that query qrow may not see become -inf (branch-free, so it
    // vectorises: a masked tile costs about what a full one does).
    void mask_row(float* srow, size_t qrow, size_t krow0, int nk) const {
        const int32_t qp = a.q_pos[qrow];
        const int32_t* kp = a.k_pos + krow0;
        if (a.q_doc) {
            const int32_t qd = a.q_doc[qrow];
            const int32_t* kd = a.k_doc + krow0;
            const bool causal = a.causal;
#pragma omp simd
            for (int j = 0; j < nk; ++j)
                srow[j] = (kd[j] == qd && (!causal || kp[j] <= qp)) ? srow[j] : -INFINITY;
        } else if (a.causal) {
#pragma omp simd
            for (int j = 0; j < nk; ++j) srow[j] = kp[j] <= qp ? srow[j] : -INFINITY;
        }
    }
};

// Of a triangle tile's row i, the columns its score GEMM computed: the 16-wide panels up to its
// 6-row block's last visible key (TileLimits::n_end). The keys past them are masked, so the
// softmax leaves them out: its exps, max and sum see only exact zeros there (docs/math.md 5.3).
int computed_keys(const int* n_end, int i, int nk) {
    return std::min(nk, (n_end[i / kTileMR] + kTileNR - 1) / kTileNR * kTileNR);
}

// Scratch grows to the largest shape seen and stays (no allocation in the steady state).
void grow(std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
}

AttentionScratch::Tile& tile_of(AttentionScratch& sc, int thread, int Dqk, int Dv) {
    AttentionScratch::Tile& t = sc.tiles[size_t(thread)];
    if (t.s.size() < size_t(kBq) * kBk) {
        t.s.resize(size_t(kBq) * kBk);
        t.dp.resize(size_t(kBq) * kBk);
        t.m.resize(kBq);
        t.l.resize(kBq);
        t.d.resize(kBq);
    }
    grow(t.q_a, tile_packed_a_size(kBq, Dqk));
    grow(t.do_a, tile_packed_a_size(kBq, Dv));
    grow(t.q_b, tile_packed_b_size(kBq, Dqk));
    grow(t.do_b, tile_packed_b_size(kBq, Dv));
    grow(t.o, size_t(kBq) * Dv);
    grow(t.dq, size_t(kBq) * Dqk);
    return t;
}

// Floats per key tile of a packed key-side operand of head dim D: transposed, the head dims are
// the rows (K^T, V^T: one panel per 16 keys); else the keys are (K, V: one per 16 dims).
size_t key_block(int D, bool transposed) {
    return transposed ? tile_packed_b_size(D, kBk) : tile_packed_b_size(kBk, D);
}

// Packs x's tile of every (sequence b, kv head g, key tile kt) as B panels, block
// (b * NKV + g) * nkt + kt of dst. Work-shares an enclosing parallel region (omp for).
void pack_key_tiles(float* dst, const float* x, int stride, int D, bool transposed,
                    const AttentionArgs& a, int nkt) {
    const size_t per = key_block(D, transposed);
    const long units = long(a.B) * a.NKV * nkt;
#pragma omp for schedule(static)
    for (long u = 0; u < units; ++u) {
        const int kt = int(u % nkt), g = int((u / nkt) % a.NKV), b = int(u / (long(nkt) * a.NKV));
        const int s0 = kt * kBk, nk = std::min(kBk, a.Tk - s0);
        const float* X = x + (size_t(b) * a.Tk + s0) * stride + size_t(g) * D;
        if (transposed) tile_pack_b(dst + size_t(u) * per, D, nk, X, 1, stride);
        else tile_pack_b(dst + size_t(u) * per, nk, D, X, stride, 1);
    }
}

void check_args(const AttentionArgs& a) {
    QUINTET_CHECK(a.NKV > 0 && a.NH % a.NKV == 0, "attention: NH must be a multiple of NKV");
    QUINTET_CHECK(a.q_pos && a.k_pos, "attention: query and key positions are required");
    QUINTET_CHECK((a.q_doc == nullptr) == (a.k_doc == nullptr),
                  "attention: document ids for both queries and keys, or neither");
}

}  // namespace

// One query row per sequence (a decoder step): the scores straight from the cache's rows. The
// tiles would pack every key and value of the cache again at every step, which at a few hundred
// keys costs more than the arithmetic. The heads of a kv group are done together, so each cached
// key and value row is read once per group rather than once per head (GQA's 4 heads, MLA's
// latent cache shared by every head: the cache is read from L3 at a few hundred tokens); where
// there are fewer groups than threads, a group's heads are split among threads. The same maths
// (exp_fast, out = 0 and lse = -inf where no key is visible); the sums run in another order than
// the tiles', so a step's output equals the whole forward's to rounding, not bit for bit (the
// decoder's tests hold it to 1e-4).
static void attention_one_row(float* out, float* lse, const float* q, const float* k, const float* v,
                              const AttentionArgs& a, int threads) {
    const int group = a.NH / a.NKV, Dqk = a.Dqk, Dv = a.Dv, Tk = a.Tk;
    const long pairs = long(a.B) * a.NKV;
    const int parts = int(std::max<long>(1, std::min<long>(group, threads / std::max<long>(1, pairs))));
    const long tasks = pairs * parts;
#pragma omp parallel if (tasks > 1 && long(Tk) * (Dqk + Dv) * a.NH * a.B > (1 << 16))
    {
        // Scratch kept per thread: it grows with the cache (by doubling), not every step.
        static thread_local std::vector<float> S, O, Z;
#pragma omp for schedule(static)
        for (long task = 0; task < tasks; ++task) {
            const int b = int(task / (long(a.NKV) * parts)), g = int(task / parts % a.NKV), part = int(task % parts);
            const int h0 = g * group + group * part / parts, nh = g * group + group * (part + 1) / parts - h0;
            if (S.size() < size_t(nh) * Tk) S.resize(std::max(size_t(nh) * Tk, 2 * S.size()));
            if (O.size() < size_t(nh) * Dv) O.resize(size_t(nh) * Dv);
            if (Z.size() < size_t(nh)) Z.resize(size_t(nh));
            const float* qb = q + size_t(b) * a.q_stride + size_t(h0) * Dqk;
            const int32_t qp = a.q_pos[b];
            const int32_t* kp = a.k_pos + size_t(b) * Tk;
            const int32_t* kd = a.k_doc ? a.k_doc + size_t(b) * Tk : nullptr;
            const int32_t qd = a.q_doc ? a.q_doc[b] : 0;
            // Scores: S[i][t] for head h0 + i, each key row read once for the heads.
            for (int t = 0; t < Tk; ++t) {
                const bool visible = (!a.causal || kp[t] <= qp) && (!kd || kd[t] == qd);
                const float* kr = k + (size_t(b) * Tk + t) * a.k_stride + size_t(g) * Dqk;
                for (int i = 0; i < nh; ++i) {
                    float sc = -INFINITY;
                    if (visible) {
                        const float* qr = qb + size_t(i) * Dqk;
                        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                        for (int d = 0; d < Dqk; ++d) dot += qr[d] * kr[d];
                        sc = a.scale * dot;
                    }
                    S[size_t(i) * Tk + t] = sc;
                }
            }
            // Softmax per head: the maximum, exp and the sum.
            float* o = O.data();
            std::memset(o, 0, size_t(nh) * Dv * 4);
            bool any = false;
            for (int i = 0; i < nh; ++i) {
                float* Si = S.data() + size_t(i) * Tk;
                float mx = -INFINITY;
                for (int t = 0; t < Tk; ++t) mx = std::max(mx, Si[t]);
                float* L = lse + size_t(b) * a.NH + h0 + i;
                if (mx == -INFINITY) {  // no visible key: out is 0
                    *L = -INFINITY;
                    continue;
                }
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int t = 0; t < Tk; ++t) {
                    const float p = cpu::exp_fast(Si[t] - mx);
                    Si[t] = p;
                    sum += p;
                }
                *L = mx + std::log(sum);
                Z[size_t(i)] = sum;
                any = true;
            }
            // Values: each value row read once for the heads.
            if (any)
                for (int t = 0; t < Tk; ++t) {
                    const float* vr = v + (size_t(b) * Tk + t) * a.v_stride + size_t(g) * Dv;
                    for (int i = 0; i < nh; ++i) {
                        const float p = S[size_t(i) * Tk + t];
                        if (!(p > 0.0f)) continue;  // masked (exp_fast(-inf) is exactly 0), or no key at all
                        float* oi = o + size_t(i) * Dv;
#pragma omp simd
                        for (int d = 0; d < Dv; ++d) oi[d] += p * vr[d];
                    }
                }
            for (int i = 0; i < nh; ++i) {
                float* orow = out + size_t(b) * a.o_stride + size_t(h0 + i) * Dv;
                const float* L = lse + size_t(b) * a.NH + h0 + i;
                if (*L == -INFINITY) {
                    std::memset(orow, 0, size_t(Dv) * 4);
                    continue;
                }
                const float inv = 1.0f / Z[size_t(i)];
                const float* oi = o + size_t(i) * Dv;
#pragma omp simd
                for (int d = 0; d < Dv; ++d) orow[d] = oi[d] * inv;
            }
        }
    }
}

// Forward: for each (b, h, query tile) an online softmax over the visible key tiles.
void CpuBackend::attention_forward(float* out, float* lse, const float* q, const float* k,
                                   const float* v, const AttentionArgs& a) {
    if (a.B <= 0 || a.Tq <= 0 || a.NH <= 0) return;
    check_args(a);
    if (a.Tq == 1) return attention_one_row(out, lse, q, k, v, a, threads_);
    const int group = a.NH / a.NKV, Dqk = a.Dqk, Dv = a.Dv;
    const int nqt = (a.Tq + kBq - 1) / kBq, nkt = (a.Tk + kBk - 1) / kBk;
    tile_bounds(att_.qb, a.q_pos, a.q_doc, a.B, a.Tq, kBq);
    tile_bounds(att_.kb, a.k_pos, a.k_doc, a.B, a.Tk, kBk);
    att_.tiles.resize(size_t(threads_));
    const Masker mk{a, att_.qb.data(), att_.kb.data(), nqt, nkt};
    const long tasks = long(a.B) * a.NH * nqt;
    const size_t units = size_t(a.B) * a.NKV * nkt;
    const size_t kT_per = key_block(Dqk, true), v_per = key_block(Dv, false);
    grow(att_.kT, units * kT_per);
    grow(att_.v, units * v_per);
    float* kT = att_.kT.data();
    float* vp = att_.v.data();
#pragma omp parallel
    {
        AttentionScratch::Tile& sc = tile_of(att_, omp_get_thread_num(), Dqk, Dv);
        float* S = sc.s.data();
        float* mrow = sc.m.data();
        float* lrow = sc.l.data();
        pack_key_tiles(kT, k, a.k_stride, Dqk, true, a, nkt);
        pack_key_tiles(vp, v, a.v_stride, Dv, false, a, nkt);  // the omp for's barrier: all packed
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < tasks; ++task) {
            // The last query tiles (the most keys) first.
            const int qt = nqt - 1 - int(task % nqt);
            const int h = int((task / nqt) % a.NH);
            const int b = int(task / (long(nqt) * a.NH));
            const int g = h / group;
            const int t0 = qt * kBq, nq = std::min(kBq, a.Tq - t0);
            const size_t qrow0 = size_t(b) * a.Tq + t0;
            const float* Q = q + qrow0 * a.q_stride + size_t(h) * Dqk;
            // O accumulates in contiguous scratch: out's rows are a multiple of 1 KiB apart
            // (all heads side by side), which would map a tile's rows onto a few L1 sets.
            float* O = sc.o.data();
            const long ldo = Dv;
            for (int i = 0; i < nq; ++i) {
                mrow[i] = -INFINITY;
                lrow[i] = 0.0f;
            }
            std::memset(O, 0, size_t(nq) * Dv * 4);
            tile_pack_a(sc.q_a.data(), nq, Dqk, Q, a.q_stride, 1);
            for (int kt = 0; kt < nkt; ++kt) {
                const TileKind kind = mk.kind(b, qt, kt);
                if (kind == TileKind::skip) continue;
                const int s0 = kt * kBk;
                const int nk = mk.keys(b, qt, s0, std::min(kBk, a.Tk - s0));
                if (nk == 0) continue;
                const size_t krow0 = size_t(b) * a.Tk + s0;
                const size_t unit = (size_t(b) * a.NKV + g) * nkt + kt;
                // A causal diagonal tile is a triangle: per 6-row block of queries, the panels
                // of keys past the block's last visible one are not computed (mask_row makes
                // them -inf), and P V stops at that key.
                int n_end[kBlocks];
                TileLimits lim_s, lim_pv;
                const bool triangle = kind == TileKind::masked && a.causal;
                if (triangle) {
                    mk.query_limits(n_end, qrow0, nq, krow0, nk);
                    lim_s.n_end = lim_pv.p_end = n_end;
                }
                // S = scale * Q K^T
                tile_gemm_packed(nq, nk, Dqk, a.scale, sc.q_a.data(), kT + unit * kT_per, Dqk, 0.0f, S, kBk,
                                 lim_s);
                for (int i = 0; i < nq; ++i) {
                    float* srow = S + size_t(i) * kBk;
                    // P V reads no further than the block's n_end; a multiple of 16 (or nk) keeps
                    // the sum's lanes as over all nk.
                    const int nc = triangle ? computed_keys(n_end, i, nk) : nk;
                    if (kind == TileKind::masked) mk.mask_row(srow, qrow0 + i, krow0, nc);
                    const float mx = cpu::max_of(srow, nc, mrow[i]);
                    if (mx == -INFINITY) {  // nothing visible yet in this row
                        for (int j = 0; j < nk; ++j) srow[j] = 0.0f;
                        continue;
                    }
                    const float corr = cpu::exp_fast(mrow[i] - mx);
                    // Masked scores are -inf here, and exp_fast(-inf) is exactly 0.
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int j = 0; j < nc; ++j) {
                        const float p = cpu::exp_fast(srow[j] - mx);
                        srow[j] = p;
                        sum += p;
                    }
                    lrow[i] = lrow[i] * corr + sum;
                    mrow[i] = mx;
                    if (corr != 1.0f) {
                        float* orow = O + size_t(i) * ldo;
#pragma omp simd
                        for (int d = 0; d < Dv; ++d) orow[d] *= corr;
                    }
                }
                tile_gemm_packed_b(nq, Dv, nk, 1.0f, S, kBk, 1, vp + unit * v_per,
                                   std::min(kBk, a.Tk - s0), 1.0f, O, ldo, lim_pv);
            }
            float* L = lse + (size_t(b) * a.NH + h) * a.Tq + t0;
            for (int i = 0; i < nq; ++i) {
                float* orow = out + (qrow0 + i) * a.o_stride + size_t(h) * Dv;
                if (lrow[i] == 0.0f) {  // no visible key: out is 0
                    std::memset(orow, 0, size_t(Dv) * 4);
                    L[i] = -INFINITY;
                    continue;
                }
                const float inv = 1.0f / lrow[i];
                const float* oacc = O + size_t(i) * ldo;
#pragma omp simd
                for (int d = 0; d < Dv; ++d) orow[d] = oacc[d] * inv;
                L[i] = mrow[i] + std::log(lrow[i]);
            }
        }
    }
}

void CpuBackend::attention_merge(float* out, float* lse, const float* out2, const float* lse2,
                                 const AttentionArgs& a) {
    const long rows = long(a.B) * a.Tq;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; ++r) {
        const long b = r / a.Tq, t = r % a.Tq;
        for (int h = 0; h < a.NH; ++h) {
            const size_t li = (size_t(b) * a.NH + h) * a.Tq + t;
            const float la = lse[li], lb = lse2[li];
            float* o = out + size_t(r) * a.o_stride + size_t(h) * a.Dv;
            const float* o2 = out2 + size_t(r) * a.o_stride + size_t(h) * a.Dv;
            if (lb == -INFINITY) continue;
            if (la == -INFINITY) {
                std::memcpy(o, o2, size_t(a.Dv) * 4);
                lse[li] = lb;
                continue;
            }
            const float m = std::max(la, lb);
            const float wa = std::exp(la - m), wb = std::exp(lb - m), s = wa + wb;
            const float ca = wa / s, cb = wb / s;
            for (int d = 0; d < a.Dv; ++d) o[d] = ca * o[d] + cb * o2[d];
            lse[li] = m + std::log(s);
        }
    }
}

namespace {

// The key tiles' operands of the backward, packed by pack_key_tiles.
struct PackedKeys {
    const float *kT, *vT, *k;
    size_t kT_per, vT_per, k_per;
};

// One backward task: query tile qt of head h of sequence b, over every visible key tile. dQ of
// its rows accumulates into dq; dK/dV of the keys it sees into dK0/dV0 (row strides lk, lv).
void backward_task(long task, const AttentionArgs& a, const Masker& mk, int nqt, int nkt,
                   AttentionScratch::Tile& sc, float* dq, float* dK0, size_t lk, float* dV0,
                   size_t lv, const float* dout, const float* out, const float* lse,
                   const float* q, const PackedKeys& pk) {
    const int Dqk = a.Dqk, Dv = a.Dv, group = a.NH / a.NKV;
    float* P = sc.s.data();
    float* dP = sc.dp.data();
    float* D = sc.d.data();
    const int qt = int(task % nqt);
    const int h = int((task / nqt) % a.NH);
    const int b = int(task / (long(nqt) * a.NH));
    const int g = h / group;
    const int t0 = qt * kBq, nq = std::min(kBq, a.Tq - t0);
    const size_t qrow0 = size_t(b) * a.Tq + t0;
    const float* Q = q + qrow0 * a.q_stride + size_t(h) * Dqk;
    const float* dO = dout + qrow0 * a.o_stride + size_t(h) * Dv;
    const float* O = out + qrow0 * a.o_stride + size_t(h) * Dv;
    // dQ accumulates in contiguous scratch (q's rows are a multiple of 1 KiB apart), added to dq
    // at the end.
    float* dQ = sc.dq.data();
    std::memset(dQ, 0, size_t(nq) * Dqk * 4);
    const float* L = lse + (size_t(b) * a.NH + h) * a.Tq + t0;
    for (int i = 0; i < nq; ++i) {
        const float* dOi = dO + size_t(i) * a.o_stride;
        const float* Oi = O + size_t(i) * a.o_stride;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int d = 0; d < Dv; ++d) s += dOi[d] * Oi[d];
        D[i] = s;
    }
    // This query tile's operands, packed once for all its key tiles.
    tile_pack_a(sc.q_a.data(), nq, Dqk, Q, a.q_stride, 1);
    tile_pack_a(sc.do_a.data(), nq, Dv, dO, a.o_stride, 1);
    tile_pack_b(sc.q_b.data(), nq, Dqk, Q, a.q_stride, 1);
    tile_pack_b(sc.do_b.data(), nq, Dv, dO, a.o_stride, 1);
    for (int kt = 0; kt < nkt; ++kt) {
        const TileKind kind = mk.kind(b, qt, kt);
        if (kind == TileKind::skip) continue;
        const int s0 = kt * kBk;
        const int nk = mk.keys(b, qt, s0, std::min(kBk, a.Tk - s0));
        if (nk == 0) continue;
        const size_t krow0 = size_t(b) * a.Tk + s0;
        const size_t unit = (size_t(b) * a.NKV + g) * nkt + kt;
        const int nk_tile = std::min(kBk, a.Tk - s0);  // the rows of the packed K panels
        float* dK = dK0 + krow0 * lk + size_t(g) * Dqk;
        float* dV = dV0 + krow0 * lv + size_t(g) * Dv;
        // A causal diagonal tile's triangle (as in the forward): per block of queries, the key
        // panels past its last visible key are not computed (P there is 0 by the mask, dS set
        // to 0) and dQ's sums stop at that key; per block of keys, dV's and dK's sums start at
        // the first query that sees one.
        int n_end[kBlocks], p_begin[kBlocks];
        TileLimits by_query, by_key;
        const bool triangle = kind == TileKind::masked && a.causal;
        if (triangle) {
            mk.query_limits(n_end, qrow0, nq, krow0, nk);
            mk.key_limits(p_begin, qrow0, nq, krow0, nk);
            by_query.n_end = n_end;
            by_key.p_begin = p_begin;
        }
        TileLimits dq_lim;
        dq_lim.p_end = by_query.n_end;
        // P = exp(scale * Q K^T - lse), masked
        tile_gemm_packed(nq, nk, Dqk, a.scale, sc.q_a.data(), pk.kT + unit * pk.kT_per, Dqk, 0.0f, P, kBk,
                         by_query);
        for (int i = 0; i < nq; ++i) {
            float* prow = P + size_t(i) * kBk;
            if (L[i] == -INFINITY) {
                for (int j = 0; j < nk; ++j) prow[j] = 0.0f;
                continue;
            }
            // Masked scores are -inf, and exp_fast(-inf) is exactly 0; past the computed panels
            // P is that 0 without the exp (dV's sums may read it).
            const int nc = triangle ? computed_keys(n_end, i, nk) : nk;
            if (kind == TileKind::masked) mk.mask_row(prow, qrow0 + i, krow0, nc);
            const float l = L[i];
#pragma omp simd
            for (int j = 0; j < nc; ++j) prow[j] = cpu::exp_fast(prow[j] - l);
            for (int j = nc; j < nk; ++j) prow[j] = 0.0f;
        }
        // dV += P^T dO
        tile_gemm_packed_b(nk, Dv, nq, 1.0f, P, 1, kBk, sc.do_b.data(), nq, 1.0f, dV, long(lv), by_key);
        // dP = dO V^T
        tile_gemm_packed(nq, nk, Dv, 1.0f, sc.do_a.data(), pk.vT + unit * pk.vT_per, Dv, 0.0f, dP, kBk,
                         by_query);
        // dS = P * (dP - D), stored in dP; 0 in the panels dP left out
        for (int i = 0; i < nq; ++i) {
            float* prow = P + size_t(i) * kBk;
            float* drow = dP + size_t(i) * kBk;
            const float di = D[i];
            const int nc = triangle ? computed_keys(n_end, i, nk) : nk;
#pragma omp simd
            for (int j = 0; j < nc; ++j) drow[j] = prow[j] * (drow[j] - di);
            for (int j = nc; j < nk; ++j) drow[j] = 0.0f;
        }
        // dQ += scale * dS K ; dK += scale * dS^T Q
        tile_gemm_packed_b(nq, Dqk, nk, a.scale, dP, kBk, 1, pk.k + unit * pk.k_per, nk_tile, 1.0f,
                           dQ, Dqk, dq_lim);
        tile_gemm_packed_b(nk, Dqk, nq, a.scale, dP, 1, kBk, sc.q_b.data(), nq, 1.0f, dK, long(lk), by_key);
    }
    for (int i = 0; i < nq; ++i) {
        float* dst = dq + (qrow0 + i) * a.q_stride + size_t(h) * Dqk;
        const float* src = dQ + size_t(i) * Dqk;
#pragma omp simd
        for (int d = 0; d < Dqk; ++d) dst[d] += src[d];
    }
}

}  // namespace

// Backward: P is recomputed from the saved lse; D = rowsum(dO * O); dS = P * (dO V^T - D).
void CpuBackend::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                    const float* out, const float* lse, const float* q,
                                    const float* k, const float* v, const AttentionArgs& a) {
    if (a.B <= 0 || a.Tq <= 0 || a.Tk <= 0 || a.NH <= 0) return;
    check_args(a);
    const int nqt = (a.Tq + kBq - 1) / kBq, nkt = (a.Tk + kBk - 1) / kBk;
    tile_bounds(att_.qb, a.q_pos, a.q_doc, a.B, a.Tq, kBq);
    tile_bounds(att_.kb, a.k_pos, a.k_doc, a.B, a.Tk, kBk);
    const Masker mk{a, att_.qb.data(), att_.kb.data(), nqt, nkt};
    const int nth = threads_;
    att_.tiles.resize(size_t(nth));
    const int group = a.NH / a.NKV;
    const size_t units = size_t(a.B) * a.NKV * nkt;
    PackedKeys keys{nullptr, nullptr, nullptr, key_block(a.Dqk, true), key_block(a.Dv, true),
                    key_block(a.Dqk, false)};
    grow(att_.kT, units * keys.kT_per);
    grow(att_.vT, units * keys.vT_per);
    grow(att_.k, units * keys.k_per);
    keys.kT = att_.kT.data(), keys.vT = att_.vT.data(), keys.k = att_.k.data();
#pragma omp parallel num_threads(nth)
    {
        pack_key_tiles(att_.kT.data(), k, a.k_stride, a.Dqk, true, a, nkt);
        pack_key_tiles(att_.vT.data(), v, a.v_stride, a.Dv, true, a, nkt);
        pack_key_tiles(att_.k.data(), k, a.k_stride, a.Dqk, false, a, nkt);
    }
    // Enough (sequence, kv head) pairs to keep every thread busy -- as many as threads, or so
    // many that an uneven split costs under 25% -- one task per pair, scheduled dynamically
    // (robust to a core being busy elsewhere); a pair's dK/dV have one writer, so every thread
    // count gives the same bits, those of a plain loop.
    const long pairs = long(a.B) * a.NKV;
    if (nth == 1 || pairs % nth == 0 || pairs >= 4L * nth) {
#pragma omp parallel num_threads(nth)
        {
            AttentionScratch::Tile& sc = tile_of(att_, omp_get_thread_num(), a.Dqk, a.Dv);
#pragma omp for schedule(dynamic, 1)
            for (long pr = 0; pr < pairs; ++pr) {
                const long b = pr / a.NKV, g = pr % a.NKV;
                for (long h = g * group; h < (g + 1) * group; ++h)
                    for (int qt = 0; qt < nqt; ++qt)
                        backward_task((b * a.NH + h) * nqt + qt, a, mk, nqt, nkt, sc, dq, dk,
                                      size_t(a.k_stride), dv, size_t(a.v_stride), dout, out, lse, q, keys);
            }
        }
        return;
    }
    // Few pairs (one sequence of MQA, say): tasks (sequence, head, query tile), dealt to nth
    // lists by cost -- the most expensive first, each to the least-loaded list (lowest index on
    // ties) -- each list then run in canonical order by its thread. List 0 accumulates into
    // dk/dv; list l > 0 into private buffers, added in list order afterwards. The assignment is
    // a function of the shapes and the thread count only, so the bits are too.
    const long ntasks = long(a.B) * a.NH * nqt;
    att_.tasks.resize(size_t(nth));
    for (auto& l : att_.tasks) l.clear();  // capacity kept: no allocation once warm
    auto& cost = att_.cost;
    cost.resize(size_t(ntasks));
    for (long t = 0; t < ntasks; ++t) {
        const int qt = int(t % nqt), b = int(t / (long(nqt) * a.NH));
        int c = 0;
        for (int kt = 0; kt < nkt; ++kt) c += mk.kind(b, qt, kt) != TileKind::skip;
        cost[size_t(t)] = {c, t};
    }
    std::sort(cost.begin(), cost.end(), [](const auto& x, const auto& y) {
        return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
    att_.load.assign(size_t(nth), 0.0);
    for (const auto& [c, t] : cost) {
        const size_t l = size_t(std::min_element(att_.load.begin(), att_.load.end()) - att_.load.begin());
        att_.load[l] += c + 0.01;  // + per-task overhead: spreads empty tasks too
        att_.tasks[l].push_back(t);
    }
    for (auto& l : att_.tasks) std::sort(l.begin(), l.end());
    // Private buffers [B*Tk, NKV*D] of lists 1..
    const size_t ldk = size_t(a.NKV) * a.Dqk, ldv = size_t(a.NKV) * a.Dv;
    const size_t nk_rows = size_t(a.B) * a.Tk;
    att_.dk.resize(size_t(nth));
    att_.dv.resize(size_t(nth));
    for (int l = 1; l < nth; ++l) {
        if (att_.tasks[size_t(l)].empty()) continue;
        auto& bk = att_.dk[size_t(l)];
        auto& bv = att_.dv[size_t(l)];
        if (bk.size() < nk_rows * ldk) bk.resize(nk_rows * ldk);
        if (bv.size() < nk_rows * ldv) bv.resize(nk_rows * ldv);
    }
#pragma omp parallel num_threads(nth)
    {
        const int th = omp_get_thread_num(), nt = omp_get_num_threads();
        AttentionScratch::Tile& sc = tile_of(att_, th, a.Dqk, a.Dv);
        for (int l = th; l < nth; l += nt) {  // one list per thread, unless fewer threads came
            const auto& tasks = att_.tasks[size_t(l)];
            if (tasks.empty()) continue;
            float *dK0 = dk, *dV0 = dv;
            size_t lk = size_t(a.k_stride), lv = size_t(a.v_stride);
            if (l > 0) {
                auto& bk = att_.dk[size_t(l)];
                auto& bv = att_.dv[size_t(l)];
                std::fill(bk.begin(), bk.begin() + long(nk_rows * ldk), 0.0f);
                std::fill(bv.begin(), bv.begin() + long(nk_rows * ldv), 0.0f);
                dK0 = bk.data(), dV0 = bv.data(), lk = ldk, lv = ldv;
            }
            for (long task : tasks)
                backward_task(task, a, mk, nqt, nkt, sc, dq, dK0, lk, dV0, lv, dout, out, lse, q, keys);
        }
#pragma omp barrier
        // dk/dv += the private buffers: rows split over threads, lists added in order.
#pragma omp for schedule(static)
        for (long r = 0; r < long(nk_rows); ++r)
            for (int l = 1; l < nth; ++l) {
                if (att_.tasks[size_t(l)].empty()) continue;
                const float* pk = att_.dk[size_t(l)].data() + size_t(r) * ldk;
                const float* pv = att_.dv[size_t(l)].data() + size_t(r) * ldv;
                float* ok = dk + size_t(r) * a.k_stride;
                float* ov = dv + size_t(r) * a.v_stride;
                for (size_t c = 0; c < ldk; ++c) ok[c] += pk[c];
                for (size_t c = 0; c < ldv; ++c) ov[c] += pv[c];
            }
    }
}

}  // namespace quintet::cpu
