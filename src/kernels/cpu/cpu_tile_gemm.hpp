// Register-blocked GEMM for the attention tiles (private to the CPU backend).
//
// The attention kernels multiply 64 x 64 x head_dim blocks, five per (query tile, key tile) pair
// in the backward. A BLAS call that size spends much of its time on dispatch and on packing
// both operands again every call: OpenBLAS and BLIS run these at about half the rate of a
// large sgemm on one core (docs/benchmarks.md). Here the caller packs each operand once, when
// it is used against many others (a query tile's Q against every key tile), into panels: A in
// slices of 6 rows, B in slices of 16 columns, zero-padded, either read through any strides so
// a transposed operand costs the same (with AVX2, a transposing pack moves 8 x 8 blocks
// through registers rather than a float at a time). An A that already sits compactly in cache
// (the score tile, row stride 64) is read in place. C is swept in blocks of 6 x 16: 12 AVX2 accumulators,
// the two B vectors and one broadcast A element fill the 16 registers.
//
// The AVX2+FMA kernel is compiled with a target attribute and chosen at run time, so a portable
// build (QUINTET_NATIVE=OFF) gets it too on a host that has the instructions; elsewhere a plain
// C++ kernel reads the same panels. Sums run over p in order, one accumulator per element of C:
// a pure function of the operands, whatever the thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstddef>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QUINTET_TILE_GEMM_X86 1
#endif

namespace quintet::cpu {

constexpr int kTileMR = 6, kTileNR = 16;  // rows x columns of C per register block

// Per 6-row block of C, what of the product it needs (null: everything). Causal attention's
// diagonal tiles are a triangle: a block of query rows sees only the keys up to its last row
// (n_end: column panels at or past it are not computed, C keeps what it held), and a block of
// key rows only the queries from its first (p_begin), or the sum over keys stops at the block's
// last visible one (p_end). The terms left out of a sum are exact zeros, so the bits are those
// of the whole product.
struct TileLimits {
    const int* n_end = nullptr;
    const int* p_begin = nullptr;
    const int* p_end = nullptr;
};

// Panel sizes in floats: A as ceil(m/6) panels of [k][6], B as ceil(n/16) panels of [k][16].
inline size_t tile_packed_a_size(int m, int k) { return size_t((m + kTileMR - 1) / kTileMR) * kTileMR * k; }
inline size_t tile_packed_b_size(int k, int n) { return size_t((n + kTileNR - 1) / kTileNR) * kTileNR * k; }

namespace tile_detail {

// The packs as plain loops (any strides, any edge).
inline void pack_a_generic(float* dst, int m, int k, const float* a, long ars, long acs) {
    for (int i0 = 0; i0 < m; i0 += kTileMR, dst += kTileMR * k)
        for (int r = 0; r < kTileMR; ++r) {
            if (i0 + r >= m) {
                for (int p = 0; p < k; ++p) dst[p * kTileMR + r] = 0.0f;
                continue;
            }
            const float* src = a + (i0 + r) * ars;
            for (int p = 0; p < k; ++p) dst[p * kTileMR + r] = src[p * acs];
        }
}

inline void pack_b_generic(float* dst, int k, int n, const float* b, long brs, long bcs) {
    for (int j0 = 0; j0 < n; j0 += kTileNR, dst += kTileNR * k) {
        const int nj = std::min(kTileNR, n - j0);
        if (bcs == 1) {
            for (int p = 0; p < k; ++p) {
                const float* src = b + p * brs + j0;
                int j = 0;
                for (; j < nj; ++j) dst[p * kTileNR + j] = src[j];
                for (; j < kTileNR; ++j) dst[p * kTileNR + j] = 0.0f;
            }
        } else {  // B^T stored: column j of B is a row of storage, read along it
            for (int j = 0; j < kTileNR; ++j) {
                if (j >= nj) {
                    for (int p = 0; p < k; ++p) dst[p * kTileNR + j] = 0.0f;
                    continue;
                }
                const float* src = b + (j0 + j) * bcs;
                for (int p = 0; p < k; ++p) dst[p * kTileNR + j] = src[p * brs];
            }
        }
    }
}

// One register block: C[mi x nj] (mi <= 6, nj <= 16) = alpha * A B + beta * C, A's rows at
// a + r * ars stepping acs along p, B a packed panel. beta 0 never reads C. Rows past mi are
// read as row mi - 1 (and dropped), so A may end at its last row.
inline void micro_generic(int k, const float* a, long ars, long acs, const float* bp, float alpha,
                          float beta, float* c, long ldc, int mi, int nj) {
    float acc[kTileMR][kTileNR] = {};
    for (int p = 0; p < k; ++p)
        for (int r = 0; r < mi; ++r) {
            const float x = a[r * ars + p * acs];
            for (int j = 0; j < kTileNR; ++j) acc[r][j] += x * bp[p * kTileNR + j];
        }
    for (int r = 0; r < mi; ++r)
        for (int j = 0; j < nj; ++j)
            c[r * ldc + j] = alpha * acc[r][j] + (beta != 0.0f ? beta * c[r * ldc + j] : 0.0f);
}

#if QUINTET_TILE_GEMM_X86
#define QUINTET_AVX2 __attribute__((target("avx2,fma")))

QUINTET_AVX2 inline __m256i first_lanes(int n) {  // the first n (0..8) lanes
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

QUINTET_AVX2 inline void micro_avx2(int k, const float* a, long ars, long acs, const float* bp,
                                    float alpha, float beta, float* c, long ldc, int mi, int nj) {
    const long o1 = std::min(1, mi - 1) * ars, o2 = std::min(2, mi - 1) * ars,
               o3 = std::min(3, mi - 1) * ars, o4 = std::min(4, mi - 1) * ars,
               o5 = std::min(5, mi - 1) * ars;
    __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0, hi2 = lo0,
           lo3 = lo0, hi3 = lo0, lo4 = lo0, hi4 = lo0, lo5 = lo0, hi5 = lo0;
    // Unrolled: the loop's own instructions and a strided A's address arithmetic (P^T and dS^T
    // are read down columns) otherwise cost ~20% of the FMA rate (64^3 products, one core).
#pragma GCC unroll 4
    for (int p = 0; p < k; ++p, a += acs, bp += kTileNR) {
        const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
        __m256 x = _mm256_broadcast_ss(a);
        lo0 = _mm256_fmadd_ps(x, b0, lo0), hi0 = _mm256_fmadd_ps(x, b1, hi0);
        x = _mm256_broadcast_ss(a + o1);
        lo1 = _mm256_fmadd_ps(x, b0, lo1), hi1 = _mm256_fmadd_ps(x, b1, hi1);
        x = _mm256_broadcast_ss(a + o2);
        lo2 = _mm256_fmadd_ps(x, b0, lo2), hi2 = _mm256_fmadd_ps(x, b1, hi2);
        x = _mm256_broadcast_ss(a + o3);
        lo3 = _mm256_fmadd_ps(x, b0, lo3), hi3 = _mm256_fmadd_ps(x, b1, hi3);
        x = _mm256_broadcast_ss(a + o4);
        lo4 = _mm256_fmadd_ps(x, b0, lo4), hi4 = _mm256_fmadd_ps(x, b1, hi4);
        x = _mm256_broadcast_ss(a + o5);
        lo5 = _mm256_fmadd_ps(x, b0, lo5), hi5 = _mm256_fmadd_ps(x, b1, hi5);
    }
    const __m256 lo[kTileMR] = {lo0, lo1, lo2, lo3, lo4, lo5};
    const __m256 hi[kTileMR] = {hi0, hi1, hi2, hi3, hi4, hi5};
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    const __m256i m0 = first_lanes(std::min(nj, 8)), m1 = first_lanes(std::max(nj - 8, 0));
    for (int r = 0; r < mi; ++r) {
        float* cr = c + r * ldc;
        __m256 x0 = _mm256_mul_ps(va, lo[r]), x1 = _mm256_mul_ps(va, hi[r]);
        if (nj == kTileNR) {
            if (beta != 0.0f) {
                x0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), x0);
                x1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), x1);
            }
            _mm256_storeu_ps(cr, x0);
            _mm256_storeu_ps(cr + 8, x1);
        } else {
            if (beta != 0.0f) {
                x0 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(cr, m0), x0);
                x1 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(cr + 8, m1), x1);
            }
            _mm256_maskstore_ps(cr, m0, x0);
            _mm256_maskstore_ps(cr + 8, m1, x1);
        }
    }
}

// 8 x 8 transpose in registers: r[i] lane j <- r[j] lane i.
QUINTET_AVX2 inline void transpose8(__m256 r[8]) {
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    __m256 u[8];
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

// The transposing packs, 8 x 8 blocks at a time. The plain loops gather one float per load
// and scatter one per store; these were a sixth of the attention kernels' time (perf).
// A with acs 1 (rows contiguous along p): a whole 6-row panel, p in blocks of 8.
QUINTET_AVX2 inline void pack_a_rows_avx2(float* dst, int k, const float* a, long ars) {
    int p = 0;
    for (; p + 8 <= k; p += 8) {
        __m256 r[8];
        for (int i = 0; i < kTileMR; ++i) r[i] = _mm256_loadu_ps(a + i * ars + p);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8(r);  // r[c] = column p + c: its 6 rows, then 2 zeros
        for (int c = 0; c < 8; ++c) {
            float* d = dst + (p + c) * kTileMR;
            _mm_storeu_ps(d, _mm256_castps256_ps128(r[c]));
            _mm_storel_pi(reinterpret_cast<__m64*>(d + 4), _mm256_extractf128_ps(r[c], 1));
        }
    }
    for (long q = p; q < k; ++q)
        for (int i = 0; i < kTileMR; ++i) dst[q * kTileMR + i] = a[i * ars + q];
}

// B^T stored with brs 1 (column j of B contiguous along p): a whole 16-column panel.
QUINTET_AVX2 inline void pack_b_cols_avx2(float* dst, int k, const float* b, long bcs) {
    int p = 0;
    for (; p + 8 <= k; p += 8)
        for (int j8 = 0; j8 < kTileNR; j8 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(b + (j8 + j) * bcs + p);
            transpose8(r);  // r[c] = row p + c of B, columns j8..j8 + 7
            for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + (p + c) * kTileNR + j8, r[c]);
        }
    for (long q = p; q < k; ++q)
        for (int j = 0; j < kTileNR; ++j) dst[q * kTileNR + j] = b[j * bcs + q];
}

// B as stored with bcs 1 (rows contiguous along j): a whole 16-column panel, a row a step.
QUINTET_AVX2 inline void pack_b_rows_avx2(float* dst, int k, const float* b, long brs) {
    for (int p = 0; p < k; ++p, b += brs, dst += kTileNR) {
        _mm256_storeu_ps(dst, _mm256_loadu_ps(b));
        _mm256_storeu_ps(dst + 8, _mm256_loadu_ps(b + 8));
    }
}
#undef QUINTET_AVX2

inline bool have_avx2_fma() {
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
}
#else
inline bool have_avx2_fma() { return false; }
inline void micro_avx2(int, const float*, long, long, const float*, float, float, float*, long, int, int) {}
inline void pack_a_rows_avx2(float*, int, const float*, long) {}
inline void pack_b_cols_avx2(float*, int, const float*, long) {}
inline void pack_b_rows_avx2(float*, int, const float*, long) {}
#endif

// Whether the AVX2 kernel runs: the host's answer, settable so a test can run the plain one.
inline bool& use_avx2() {
    static bool on = have_avx2_fma();
    return on;
}

// A given per row block: block ib's rows start at a + ib * a_block, stepping ars / acs.
inline void sweep(int m, int n, int k, float alpha, const float* a, long a_block, long ars,
                  long acs, const float* pb, long pb_stride, float beta, float* c, long ldc,
                  const TileLimits& lim) {
    const bool avx2 = use_avx2();
    // Column panels outer: a B panel (k x 16, 4 KiB at k = 64) stays in L1 across the rows.
    for (int j0 = 0, jb = 0; j0 < n; j0 += kTileNR, ++jb) {
        const int nj = std::min(kTileNR, n - j0);
        const float* bp = pb + size_t(jb) * size_t(pb_stride);
        for (int i0 = 0, ib = 0; i0 < m; i0 += kTileMR, ++ib) {
            if (lim.n_end && j0 >= lim.n_end[ib]) continue;  // C's panel left as it was
            const int p0 = lim.p_begin ? std::min(k, lim.p_begin[ib]) : 0;
            const int p1 = lim.p_end ? std::max(p0, std::min(k, lim.p_end[ib])) : k;
            const int mi = std::min(kTileMR, m - i0);
            const float* ab = a + ib * a_block + p0 * acs;
            float* cb = c + i0 * ldc + j0;
            if (avx2) micro_avx2(p1 - p0, ab, ars, acs, bp + p0 * kTileNR, alpha, beta, cb, ldc, mi, nj);
            else micro_generic(p1 - p0, ab, ars, acs, bp + p0 * kTileNR, alpha, beta, cb, ldc, mi, nj);
        }
    }
}

}  // namespace tile_detail

// A(i, p) = a[i * ars + p * acs] into panels, zero-padded to whole panels. The same bits
// whichever kernel runs (a pack only moves floats).
inline void tile_pack_a(float* dst, int m, int k, const float* a, long ars, long acs) {
    if (!tile_detail::use_avx2() || acs != 1)
        return tile_detail::pack_a_generic(dst, m, k, a, ars, acs);
    const int full = m / kTileMR * kTileMR;
    for (int i0 = 0; i0 < full; i0 += kTileMR, dst += kTileMR * k)
        tile_detail::pack_a_rows_avx2(dst, k, a + i0 * ars, ars);
    if (full < m) tile_detail::pack_a_generic(dst, m - full, k, a + full * ars, ars, acs);
}

// B(p, j) = b[p * brs + j * bcs] into panels, zero-padded to whole panels.
inline void tile_pack_b(float* dst, int k, int n, const float* b, long brs, long bcs) {
    if (!tile_detail::use_avx2() || (brs != 1 && bcs != 1))
        return tile_detail::pack_b_generic(dst, k, n, b, brs, bcs);
    const int full = n / kTileNR * kTileNR;
    for (int j0 = 0; j0 < full; j0 += kTileNR, dst += kTileNR * k) {
        if (bcs == 1) tile_detail::pack_b_rows_avx2(dst, k, b + j0, brs);
        else tile_detail::pack_b_cols_avx2(dst, k, b + j0 * bcs, bcs);
    }
    if (full < n) tile_detail::pack_b_generic(dst, k, n - full, b + full * bcs, brs, bcs);
}

// C[m x n] = alpha * A B + beta * C (row stride ldc; beta 0 never reads C), B packed by
// tile_pack_b with kb >= k rows (its panels kTileNR * kb floats apart; the first k rows are
// used), A(i, p) = a[i * ars + p * acs]: for an A that sits compactly in cache (the
// attention's score tiles, row stride 64), read in place.
inline void tile_gemm_packed_b(int m, int n, int k, float alpha, const float* a, long ars, long acs,
                               const float* pb, int kb, float beta, float* c, long ldc,
                               const TileLimits& lim = {}) {
    if (m > 0 && n > 0)
        tile_detail::sweep(m, n, k, alpha, a, kTileMR * ars, ars, acs, pb, long(kTileNR) * kb, beta,
                           c, ldc, lim);
}

// The same with A packed by tile_pack_a too (with k columns: an A spread over memory at a
// large row stride, packed once and used against many B).
inline void tile_gemm_packed(int m, int n, int k, float alpha, const float* pa, const float* pb,
                             int kb, float beta, float* c, long ldc, const TileLimits& lim = {}) {
    if (m > 0 && n > 0)
        tile_detail::sweep(m, n, k, alpha, pa, long(kTileMR) * k, 1, kTileMR, pb, long(kTileNR) * kb,
                           beta, c, ldc, lim);
}

}  // namespace quintet::cpu
