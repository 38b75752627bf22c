#include "cpu_gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "cpu_tile_gemm.hpp"
#include "quintet/core/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QUINTET_GEMM_X86 1
#endif

namespace quintet::cpu {

#if QUINTET_GEMM_X86
namespace {

#define QUINTET_AVX512 __attribute__((target("avx512f,avx2,fma")))

// A thread's packing scratch, grown to the largest call and kept.
struct Scratch {
    float* a = nullptr;
    size_t a_n = 0;
    float* b = nullptr;
    size_t b_n = 0;
    ~Scratch() {
        std::free(a);
        std::free(b);
    }
    static float* grow(float*& p, size_t& have, size_t want) {
        if (want > have) {
            std::free(p);
            p = static_cast<float*>(std::aligned_alloc(64, (want * sizeof(float) + 63) / 64 * 64));
            if (!p) rank_fail("out of host memory for the GEMM's packing scratch (" +
                              std::to_string(want * sizeof(float)) + " bytes)");
            have = want;
        }
        return p;
    }
};

Scratch& thread_scratch() {
    static thread_local Scratch s;
    return s;
}

using tile_detail::transpose8;  // the attention tiles' 8 x 8 register transpose (AVX2)

inline __mmask16 first_lanes(int n) {  // the first n (0..16) lanes
    return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max(n, 0)) - 1);
}

// The plain gather both packs fall back to: dst[p][w] = src[w * stride + p] for w < valid, 0 past
// it, p in [p_from, kc); a panel `width` wide.
inline void pack_gather(float* dst, int width, int valid, int p_from, int kc, const float* src, long stride) {
    for (int p = p_from; p < kc; ++p)
        for (int w = 0; w < width; ++w) dst[p * width + w] = w < valid ? src[w * stride + p] : 0.0f;
}

#define QUINTET_AVX2 __attribute__((target("avx2,fma")))

// Both kernels' pack of a B panel stored transposed (column j of op(B) is row j of storage,
// contiguous along p), `valid` of its NR columns present: 8 x 8 blocks through registers.
template <int NR>
QUINTET_AVX2 void pack_b_columns(float* dst, const float* src, long ldb, int kc, int valid) {
    if (valid < NR) return pack_gather(dst, NR, valid, 0, kc, src, ldb);
    int p = 0;
    for (; p + 8 <= kc; p += 8)
        for (int j8 = 0; j8 < NR; j8 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src + (j8 + j) * ldb + p);
            transpose8(r);
            for (int c = 0; c < 8; ++c) _mm256_store_ps(dst + (p + c) * NR + j8, r[c]);
        }
    pack_gather(dst, NR, NR, p, kc, src, ldb);
}

// The AVX-512 kernel: 12 x 32 register blocks (24 zmm accumulators).
struct Avx512 {
    static constexpr int kMR = 12;   // rows of C per register block (broadcast A elements)
    static constexpr int kNR = 32;   // columns of C per register block (two zmm of B)
    static constexpr int kKC = 256;  // K block: an A micro-panel is 12 KiB, a B micro-panel 32 KiB
    static constexpr int kNC = 512;  // N block: a packed B block is kKC x kNC floats, 512 KiB (L2)

    // op(A)(i, p) = ta ? A[p * lda + i] : A[i * lda + p]. Rows [i0, i0 + mi), columns [p0, p0 + kc)
    // into micro-panels of kMR rows, each [kc][kMR], rows past mi zero.
    QUINTET_AVX512 static void pack_a(float* dst, const float* A, long lda, bool ta, int i0, int mi, int p0,
                               int kc) {
        for (int ib = 0; ib < mi; ib += kMR, dst += kMR * kc) {
            const int m = std::min(kMR, mi - ib);
            if (ta) {  // row p of the panel is contiguous in A
                const float* src = A + long(p0) * lda + i0 + ib;
                const __mmask16 mask = first_lanes(m);
                for (int p = 0; p < kc; ++p)
                    _mm512_mask_storeu_ps(dst + p * kMR, 0x0FFF,
                                          _mm512_maskz_loadu_ps(mask, src + p * lda));
                continue;
            }
            const float* src = A + long(i0 + ib) * lda + p0;
            if (m < kMR) {
                pack_gather(dst, kMR, m, 0, kc, src, lda);
                continue;
            }
            // Rows contiguous along p: transpose 8 x 8 blocks (rows 0..7, then 8..11 and 4 zeros).
            int p = 0;
            for (; p + 8 <= kc; p += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lda + p);
                transpose8(r);
                for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + (p + c) * kMR, r[c]);
                for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu_ps(src + (8 + i) * lda + p);
                for (int i = 4; i < 8; ++i) r[i] = _mm256_setzero_ps();
                transpose8(r);
                for (int c = 0; c < 8; ++c) _mm_storeu_ps(dst + (p + c) * kMR + 8, _mm256_castps256_ps128(r[c]));
            }
            pack_gather(dst, kMR, kMR, p, kc, src, lda);
        }
    }

    // op(B)(p, j) = tb ? B[j * ldb + p] : B[p * ldb + j]. Rows [p0, p0 + kc), columns [j0, j0 + nj)
    // into micro-panels of kNR columns, each [kc][kNR], columns past nj zero.
    QUINTET_AVX512 static void pack_b(float* dst, const float* B, long ldb, bool tb, int p0, int kc, int j0,
                               int nj) {
        for (int jb = 0; jb < nj; jb += kNR, dst += kNR * kc) {
            const int n = std::min(kNR, nj - jb);
            if (!tb) {  // row p of the panel is contiguous in B
                const float* src = B + long(p0) * ldb + j0 + jb;
                const __mmask16 m0 = first_lanes(n), m1 = first_lanes(n - 16);
                for (int p = 0; p < kc; ++p) {
                    _mm512_store_ps(dst + p * kNR, _mm512_maskz_loadu_ps(m0, src + p * ldb));
                    _mm512_store_ps(dst + p * kNR + 16, _mm512_maskz_loadu_ps(m1, src + p * ldb + 16));
                }
                continue;
            }
            pack_b_columns<kNR>(dst, B + long(j0 + jb) * ldb + p0, ldb, kc, n);
        }
    }

    // One register block: C[mi x nj] (mi <= 12, nj <= 32) = alpha * sum_p a_p b_p^T + beta * C
    // (first == true: beta 0 never reads C), or += alpha * sum (first == false, later K blocks).
    QUINTET_AVX512 static void micro_kernel(int kc, const float* __restrict ap, const float* __restrict bp,
                                     float* c, long ldc, float alpha, float beta, bool first, int mi,
                                     int nj) {
        // C's rows are 2 KiB or more apart and not in L1: ask for them now, used after the loop.
        for (int r = 0; r < mi; ++r) {
            _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
        }
        __m512 lo[kMR], hi[kMR];
    #pragma GCC unroll 12
        for (int r = 0; r < kMR; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
    #pragma GCC unroll 2
        for (int p = 0; p < kc; ++p, ap += kMR, bp += kNR) {
            const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
    #pragma GCC unroll 12
            for (int r = 0; r < kMR; ++r) {
                const __m512 x = _mm512_set1_ps(ap[r]);
                lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
                hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
            }
        }
        const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(first ? beta : 1.0f);
        const bool read_c = !first || beta != 0.0f, scale = alpha != 1.0f;
        const __mmask16 m0 = first_lanes(nj), m1 = first_lanes(nj - 16);
    #pragma GCC unroll 12
        for (int r = 0; r < kMR; ++r) {
            if (r >= mi) break;
            float* cr = c + r * ldc;
            __m512 x0 = scale ? _mm512_mul_ps(va, lo[r]) : lo[r];
            __m512 x1 = scale ? _mm512_mul_ps(va, hi[r]) : hi[r];
            if (nj == kNR) {
                if (read_c) {
                    x0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr), x0);
                    x1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr + 16), x1);
                }
                _mm512_storeu_ps(cr, x0);
                _mm512_storeu_ps(cr + 16, x1);
            } else {
                if (read_c) {
                    x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), x0);
                    x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), x1);
                }
                _mm512_mask_storeu_ps(cr, m0, x0);
                _mm512_mask_storeu_ps(cr + 16, m1, x1);
            }
        }
    }
};

// The AVX2 kernel: 6 x 16 register blocks (12 ymm accumulators, two B vectors and one broadcast
// fill the 16 registers), for hosts without AVX-512F.
struct Avx2 {
    static constexpr int kMR = 6;    // rows of C per register block
    static constexpr int kNR = 16;   // columns of C per register block (two ymm of B)
    static constexpr int kKC = 256;  // K block: an A micro-panel is 6 KiB, a B micro-panel 16 KiB
    static constexpr int kNC = 256;  // N block: a packed B block is 256 KiB (half of a 512 KiB L2)

    QUINTET_AVX2 static __m256i lane_mask(int n) {  // lanes [0, n) set
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    // Stores lanes 0..5 of v (a 6-float row of a panel) without touching the two floats after it.
    QUINTET_AVX2 static void store6(float* dst, __m256 v) {
        _mm_storeu_ps(dst, _mm256_castps256_ps128(v));
        _mm_storel_pi(reinterpret_cast<__m64*>(dst + 4), _mm256_extractf128_ps(v, 1));
    }

    QUINTET_AVX2 static void pack_a(float* dst, const float* A, long lda, bool ta, int i0, int mi, int p0,
                                    int kc) {
        for (int ib = 0; ib < mi; ib += kMR, dst += kMR * kc) {
            const int m = std::min(kMR, mi - ib);
            if (ta) {  // row p of the panel is contiguous in A
                const float* src = A + long(p0) * lda + i0 + ib;
                if (m == kMR) {
                    for (int p = 0; p < kc; ++p) {
                        const float* s = src + p * lda;
                        _mm_storeu_ps(dst + p * kMR, _mm_loadu_ps(s));
                        _mm_storel_pi(reinterpret_cast<__m64*>(dst + p * kMR + 4),
                                      _mm_loadl_pi(_mm_setzero_ps(), reinterpret_cast<const __m64*>(s + 4)));
                    }
                } else {
                    for (int p = 0; p < kc; ++p)
                        for (int w = 0; w < kMR; ++w) dst[p * kMR + w] = w < m ? src[p * lda + w] : 0.0f;
                }
                continue;
            }
            const float* src = A + long(i0 + ib) * lda + p0;
            if (m < kMR) {
                pack_gather(dst, kMR, m, 0, kc, src, lda);
                continue;
            }
            int p = 0;  // rows contiguous along p: transpose 8 x 8 blocks (6 rows and 2 zeros)
            for (; p + 8 <= kc; p += 8) {
                __m256 r[8];
                for (int i = 0; i < 6; ++i) r[i] = _mm256_loadu_ps(src + i * lda + p);
                r[6] = r[7] = _mm256_setzero_ps();
                transpose8(r);
                for (int c = 0; c < 8; ++c) store6(dst + (p + c) * kMR, r[c]);
            }
            pack_gather(dst, kMR, kMR, p, kc, src, lda);
        }
    }

    QUINTET_AVX2 static void pack_b(float* dst, const float* B, long ldb, bool tb, int p0, int kc, int j0,
                                    int nj) {
        for (int jb = 0; jb < nj; jb += kNR, dst += kNR * kc) {
            const int n = std::min(kNR, nj - jb);
            if (!tb) {  // row p of the panel is contiguous in B
                const float* src = B + long(p0) * ldb + j0 + jb;
                if (n == kNR) {
                    for (int p = 0; p < kc; ++p) {
                        _mm256_store_ps(dst + p * kNR, _mm256_loadu_ps(src + p * ldb));
                        _mm256_store_ps(dst + p * kNR + 8, _mm256_loadu_ps(src + p * ldb + 8));
                    }
                } else {  // masked lanes are neither read nor faulted on
                    const __m256i m0 = lane_mask(n), m1 = lane_mask(n - 8);
                    for (int p = 0; p < kc; ++p) {
                        _mm256_store_ps(dst + p * kNR, _mm256_maskload_ps(src + p * ldb, m0));
                        _mm256_store_ps(dst + p * kNR + 8, _mm256_maskload_ps(src + p * ldb + 8, m1));
                    }
                }
                continue;
            }
            pack_b_columns<kNR>(dst, B + long(j0 + jb) * ldb + p0, ldb, kc, n);
        }
    }

    QUINTET_AVX2 static void micro_kernel(int kc, const float* __restrict ap, const float* __restrict bp,
                                          float* c, long ldc, float alpha, float beta, bool first, int mi,
                                          int nj) {
        for (int r = 0; r < mi; ++r) {  // C's rows, used after the loop (a row may span two lines)
            _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 15), _MM_HINT_T0);
        }
        __m256 lo[kMR], hi[kMR];
    #pragma GCC unroll 6
        for (int r = 0; r < kMR; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    #pragma GCC unroll 4
        for (int p = 0; p < kc; ++p, ap += kMR, bp += kNR) {
            const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
    #pragma GCC unroll 6
            for (int r = 0; r < kMR; ++r) {
                const __m256 x = _mm256_broadcast_ss(ap + r);
                lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
                hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
            }
        }
        const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(first ? beta : 1.0f);
        const bool read_c = !first || beta != 0.0f, scale = alpha != 1.0f;
        const __m256i m0 = lane_mask(nj), m1 = lane_mask(nj - 8);
    #pragma GCC unroll 6
        for (int r = 0; r < kMR; ++r) {
            if (r >= mi) break;
            float* cr = c + r * ldc;
            __m256 x0 = scale ? _mm256_mul_ps(va, lo[r]) : lo[r];
            __m256 x1 = scale ? _mm256_mul_ps(va, hi[r]) : hi[r];
            if (nj == kNR) {
                if (read_c) {
                    x0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), x0);
                    x1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), x1);
                }
                _mm256_storeu_ps(cr, x0);
                _mm256_storeu_ps(cr + 8, x1);
            } else {
                if (read_c) {
                    x0 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(cr, m0), x0);
                    x1 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(cr + 8, m1), x1);
                }
                _mm256_maskstore_ps(cr, m0, x0);
                _mm256_maskstore_ps(cr + 8, m1, x1);
            }
        }
    }
};

// The two kernels give the same bits only because they cut K at the same places: each
// element's sum runs in order within a K block and is added to C block after block.
static_assert(Avx2::kKC == Avx512::kKC, "the kernels' K blocks must agree (same bits on either ISA)");

// One thread's rectangle of C: rows [m0, m1), columns [n0, n1).
template <class Isa>
void gemm_rect(bool ta, bool tb, int K, float alpha, const float* A, long lda, const float* B,
               long ldb, float beta, float* C, long ldc, int m0, int m1, int n0, int n1) {
    Scratch& w = thread_scratch();
    const int mt = m1 - m0;
    const size_t a_panels = size_t(mt + Isa::kMR - 1) / Isa::kMR;
    for (int pc = 0; pc < K; pc += Isa::kKC) {
        const int kc = std::min(Isa::kKC, K - pc);
        const bool first = pc == 0;
        float* pa = Scratch::grow(w.a, w.a_n, a_panels * Isa::kMR * Isa::kKC);
        Isa::pack_a(pa, A, lda, ta, m0, mt, pc, kc);
        float* pb = Scratch::grow(w.b, w.b_n, size_t(Isa::kNC) * Isa::kKC);
        for (int jc = n0; jc < n1; jc += Isa::kNC) {
            const int nc = std::min(Isa::kNC, n1 - jc);
            Isa::pack_b(pb, B, ldb, tb, pc, kc, jc, nc);
            for (int ib = 0; ib < mt; ib += Isa::kMR) {
                const float* ap = pa + size_t(ib / Isa::kMR) * Isa::kMR * kc;
                for (int jb = 0; jb < nc; jb += Isa::kNR)
                    Isa::micro_kernel(kc, ap, pb + size_t(jb / Isa::kNR) * Isa::kNR * kc,
                                 C + long(m0 + ib) * ldc + jc + jb, ldc, alpha, beta, first,
                                 std::min(Isa::kMR, mt - ib), std::min(Isa::kNR, nc - jb));
            }
        }
    }
}

// A few rows of C (M <= kFewRows): the products of a decoder step (one row: a matrix-vector
// product), of a batch of sequences decoded together, or of a speculative verification. Each
// element's sum is the tile kernels' to the bit -- in order within a K block of kKC, the block's
// sum scaled by alpha and added to C (beta's C at the first block), block after block -- without
// packing B or computing the padding rows of a register block, so a row's result does not depend
// on how many rows share the call. AVX2 with FMA (which every AVX-512 host has): one lane's fused
// multiply-add is the same operation in 8 lanes as in 16, and the rate is the memory's. Each
// element's sum is one chain of dependent FMAs: the R rows and G groups of 8 columns run side by
// side (R x G independent chains) to hide the FMA's latency; R, G and every loop bound inside
// are compile-time constants so that the whole step stays in registers (a run-time count kept
// the accumulators in memory: 17 GB/s against 30, one core's read rate, measured on Zen 5).
// Where B is stored [out, in] (tb), an 8 x 8 block of it goes through registers once for all R
// rows (up to 8 rows: 8 accumulators and the 8 transposed vectors, in the 32 vector registers
// of an AVX-512 host); more rows than kFewRows are done kFewRows at a time, each pass reading B
// again, while the blocked GEMM packs B once: sgemm takes this path up to few_rows_max() rows,
// 8 (measured, docs/benchmarks.md).
constexpr int kFewRows = 8;
// QUINTET_FEW_ROWS (for measuring) overrides the largest M that takes this path.
int few_rows_max() {
    static const int m = [] {
        const char* env = std::getenv("QUINTET_FEW_ROWS");
        return env ? std::max(0, std::atoi(env)) : kFewRows;
    }();
    return m;
}

// acc[r][g] += the K block's sum for row r, columns [8g, 8g + 8) of op(B) from `b` (row pc of
// op(B), column j), all 8G columns present; xp[r * ldx + p] is row r's p-th element.
template <int R, int G>
QUINTET_AVX2 inline void few_rows_block(bool tb, int kc, const float* xp, long ldx, const float* b, long ldb,
                                        __m256 (*acc)[G]) {
    if (!tb) {  // row p of op(B) is contiguous
        for (int p = 0; p < kc; ++p, b += ldb) {
            __m256 bv[G];
            for (int g = 0; g < G; ++g) bv[g] = _mm256_loadu_ps(b + 8 * g);
            for (int r = 0; r < R; ++r) {
                const __m256 xv = _mm256_set1_ps(xp[r * ldx + p]);
                for (int g = 0; g < G; ++g) acc[r][g] = _mm256_fmadd_ps(xv, bv[g], acc[r][g]);
            }
        }
        return;
    }
    // Column j of op(B) is row j of storage: 8 x 8 blocks through registers. The 8G rows are
    // 8G short streams (a K block is 1 KiB of each) that the hardware prefetcher barely ramps
    // up on, so the same place of the next 8G rows is asked for while these are summed (a
    // prefetch past the matrix's end is a hint, never a fault).
    int p = 0;
    for (; p + 8 <= kc; p += 8)
        for (int g = 0; g < G; ++g) {
            __m256 t[8];
            for (int l = 0; l < 8; ++l)
                _mm_prefetch(reinterpret_cast<const char*>(b + (8 * G + 8 * g + l) * ldb + p), _MM_HINT_T0);
            for (int l = 0; l < 8; ++l) t[l] = _mm256_loadu_ps(b + (8 * g + l) * ldb + p);
            transpose8(t);  // t[q] lane l = op(B)(p + q, 8g + l)
            for (int q = 0; q < 8; ++q)
                for (int r = 0; r < R; ++r)
                    acc[r][g] = _mm256_fmadd_ps(_mm256_set1_ps(xp[r * ldx + p + q]), t[q], acc[r][g]);
        }
    for (; p < kc; ++p)
        for (int g = 0; g < G; ++g) {
            alignas(32) float t[8];
            for (int l = 0; l < 8; ++l) t[l] = b[(8 * g + l) * ldb + p];
            const __m256 tv = _mm256_load_ps(t);
            for (int r = 0; r < R; ++r) acc[r][g] = _mm256_fmadd_ps(_mm256_set1_ps(xp[r * ldx + p]), tv, acc[r][g]);
        }
}

// The block's sums into C: scaled by alpha, added to beta * C (the first block) or to C.
QUINTET_AVX2 inline void few_rows_store(float* c, __m256 acc, int nj, float alpha, float beta, bool first) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nj), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 y = alpha != 1.0f ? _mm256_mul_ps(_mm256_set1_ps(alpha), acc) : acc;
    if (!first || beta != 0.0f) {  // beta 0 never reads C (it may hold anything)
        const __m256 cv = nj == 8 ? _mm256_loadu_ps(c) : _mm256_maskload_ps(c, mask);
        y = _mm256_fmadd_ps(_mm256_set1_ps(first ? beta : 1.0f), cv, y);
    }
    if (nj == 8) _mm256_storeu_ps(c, y);
    else _mm256_maskstore_ps(c, mask, y);
}

// Rows [0, R) of C (row r of op(A) at x + r * ldx, of C at c + r * ldc), columns [n0, n1).
template <int R>
QUINTET_AVX2 void few_rows_cols(bool tb, int K, float alpha, const float* x, long ldx, const float* B, long ldb,
                                float beta, float* c, long ldc, int n0, int n1) {
    constexpr int kKC = Avx512::kKC;
    auto whole = [&](auto groups) {
        constexpr int G = decltype(groups)::value;
        for (; n0 + 8 * G <= n1; n0 += 8 * G)
            for (int pc = 0; pc < K; pc += kKC) {
                __m256 acc[R][G];
                for (int r = 0; r < R; ++r)
                    for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
                const float* b = tb ? B + long(n0) * ldb + pc : B + long(pc) * ldb + n0;
                few_rows_block<R, G>(tb, std::min(kKC, K - pc), x + pc, ldx, b, ldb, acc);
                for (int r = 0; r < R; ++r)
                    for (int g = 0; g < G; ++g)
                        few_rows_store(c + r * ldc + n0 + 8 * g, acc[r][g], 8, alpha, beta, pc == 0);
            }
    };
    // One row, stored [out, in] (tb): two groups keep up with the memory; row-major, each column
    // group is one FMA a row, so four. Several rows are chains of their own: fewer groups.
    if (tb) whole(std::integral_constant<int, R == 1 ? 2 : 1>{});
    else whole(std::integral_constant<int, R == 1 ? 4 : 2>{});
    whole(std::integral_constant<int, 1>{});
    // The last 1-7 columns: through an 8-column staging of op(B)'s rows, zeros past n1.
    if (n0 < n1) {
        const int nj = n1 - n0;
        alignas(32) float stage[8];
        for (int pc = 0; pc < K; pc += kKC) {
            const int kc = std::min(kKC, K - pc);
            __m256 acc[R];
            for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
            for (int p = 0; p < kc; ++p) {
                for (int l = 0; l < 8; ++l)
                    stage[l] = l < nj ? (tb ? B[long(n0 + l) * ldb + pc + p] : B[long(pc + p) * ldb + n0 + l]) : 0.0f;
                const __m256 sv = _mm256_load_ps(stage);
                for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * ldx + pc + p]), sv, acc[r]);
            }
            for (int r = 0; r < R; ++r) few_rows_store(c + r * ldc + n0, acc[r], nj, alpha, beta, pc == 0);
        }
    }
}

// Rows [0, m) of C, 1 <= m <= kFewRows, columns [n0, n1).
QUINTET_AVX2 void few_rows(int m, bool tb, int K, float alpha, const float* x, long ldx, const float* B, long ldb,
                           float beta, float* c, long ldc, int n0, int n1) {
    switch (m) {
        case 1: return few_rows_cols<1>(tb, K, alpha, x, ldx, B, ldb, beta, c, ldc, n0, n1);
        case 2: return few_rows_cols<2>(tb, K, alpha, x, ldx, B, ldb, beta, c, ldc, n0, n1);
        case 3: return few_rows_cols<3>(tb, K, alpha, x, ldx, B, ldb, beta, c, ldc, n0, n1);
        case 4: return few_rows_cols<4>(tb, K, alpha, x, ldx, B, ldb, beta, c, ldc, n0, n1);
        case 5: return few_rows_cols<5>(tb, K, alpha, x, ldx, B, ldb, beta, c, ldc, n0, n1);
        case 6: return few_rows_cols<6>(tb, K, alpha, x, ldx, B, ldb, beta, c, ldc, n0, n1);
        case 7: return few_rows_cols<7>(tb, K, alpha, x, ldx, B, ldb, beta, c, ldc, n0, n1);
        default: return few_rows_cols<8>(tb, K, alpha, x, ldx, B, ldb, beta, c, ldc, n0, n1);
    }
}
static_assert(kFewRows == 8, "few_rows instantiates 1 to 8 rows");

void sgemm_few_rows(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                    int ldb, float beta, float* C, int ldc, int threads) {
    const float* x = A;
    long ldx = lda;
    if (ta) {  // the rows are columns of A's storage: gathered once
        Scratch& w = thread_scratch();
        float* g = Scratch::grow(w.a, w.a_n, size_t(M) * K);
        for (int r = 0; r < M; ++r)
            for (int p = 0; p < K; ++p) g[size_t(r) * K + p] = A[long(p) * lda + r];
        x = g, ldx = K;
    }
    const int blocks = (N + 7) / 8;
    // A thread per 64 columns at least: below that the fork costs more than it saves.
    const int nt = omp_in_parallel() ? 1 : std::max(1, std::min(threads, blocks / 8));
    auto columns = [&](int c0, int c1) {
        for (int r0 = 0; r0 < M; r0 += kFewRows)
            few_rows(std::min(kFewRows, M - r0), tb, K, alpha, x + r0 * ldx, ldx, B, ldb, beta, C + long(r0) * ldc, ldc,
                     c0, c1);
    };
    if (nt == 1) return columns(0, N);
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        const int c0 = std::min(N, blocks * t / nt * 8), c1 = std::min(N, blocks * (t + 1) / nt * 8);
        if (c0 < c1) columns(c0, c1);
    }
}

// C = beta * C where K is 0 (no product to add).
void scale_c(int M, int N, float beta, float* C, long ldc) {
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}


// The rectangles' driver, for either kernel.
template <class Isa>
void sgemm_blocked(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc, int threads) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) return scale_c(M, N, beta, C, ldc);
    const int m_blocks = (M + Isa::kMR - 1) / Isa::kMR, n_blocks = (N + Isa::kNR - 1) / Isa::kNR;
    const int nt = omp_in_parallel() ? 1 : std::max(1, std::min(threads, m_blocks * n_blocks));
    if (nt == 1) return gemm_rect<Isa>(ta, tb, K, alpha, A, lda, B, ldb, beta, C, ldc, 0, M, 0, N);
    // A tm x tn grid of rectangles. Each thread packs its rows of A and its columns of B, so
    // the split that packs least twice wins: cost (M / tm + N / tn) * K.
    int tm = 1, tn = nt;
    double best = 1e300;
    for (int a = 1; a <= nt; ++a) {
        if (nt % a != 0 || a > m_blocks || nt / a > n_blocks) continue;
        const double cost = double(M) / a + double(N) / (nt / a);
        if (cost < best) best = cost, tm = a, tn = nt / a;
    }
    if (best == 1e300) tm = std::min(nt, m_blocks), tn = 1;  // too few blocks for a full grid
#pragma omp parallel num_threads(tm * tn)
    {
        const int t = omp_get_thread_num(), ti = t / tn, tj = t % tn;
        const int mb0 = m_blocks * ti / tm, mb1 = m_blocks * (ti + 1) / tm;
        const int nb0 = n_blocks * tj / tn, nb1 = n_blocks * (tj + 1) / tn;
        const int r0 = std::min(M, mb0 * Isa::kMR), r1 = std::min(M, mb1 * Isa::kMR);
        const int c0 = std::min(N, nb0 * Isa::kNR), c1 = std::min(N, nb1 * Isa::kNR);
        if (r0 < r1 && c0 < c1)
            gemm_rect<Isa>(ta, tb, K, alpha, A, lda, B, ldb, beta, C, ldc, r0, r1, c0, c1);
    }
}

}  // namespace

GemmKernel gemm_kernel() {
    static const GemmKernel kind = [] {
        const char* env = std::getenv("QUINTET_CPU_GEMM");
        const std::string want = env ? env : "auto";
        if (want != "auto" && want != "blas" && want != "avx512" && want != "avx2")
            rank_fail("QUINTET_CPU_GEMM='" + want + "' is not a choice: valid are auto (quintet's "
                      "AVX-512 kernel on a host with AVX-512F, else the BLAS), blas, avx512, avx2");
        const bool have512 = __builtin_cpu_supports("avx512f");
        const bool have2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        if (want == "blas") return GemmKernel::blas;
        if (!QUINTET_OWN_GEMM) {
            if (want != "auto")
                rank_fail("QUINTET_CPU_GEMM=" + want + " but this build has quintet's GEMM off "
                          "(-DQUINTET_OWN_GEMM=OFF): use auto or blas");
            return GemmKernel::blas;
        }
        if (want == "avx512" && !have512)
            rank_fail("QUINTET_CPU_GEMM=avx512 but this host has no AVX-512F: use auto, avx2 or blas");
        if (want == "avx2" && !have2)
            rank_fail("QUINTET_CPU_GEMM=avx2 but this host has no AVX2 and FMA: use auto or blas");
        if (want == "avx512" || (want == "auto" && have512)) return GemmKernel::avx512;
        // auto on an AVX2 host keeps the BLAS: the AVX2 kernel was measured only on an AVX-512
        // host running AVX2 code (docs/benchmarks.md), not yet on an AVX2 host.
        return want == "avx2" ? GemmKernel::avx2 : GemmKernel::blas;
    }();
    return kind;
}

void own_sgemm(GemmKernel kind, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
               int lda, const float* B, int ldb, float beta, float* C, int ldc, int threads) {
    if (M >= 1 && M <= few_rows_max() && N > 0 && K > 0 && (kind == GemmKernel::avx512 || kind == GemmKernel::avx2))
        return sgemm_few_rows(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads);
    if (kind == GemmKernel::avx512)
        return sgemm_blocked<Avx512>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads);
    if (kind == GemmKernel::avx2)
        return sgemm_blocked<Avx2>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads);
    rank_fail("own_sgemm called with the BLAS as its kernel");
}

#else  // not x86-64 with GCC or Clang: the BLAS does every matmul

GemmKernel gemm_kernel() { return GemmKernel::blas; }
void own_sgemm(GemmKernel, bool, bool, int, int, int, float, const float*, int, const float*, int,
               float, float*, int, int) {
    rank_fail("own_sgemm called on a build without quintet's GEMM");
}

#endif

}  // namespace quintet::cpu
