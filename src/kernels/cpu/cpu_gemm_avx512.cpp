#include "cpu_gemm_avx512.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

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

constexpr int kMR = 12;   // rows of C per register block (broadcast A elements)
constexpr int kNR = 32;   // columns of C per register block (two zmm of B)
constexpr int kKC = 256;  // K block: an A micro-panel is 12 KiB, a B micro-panel 32 KiB
constexpr int kNC = 512;  // N block: a packed B block is kKC x kNC floats, 512 KiB (L2)

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

// op(A)(i, p) = ta ? A[p * lda + i] : A[i * lda + p]. Rows [i0, i0 + mi), columns [p0, p0 + kc)
// into micro-panels of kMR rows, each [kc][kMR], rows past mi zero.
QUINTET_AVX512 void pack_a(float* dst, const float* A, long lda, bool ta, int i0, int mi, int p0,
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
QUINTET_AVX512 void pack_b(float* dst, const float* B, long ldb, bool tb, int p0, int kc, int j0,
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
        const float* src = B + long(j0 + jb) * ldb + p0;
        if (n < kNR) {
            pack_gather(dst, kNR, n, 0, kc, src, ldb);
            continue;
        }
        int p = 0;  // columns of op(B) contiguous along p: transpose 8 x 8 blocks
        for (; p + 8 <= kc; p += 8)
            for (int j8 = 0; j8 < kNR; j8 += 8) {
                __m256 r[8];
                for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src + (j8 + j) * ldb + p);
                transpose8(r);
                for (int c = 0; c < 8; ++c) _mm256_store_ps(dst + (p + c) * kNR + j8, r[c]);
            }
        pack_gather(dst, kNR, kNR, p, kc, src, ldb);
    }
}

// One register block: C[mi x nj] (mi <= 12, nj <= 32) = alpha * sum_p a_p b_p^T + beta * C
// (first == true: beta 0 never reads C), or += alpha * sum (first == false, later K blocks).
QUINTET_AVX512 void micro_kernel(int kc, const float* __restrict ap, const float* __restrict bp,
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

// One thread's rectangle of C: rows [m0, m1), columns [n0, n1).
void gemm_rect(bool ta, bool tb, int K, float alpha, const float* A, long lda, const float* B,
               long ldb, float beta, float* C, long ldc, int m0, int m1, int n0, int n1) {
    Scratch& w = thread_scratch();
    const int mt = m1 - m0;
    const size_t a_panels = size_t(mt + kMR - 1) / kMR;
    for (int pc = 0; pc < K; pc += kKC) {
        const int kc = std::min(kKC, K - pc);
        const bool first = pc == 0;
        float* pa = Scratch::grow(w.a, w.a_n, a_panels * kMR * kKC);
        pack_a(pa, A, lda, ta, m0, mt, pc, kc);
        float* pb = Scratch::grow(w.b, w.b_n, size_t(kNC) * kKC);
        for (int jc = n0; jc < n1; jc += kNC) {
            const int nc = std::min(kNC, n1 - jc);
            pack_b(pb, B, ldb, tb, pc, kc, jc, nc);
            for (int ib = 0; ib < mt; ib += kMR) {
                const float* ap = pa + size_t(ib / kMR) * kMR * kc;
                for (int jb = 0; jb < nc; jb += kNR)
                    micro_kernel(kc, ap, pb + size_t(jb / kNR) * kNR * kc,
                                 C + long(m0 + ib) * ldc + jc + jb, ldc, alpha, beta, first,
                                 std::min(kMR, mt - ib), std::min(kNR, nc - jb));
            }
        }
    }
}

// C = beta * C where K is 0 (no product to add).
void scale_c(int M, int N, float beta, float* C, long ldc) {
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

}  // namespace

bool avx512_gemm_enabled() {
    static const bool on = [] {
        const char* env = std::getenv("QUINTET_CPU_GEMM");
        const std::string want = env ? env : "auto";
        if (want != "auto" && want != "blas" && want != "avx512")
            rank_fail("QUINTET_CPU_GEMM='" + want + "' is not a choice: valid are auto (AVX-512 "
                      "kernel where the host has it, else the BLAS), blas, avx512");
        const bool have = QUINTET_AVX512_GEMM && __builtin_cpu_supports("avx512f");
        if (want == "avx512" && !have)
            rank_fail(QUINTET_AVX512_GEMM ? "QUINTET_CPU_GEMM=avx512 but this host has no AVX-512F: use auto or blas"
                                          : "QUINTET_CPU_GEMM=avx512 but this build has the kernel off "
                                            "(-DQUINTET_AVX512_GEMM=OFF): use auto or blas");
        return want != "blas" && have;
    }();
    return on;
}

void avx512_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc, int threads) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) return scale_c(M, N, beta, C, ldc);
    const int m_blocks = (M + kMR - 1) / kMR, n_blocks = (N + kNR - 1) / kNR;
    const int nt = omp_in_parallel() ? 1 : std::max(1, std::min(threads, m_blocks * n_blocks));
    if (nt == 1) return gemm_rect(ta, tb, K, alpha, A, lda, B, ldb, beta, C, ldc, 0, M, 0, N);
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
        const int r0 = std::min(M, mb0 * kMR), r1 = std::min(M, mb1 * kMR);
        const int c0 = std::min(N, nb0 * kNR), c1 = std::min(N, nb1 * kNR);
        if (r0 < r1 && c0 < c1)
            gemm_rect(ta, tb, K, alpha, A, lda, B, ldb, beta, C, ldc, r0, r1, c0, c1);
    }
}

#else  // not x86-64 with GCC or Clang: the BLAS does every matmul

bool avx512_gemm_enabled() { return false; }
void avx512_sgemm(bool, bool, int, int, int, float, const float*, int, const float*, int, float,
                  float*, int, int) {
    rank_fail("avx512_sgemm called on a build without the AVX-512 kernel");
}

#endif

}  // namespace quintet::cpu
