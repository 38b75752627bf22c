// Every CPU kernel's backward against central differences of its forward (attention and RoPE:
// tests/kernels/test_attention.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "quintet/core/bf16.hpp"
#include "quintet/kernels/backend.hpp"
#include "support/gradcheck.hpp"

using namespace quintet;
using quintet::testing::dot;
using quintet::testing::gradcheck;
using quintet::testing::randn;

namespace {

std::unique_ptr<Backend> be() { return make_cpu_backend(1); }

TEST(CpuKernels, RmsnormBackwardMatchesFiniteDifferences) {
    auto b = be();
    const int N = 5, C = 24;
    auto x = randn(N * C, 1), w = randn(C, 2), R = randn(N * C, 3);
    std::vector<float> out(N * C), rstd(N);
    auto f = [&] {
        b->rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
        return dot(out, R);
    };
    f();
    std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
    b->rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
    EXPECT_LT(gradcheck(x, dx, f).rel(), 1e-2);
    EXPECT_LT(gradcheck(w, dw, f).rel(), 1e-2);
    // dinp accumulates (residual stream): a second call doubles it.
    std::vector<float> dx2 = dx;
    b->rmsnorm_backward(dx2.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
    EXPECT_NEAR(dx2[7], 2 * dx[7], 1e-5);
    // The split backward: each part alone (the other pointer null) gives the same bits.
    std::vector<float> dx_only(N * C, 0.0f), dw_only(C, 0.0f), dw_once(C, 0.0f), dx_once(N * C, 0.0f);
    b->rmsnorm_backward(dx_once.data(), dw_once.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
    b->rmsnorm_backward(dx_only.data(), nullptr, R.data(), x.data(), w.data(), rstd.data(), N, C);
    b->rmsnorm_backward(nullptr, dw_only.data(), R.data(), x.data(), nullptr, rstd.data(), N, C);
    EXPECT_EQ(0, std::memcmp(dx_only.data(), dx_once.data(), dx_once.size() * 4));
    EXPECT_EQ(0, std::memcmp(dw_only.data(), dw_once.data(), dw_once.size() * 4));
}

TEST(CpuKernels, SwigluBackwardMatchesFiniteDifferences) {
    auto b = be();
    const int N = 4, F = 10;
    auto gu = randn(N * 2 * F, 4, 2.0f), R = randn(N * F, 5);
    std::vector<float> out(N * F), dgu(N * 2 * F);
    auto f = [&] {
        b->swiglu_forward(out.data(), gu.data(), N, F);
        return dot(out, R);
    };
    b->swiglu_backward(dgu.data(), R.data(), gu.data(), N, F);
    EXPECT_LT(gradcheck(gu, dgu, f, 1e-2f, 80).rel(), 1e-2);
}

TEST(CpuKernels, CrossEntropyGradientMatchesFiniteDifferences) {
    auto b = be();
    const int N = 6, V = 11;
    auto z = randn(N * V, 17, 2.0f);
    std::vector<int32_t> tgt = {0, 3, 10, 5, -1, 7};  // -1: ignored
    std::vector<float> losses(N);
    auto f = [&] {
        b->xent_forward(losses.data(), z.data(), tgt.data(), N, V);
        double s = 0;
        for (float x : losses) s += x;
        return s;
    };
    double l0 = f();
    std::vector<float> g = z, losses2(N);
    b->xent_forward_backward(g.data(), losses2.data(), tgt.data(), N, V, 1.0f);
    double l1 = 0;
    for (float x : losses2) l1 += x;
    EXPECT_NEAR(l0, l1, 1e-5);
    EXPECT_EQ(losses2[4], 0.0f);
    EXPECT_LT(gradcheck(z, g, f, 1e-2f, 66).rel(), 1e-2);
}

// The router and its backward: L = sum(dw * weight) + sum over rows of daux . q (q: the scores,
// normalised to sum 1 under sigmoid), differentiated through the chosen experts (fixed away from
// ties: the top-k set does not change under the small steps), for every scoring, top-k method,
// renormalisation and scaling.
TEST(CpuKernels, MoeRouteBackwardMatchesFiniteDifferences) {
    auto be = make_cpu_backend(1);
    const int N = 9, E = 8, k = 2;
    auto z = randn(size_t(N) * E, 60, 2.0f), R = randn(size_t(N) * k, 61), daux = randn(E, 62);
    auto bias = randn(E, 63, 0.1f);
    for (bool sigmoid : {false, true})
        for (int method : {0, 1, 2})
            for (bool norm : {false, true})
                for (float scale : {1.0f, 2.5f}) {
                    MoeRouteRule rule;
                    rule.sigmoid = sigmoid, rule.method = method, rule.norm = norm, rule.scale = scale;
                    rule.groups = method ? 4 : 1, rule.group_top_k = method ? 2 : 1;
                    const float* b = method == 2 ? bias.data() : nullptr;
                    std::vector<float> p(size_t(N) * E), w(size_t(N) * k), dz(p.size());
                    std::vector<int32_t> ex(size_t(N) * k);
                    be->moe_route(p.data(), ex.data(), w.data(), z.data(), b, N, E, k, rule);
                    const std::vector<int32_t> chosen = ex;
                    be->moe_route_backward(dz.data(), R.data(), p.data(), ex.data(), w.data(), daux.data(), N, E, k,
                                           rule);
                    auto f = [&] {
                        be->moe_route(p.data(), ex.data(), w.data(), z.data(), b, N, E, k, rule);
                        EXPECT_EQ(ex, chosen);
                        double l = dot(w, R);
                        for (int t = 0; t < N; ++t) {
                            double sum = 0;
                            for (int e = 0; e < E; ++e) sum += p[size_t(t) * E + e];
                            for (int e = 0; e < E; ++e)
                                l += double(daux[e]) * p[size_t(t) * E + e] / (sigmoid ? sum : 1.0);
                        }
                        return l;
                    };
                    auto r = gradcheck(z, dz, f, 1e-3f, 54);
                    EXPECT_LT(r.rel(), 1e-2) << "sigmoid=" << sigmoid << " method=" << method << " norm=" << norm
                                             << " scale=" << scale;
                    // Weights: the chosen scores, descending by choice score; renormalised to sum
                    // 1; times the scale.
                    be->moe_route(p.data(), ex.data(), w.data(), z.data(), b, N, E, k, rule);
                    for (int t = 0; t < N; ++t) {
                        const float* pt = p.data() + size_t(t) * E;
                        auto c = [&](int e) { return b ? pt[e] + b[e] : pt[e]; };
                        EXPECT_GE(c(ex[size_t(t) * k]), c(ex[size_t(t) * k + 1]));
                        if (norm) EXPECT_NEAR(w[size_t(t) * k] + w[size_t(t) * k + 1], scale, 1e-5);
                        else EXPECT_EQ(w[size_t(t) * k], pt[ex[size_t(t) * k]] * scale);
                    }
                }
    // The bias only chooses: a large bias on expert 5 picks it everywhere, its weight stays p_5.
    std::vector<float> big(E, 0.0f), p(size_t(N) * E), w(size_t(N) * k);
    big[5] = 10.0f;
    std::vector<int32_t> ex(size_t(N) * k);
    MoeRouteRule plain;
    plain.norm = false;
    be->moe_route(p.data(), ex.data(), w.data(), z.data(), big.data(), N, E, k, plain);
    for (int t = 0; t < N; ++t) {
        EXPECT_EQ(ex[size_t(t) * k], 5);
        EXPECT_EQ(w[size_t(t) * k], p[size_t(t) * E + 5]);
    }
}

// The group rules against a plain reading of DeepSeek's code: the groups ranked by their best
// choice score (group_limited_greedy) or the sum of their two best (noaux_tc), the best
// group_top_k kept, the top-k taken among their experts; the sigmoid's scores.
TEST(CpuKernels, MoeRouteGroupsAsDeepSeekDefinesThem) {
    auto be = make_cpu_backend(2);
    const int N = 200, E = 16, G = 4, n = E / G, k = 3;
    auto z = randn(size_t(N) * E, 70, 2.0f), bias = randn(E, 71, 0.2f);
    for (int method : {1, 2})
        for (bool sigmoid : {false, true})
            for (const float* b : {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
                MoeRouteRule rule;
                rule.sigmoid = sigmoid, rule.method = method, rule.groups = G, rule.group_top_k = 2;
                std::vector<float> p(size_t(N) * E), w(size_t(N) * k);
                std::vector<int32_t> ex(size_t(N) * k);
                be->moe_route(p.data(), ex.data(), w.data(), z.data(), b, N, E, k, rule);
                int differs_from_greedy = 0;
                for (int t = 0; t < N; ++t) {
                    std::vector<double> s(E), c(E);
                    double mx = -1e30, sum = 0;
                    for (int e = 0; e < E; ++e) mx = std::max(mx, double(z[size_t(t) * E + e]));
                    for (int e = 0; e < E; ++e) {
                        const double x = z[size_t(t) * E + e];
                        s[e] = sigmoid ? 1 / (1 + std::exp(-x)) : std::exp(x - mx);
                        sum += s[e];
                    }
                    for (int e = 0; e < E; ++e) {
                        if (!sigmoid) s[e] /= sum;
                        ASSERT_NEAR(p[size_t(t) * E + e], s[e], 1e-6);
                        c[e] = p[size_t(t) * E + e] + (b ? b[e] : 0.0f);
                    }
                    std::vector<std::pair<double, int>> gs;
                    for (int g = 0; g < G; ++g) {
                        std::vector<double> in(c.begin() + g * n, c.begin() + (g + 1) * n);
                        std::sort(in.rbegin(), in.rend());
                        gs.push_back({method == 1 ? in[0] : in[0] + in[1], g});
                    }
                    std::sort(gs.begin(), gs.end(), [](auto x, auto y) { return x.first > y.first; });
                    std::vector<std::pair<double, int>> cand, all;
                    for (int e = 0; e < E; ++e) {
                        all.push_back({c[e], e});
                        if (e / n == gs[0].second || e / n == gs[1].second) cand.push_back({c[e], e});
                    }
                    std::sort(cand.begin(), cand.end(), [](auto x, auto y) { return x.first > y.first; });
                    std::sort(all.begin(), all.end(), [](auto x, auto y) { return x.first > y.first; });
                    for (int j = 0; j < k; ++j) ASSERT_EQ(ex[size_t(t) * k + j], cand[size_t(j)].second) << t;
                    for (int j = 0; j < k; ++j) differs_from_greedy += ex[size_t(t) * k + j] != all[size_t(j)].second;
                }
                EXPECT_GT(differs_from_greedy, 0);  // the groups did limit some choices
            }
}

TEST(CpuKernels, Copy2dPacksAndAccumulatesStridedColumns) {
    auto b = be();
    const size_t rows = 300, cols = 7, ld_src = 19, ld_dst = 9;  // > 2^16 elements: threaded
    auto src = randn(rows * ld_src * 40, 1);
    std::vector<float> dst(rows * ld_dst * 40, 5.0f);
    const size_t R = rows * 40;
    b->copy_2d(dst.data(), ld_dst, src.data() + 3, ld_src, R, cols, false);
    for (size_t r = 0; r < R; ++r)
        for (size_t c = 0; c < ld_dst; ++c)
            ASSERT_EQ(dst[r * ld_dst + c], c < cols ? src[r * ld_src + 3 + c] : 5.0f) << r << "," << c;
    b->copy_2d(dst.data(), ld_dst, src.data() + 3, ld_src, R, cols, true);
    for (size_t r = 0; r < R; ++r) ASSERT_EQ(dst[r * ld_dst + 2], 2 * src[r * ld_src + 5]);
}

TEST(CpuKernels, EmbeddingBackwardSumsRepeatedIds) {
    auto b = be();
    const int N = 5, C = 3, V = 4;
    std::vector<int32_t> ids = {1, 3, 1, 0, 1};
    auto dout = randn(N * C, 18);
    std::vector<float> dw(V * C, 0.0f);
    b->embedding_backward(dw.data(), dout.data(), ids.data(), N, C, V);
    for (int c = 0; c < C; ++c) {
        EXPECT_FLOAT_EQ(dw[1 * C + c], dout[0 * C + c] + dout[2 * C + c] + dout[4 * C + c]);
        EXPECT_FLOAT_EQ(dw[2 * C + c], 0.0f);
    }
}

TEST(CpuKernels, AdamwMatchesHandComputedPytorchStep) {
    auto b = be();
    // One element, step 1: torch.optim.AdamW(lr=0.1, betas=(0.9, 0.99), eps=1e-8, wd=0.5)
    float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
    b->adamw(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.99f, 1e-8f, 0.5f, 1 - 0.9f, 1 - 0.99f);
    // decay: 1 - 0.1*0.5 = 0.95; m = 0.05, v = 0.0025; mhat = 0.5, vhat = 0.25; step = 0.1*0.5/0.5
    EXPECT_NEAR(p, 0.95f - 0.1f, 1e-6);
    EXPECT_NEAR(m, 0.05f, 1e-7);
    EXPECT_NEAR(v, 0.0025f, 1e-8);
}

TEST(CpuKernels, Bf16RoundsToNearestEvenAndWidensExactly) {
    auto bits = [](float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; };
    auto from = [](uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; };
    // 1 + 2^-8 lies exactly between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1);
    // 1 + 3*2^-8 lies between 1 + 2^-7 and 1 + 2^-6 and goes to the even 1 + 2^-6.
    EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    EXPECT_EQ(float_to_bf16(from(0x3f808001)), 0x3f81);  // just above the tie: up
    EXPECT_EQ(float_to_bf16(-2.5f), 0xc020);
    EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
    EXPECT_EQ(float_to_bf16(from(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds up to infinity
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from(0x7f800001)))));  // NaN, not inf
    // The backend's conversions are the same functions, element for element.
    auto b = be();
    auto x = randn(1000, 5);
    x[3] = 1.0f + 0x1p-8f;
    std::vector<bf16_bits> h(x.size());
    std::vector<float> back(x.size());
    b->to_bf16(h.data(), x.data(), x.size());
    b->from_bf16(back.data(), h.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(h[i], float_to_bf16(x[i])) << i;
        ASSERT_EQ(bits(back[i]), uint32_t(h[i]) << 16) << i;
        ASSERT_LE(std::abs(back[i] - x[i]), std::abs(x[i]) * 0x1p-8f) << i;  // half an ulp: 2^-8 relative
    }
}

TEST(CpuKernels, Bf16GemmIsSgemmOnRoundedOperands) {
    auto b = be();
    const int M = 7, N = 5, K = 9, pad = 3;
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
            const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            const int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
            auto A = randn(size_t(ar) * lda, 10 + ta), B = randn(size_t(br) * ldb, 20 + tb);
            std::vector<bf16_bits> Ab(A.size()), Bb(B.size());
            std::vector<float> Ar(A.size()), Br(B.size());
            for (size_t i = 0; i < A.size(); ++i) Ab[i] = float_to_bf16(A[i]), Ar[i] = round_bf16(A[i]);
            for (size_t i = 0; i < B.size(); ++i) Bb[i] = float_to_bf16(B[i]), Br[i] = round_bf16(B[i]);
            auto C0 = randn(size_t(M) * ldc, 30);
            std::vector<float> C = C0, Cref = C0, Cfp32 = C0;
            b->gemm_bf16(ta, tb, M, N, K, 0.5f, Ab.data(), lda, Bb.data(), ldb, 2.0f, C.data(), ldc);
            b->gemm(ta, tb, M, N, K, 0.5f, Ar.data(), lda, Br.data(), ldb, 2.0f, Cref.data(), ldc);
            b->gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, Cfp32.data(), ldc);
            EXPECT_EQ(0, std::memcmp(C.data(), Cref.data(), C.size() * 4)) << ta << tb;
            // ... and really in bf16: the unrounded product differs by about 2^-9 relative.
            double diff = 0;
            for (size_t i = 0; i < C.size(); ++i) diff = std::max(diff, double(std::abs(C[i] - Cfp32[i])));
            EXPECT_GT(diff, 1e-4) << ta << tb;
            EXPECT_LT(diff, 0.1) << ta << tb;
        }
}

}  // namespace

// The vectorisable exp of the CPU kernels (src/kernels/cpu/cpu_math.hpp) against std::exp:
// within 2 ulp over the normal range, exactly 0 for masked (-inf) and tiny inputs, inf and NaN
// as std::exp gives them.
#include "../../src/kernels/cpu/cpu_math.hpp"

TEST(CpuMath, ExpFastMatchesStdExp) {
    using quintet::cpu::exp_fast;
    auto ulps = [](float a, float b) {
        int32_t ia, ib;
        std::memcpy(&ia, &a, 4);
        std::memcpy(&ib, &b, 4);
        return std::abs(int64_t(ia) - int64_t(ib));
    };
    int64_t worst = 0;
    float at = 0;
    for (int i = 0; i <= 2000000; ++i) {
        const float x = -87.0f + 175.0f * float(i) / 2000000.0f;  // -87 .. 88
        const float want = std::exp(x), got = exp_fast(x);
        if (!std::isnormal(want)) continue;
        const int64_t u = ulps(got, want);
        if (u > worst) worst = u, at = x;
    }
    EXPECT_LE(worst, 2) << "at x = " << at;
    EXPECT_EQ(exp_fast(0.0f), 1.0f);
    EXPECT_EQ(exp_fast(-INFINITY), 0.0f);
    EXPECT_EQ(exp_fast(-200.0f), 0.0f);
    EXPECT_EQ(exp_fast(INFINITY), INFINITY);
    EXPECT_EQ(exp_fast(100.0f), INFINITY);
    EXPECT_TRUE(std::isnan(exp_fast(std::nanf(""))));
    // Monotone across the reduction's boundaries (n ln2 +- ln2/2).
    for (int n = -120; n < 120; ++n) {
        const float b = float(n) * 0.69314718f + 0.34657359f;
        EXPECT_LE(exp_fast(std::nextafter(b, -1e9f)), exp_fast(std::nextafter(b, 1e9f))) << n;
    }
}

// The attention tiles' register-blocked GEMM (src/kernels/cpu/cpu_tile_gemm.hpp) against a
// double-precision loop: every row remainder (1..5 past the 6-row blocks), column remainders
// inside and across the two vectors of a 16-column block, A and B each read as stored and
// transposed through their strides, A packed and read in place, padded leading dimensions,
// beta 0 (C's old contents, NaN here, never read) and 1, columns past n left untouched; the
// AVX2 kernel (where the host has it) and the plain C++ one.
#include "../../src/kernels/cpu/cpu_tile_gemm.hpp"

TEST(CpuTileGemm, MatchesADoubleLoopOnEveryEdge) {
    using namespace quintet::cpu;
    const bool host_avx2 = tile_detail::use_avx2();
    int cases = 0;
    for (int kernel = 0; kernel < 2; ++kernel) {
        tile_detail::use_avx2() = kernel == 0 && host_avx2;
        double worst = 0;
        for (int m : {1, 5, 6, 7, 12, 64})
            for (int n : {1, 7, 8, 9, 16, 17, 33, 64})
                for (int k : {1, 3, 13, 64})
                    for (int form = 0; form < 8; ++form)
                        for (float beta : {0.0f, 1.0f}) {
                            const bool at = form & 1, bt = form & 2, packed_a = form & 4;
                            const long lda = (at ? m : k) + 3, ldb = (bt ? k : n) + 5, ldc = n + 2;
                            auto A = randn(size_t(at ? k : m) * lda, 11 + m);
                            auto B = randn(size_t(bt ? n : k) * ldb, 13 + n);
                            auto C = randn(size_t(m) * ldc, 17 + k);
                            if (beta == 0.0f) std::fill(C.begin(), C.end(), std::nanf(""));
                            auto C0 = C;
                            const long ars = at ? 1 : lda, acs = at ? lda : 1;
                            const long brs = bt ? 1 : ldb, bcs = bt ? ldb : 1;
                            std::vector<float> pa(tile_packed_a_size(m, k), -7.0f);
                            std::vector<float> pb(tile_packed_b_size(k, n), -7.0f);
                            tile_pack_b(pb.data(), k, n, B.data(), brs, bcs);
                            if (packed_a) {
                                tile_pack_a(pa.data(), m, k, A.data(), ars, acs);
                                tile_gemm_packed(m, n, k, 0.7f, pa.data(), pb.data(), k, beta, C.data(), ldc);
                            } else {
                                tile_gemm_packed_b(m, n, k, 0.7f, A.data(), ars, acs, pb.data(), k, beta,
                                                   C.data(), ldc);
                            }
                            for (int i = 0; i < m; ++i)
                                for (int j = 0; j < ldc; ++j) {
                                    const float got = C[size_t(i) * ldc + j];
                                    if (j >= n) {  // past the columns: untouched
                                        const float was = C0[size_t(i) * ldc + j];
                                        ASSERT_TRUE(std::isnan(was) ? std::isnan(got) : got == was);
                                        continue;
                                    }
                                    double want = 0;
                                    for (int p = 0; p < k; ++p)
                                        want += double(A[size_t(i * ars + p * acs)]) * B[size_t(p * brs + j * bcs)];
                                    want *= 0.7;
                                    if (beta != 0.0f) want += C0[size_t(i) * ldc + j];
                                    ASSERT_FALSE(std::isnan(got)) << m << "x" << n << "x" << k;
                                    worst = std::max(worst, std::abs(got - want) / (1.0 + std::abs(want)));
                                }
                            ++cases;
                        }
        EXPECT_LT(worst, 1e-5) << (kernel == 0 ? "avx2" : "plain") << " kernel";
    }
    tile_detail::use_avx2() = host_avx2;
    EXPECT_EQ(cases, 2 * 6 * 8 * 4 * 8 * 2);
}

// The AVX2 packs (8 x 8 register transposes, and the plain copy of B) write exactly what the
// plain loops do, padding included, on every edge: rows and columns past the last whole
// panel, p past the last block of 8.
TEST(CpuTileGemm, PacksMatchThePlainLoops) {
    using namespace quintet::cpu;
    if (!tile_detail::use_avx2()) GTEST_SKIP() << "host without AVX2+FMA: only the plain packs run";
    for (int rows : {1, 5, 6, 7, 12, 17, 64})
        for (int k : {1, 7, 8, 9, 16, 64, 70}) {
            const long ld = k + 3;
            auto X = randn(size_t(rows) * ld, 29 + rows + k);
            // A as stored (acs 1): the rows of X.
            std::vector<float> fast(tile_packed_a_size(rows, k), -7.0f), plain(fast);
            tile_pack_a(fast.data(), rows, k, X.data(), ld, 1);
            tile_detail::pack_a_generic(plain.data(), rows, k, X.data(), ld, 1);
            ASSERT_EQ(fast, plain) << "A " << rows << "x" << k;
            // B^T as stored (brs 1): B is k x rows, its column j the row j of X.
            std::vector<float> fb(tile_packed_b_size(k, rows), -7.0f), pb(fb);
            tile_pack_b(fb.data(), k, rows, X.data(), 1, ld);
            tile_detail::pack_b_generic(pb.data(), k, rows, X.data(), 1, ld);
            ASSERT_EQ(fb, pb) << "B^T " << k << "x" << rows;
            // B as stored (bcs 1): B is rows x k, the rows of X.
            std::vector<float> fn(tile_packed_b_size(rows, k), -7.0f), pn(fn);
            tile_pack_b(fn.data(), rows, k, X.data(), ld, 1);
            tile_detail::pack_b_generic(pn.data(), rows, k, X.data(), ld, 1);
            ASSERT_EQ(fn, pn) << "B " << rows << "x" << k;
        }
}

// Per-block limits (a causal tile's triangle): each 6-row block sums p over [p_begin, p_end)
// only, and C's column panels at or past its n_end keep what they held -- both kernels, A
// packed and in place, limits of 0, mid-panel and past the end.
TEST(CpuTileGemm, BlockLimitsSumOnlyTheirRange) {
    using namespace quintet::cpu;
    const bool host_avx2 = tile_detail::use_avx2();
    const int m = 64, n = 64, k = 64;
    auto A = randn(size_t(m) * k, 41), B = randn(size_t(k) * n, 43);
    std::vector<float> pa(tile_packed_a_size(m, k)), pb(tile_packed_b_size(k, n));
    tile_pack_a(pa.data(), m, k, A.data(), k, 1);
    tile_pack_b(pb.data(), k, n, B.data(), n, 1);
    const int blocks = (m + kTileMR - 1) / kTileMR;
    std::vector<int> n_end(static_cast<size_t>(blocks)), p_begin(n_end), p_end(n_end);
    for (int ib = 0; ib < blocks; ++ib) {
        n_end[size_t(ib)] = (ib * 7) % 70;        // 0, mid-panel, a panel edge, past n
        p_begin[size_t(ib)] = (ib * 11) % 60;
        p_end[size_t(ib)] = p_begin[size_t(ib)] + (ib * 13) % 40;  // may pass k
    }
    for (int kernel = 0; kernel < 2; ++kernel) {
        tile_detail::use_avx2() = kernel == 0 && host_avx2;
        for (int packed = 0; packed < 2; ++packed) {
            std::vector<float> C(size_t(m) * n, 5.0f);
            TileLimits lim;
            lim.n_end = n_end.data(), lim.p_begin = p_begin.data(), lim.p_end = p_end.data();
            if (packed) tile_gemm_packed(m, n, k, 1.0f, pa.data(), pb.data(), k, 1.0f, C.data(), n, lim);
            else tile_gemm_packed_b(m, n, k, 1.0f, A.data(), k, 1, pb.data(), k, 1.0f, C.data(), n, lim);
            for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) {
                    const int ib = i / kTileMR;
                    const float got = C[size_t(i) * n + j];
                    if (j / kTileNR * kTileNR >= n_end[size_t(ib)]) {
                        ASSERT_EQ(got, 5.0f) << i << "," << j;
                        continue;
                    }
                    double want = 5.0;
                    for (int p = p_begin[size_t(ib)]; p < std::min(k, p_end[size_t(ib)]); ++p)
                        want += double(A[size_t(i) * k + p]) * B[size_t(p) * n + j];
                    ASSERT_NEAR(got, want, 1e-4 * (1 + std::abs(want))) << i << "," << j << " kernel " << kernel;
                }
        }
    }
    tile_detail::use_avx2() = host_avx2;
}

// quintet's GEMM (src/kernels/cpu/cpu_gemm.cpp), each kernel the host runs, against a
// double-precision loop: each of the four transpose forms, row counts around the 6- and 12-row
// blocks, column counts inside, across and past the 16- and 32-column blocks and the 256- and
// 512-column N blocks, K around the 256 K block (and 0), padded leading dimensions, alpha 1 and
// 0.7, beta 0 (C's old contents NaN, never read), 1 and 0.5; columns past n left untouched; the
// same bits on 1, 2 and 3 threads, and from the AVX2 kernel as from the AVX-512 one.
#include "../../src/kernels/cpu/cpu_gemm.hpp"

// The own GEMM's kernels this host can run (none: the BLAS runs instead).
static std::vector<quintet::cpu::GemmKernel> host_gemm_kernels() {
    using quintet::cpu::GemmKernel;
    std::vector<GemmKernel> kinds;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) kinds.push_back(GemmKernel::avx512);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) kinds.push_back(GemmKernel::avx2);
#endif
    return kinds;
}

TEST(CpuOwnGemm, MatchesADoubleLoopOnEveryEdgeAndThreadCount) {
    using namespace quintet::cpu;
    const std::vector<GemmKernel> kinds = host_gemm_kernels();
    if (kinds.empty()) GTEST_SKIP() << "host without AVX2 and FMA: the BLAS runs";
    struct Shape { int m, n, k; };
    std::vector<Shape> shapes;
    for (int m : {1, 5, 6, 7, 11, 12, 13, 37})
        for (int n : {1, 8, 9, 15, 16, 17, 32, 33, 70})
            for (int k : {0, 1, 9, 256, 300}) shapes.push_back({m, n, k});
    shapes.push_back({25, 1100, 40});   // three N blocks, the last partial
    shapes.push_back({300, 40, 520});   // three K blocks, many row blocks
    int cases = 0;
    double worst = 0;
    for (const Shape& s : shapes)
        for (int form = 0; form < 4; ++form)
            for (float beta : {0.0f, 1.0f, 0.5f}) {
                const int m = s.m, n = s.n, k = s.k;
                const bool ta = form & 1, tb = form & 2;
                const float alpha = (cases % 2) ? 0.7f : 1.0f;
                const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
                auto A = randn(size_t(ta ? k : m) * lda + 1, 11 + m);
                auto B = randn(size_t(tb ? n : k) * ldb + 1, 13 + n);
                auto C0 = randn(size_t(m) * ldc, 17 + k);
                if (beta == 0.0f)
                    for (int i = 0; i < m; ++i)
                        for (int j = 0; j < n; ++j) C0[size_t(i) * ldc + j] = std::nanf("");
                std::vector<float> first;
                for (GemmKernel kind : kinds)
                for (int threads : {1, 2, 3}) {
                    auto C = C0;
                    own_sgemm(kind, ta, tb, m, n, k, alpha, A.data(), lda, B.data(), ldb, beta,
                              C.data(), ldc, threads);
                    if (first.empty()) {
                        first = C;
                        for (int i = 0; i < m; ++i)
                            for (int j = 0; j < ldc; ++j) {
                                const float got = C[size_t(i) * ldc + j];
                                if (j >= n) {  // past the columns: untouched
                                    ASSERT_EQ(got, C0[size_t(i) * ldc + j]);
                                    continue;
                                }
                                double want = 0, mag = 0;
                                for (int p = 0; p < k; ++p) {
                                    const double ab = double(ta ? A[size_t(p) * lda + i] : A[size_t(i) * lda + p]) *
                                                      (tb ? B[size_t(j) * ldb + p] : B[size_t(p) * ldb + j]);
                                    want += ab;
                                    mag += std::abs(ab);
                                }
                                want *= alpha;
                                mag *= alpha;
                                if (beta != 0.0f) {
                                    want += double(beta) * C0[size_t(i) * ldc + j];
                                    mag += std::abs(double(beta) * C0[size_t(i) * ldc + j]);
                                }
                                ASSERT_FALSE(std::isnan(got)) << m << "x" << n << "x" << k << " form " << form;
                                // fp32's worst case for a sum of k + 2 terms in some order (the
                                // bound gamma_n of Higham's section 3.1): err/bound < 1 must hold.
                                const double bound = (k + 3) * 0x1p-24 * mag + 1e-30;
                                worst = std::max(worst, std::abs(got - want) / bound);
                            }
                    } else {
                        ASSERT_EQ(std::memcmp(C.data(), first.data(), C.size() * 4), 0)
                            << m << "x" << n << "x" << k << " form " << form << ": kernel "
                            << int(kind) << " on " << threads << " threads differs from the first";
                    }
                }
                ++cases;
            }
    EXPECT_LT(worst, 1.0);
    EXPECT_EQ(cases, int(shapes.size()) * 4 * 3);
}

// Up to 8 rows (M <= 8) take the few-row path (no packing, no padding rows: a decoder step's
// linear layers, a batch of sequences, a speculative verification). Its bits are the tile
// kernel's: the first m rows computed alone (m = 1 .. 8) equal the same rows of a 9-row product,
// which takes the blocked GEMM -- each transpose form, K across and past the 256 K block and not
// a multiple of 8, column counts around the 8 lanes, alpha 1 and 0.7, beta 0 / 1 / 0.5, on 1 and
// 3 threads (so a layer's output does not depend on whether a MoE expert got one row or two,
// nor a decoder's logits on the batch).
TEST(CpuOwnGemm, FewRowsGiveTheTileKernelsBits) {
    using namespace quintet::cpu;
    const std::vector<GemmKernel> kinds = host_gemm_kernels();
    if (kinds.empty()) GTEST_SKIP() << "host without AVX2 and FMA: the BLAS runs";
    ASSERT_EQ(std::getenv("QUINTET_FEW_ROWS"), nullptr) << "the test assumes the default: 8 rows at most";
    constexpr int kRows = 9;
    int cases = 0;
    for (GemmKernel kind : kinds)
        for (int n : {1, 7, 8, 9, 33, 600})
            for (int k : {1, 7, 8, 256, 263, 700})
                for (int form = 0; form < 4; ++form)
                    for (float beta : {0.0f, 1.0f, 0.5f})
                        for (int threads : {1, 3}) {
                            const bool ta = form & 1, tb = form & 2;
                            const float alpha = (cases % 2) ? 0.7f : 1.0f;
                            const int lda = (ta ? kRows : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
                            const auto A = randn(size_t(ta ? k : kRows) * lda + 1, 31 + k);
                            const auto B = randn(size_t(tb ? n : k) * ldb + 1, 37 + n);
                            const auto C0 = randn(size_t(kRows) * ldc, 41 + n);
                            std::vector<float> C9 = C0;
                            own_sgemm(kind, ta, tb, kRows, n, k, alpha, A.data(), lda, B.data(), ldb, beta, C9.data(),
                                      ldc, threads);
                            for (int m = 1; m < kRows; ++m) {
                                std::vector<float> Cm(C0.begin(), C0.begin() + size_t(m) * ldc);
                                if (beta == 0.0f)
                                    for (int r = 0; r < m; ++r)
                                        for (int j = 0; j < n; ++j) Cm[size_t(r) * ldc + j] = std::nanf("");  // never read
                                own_sgemm(kind, ta, tb, m, n, k, alpha, A.data(), lda, B.data(), ldb, beta, Cm.data(),
                                          ldc, threads);
                                for (int r = 0; r < m; ++r)
                                    ASSERT_EQ(std::memcmp(Cm.data() + size_t(r) * ldc, C9.data() + size_t(r) * ldc,
                                                          size_t(n) * 4), 0)
                                        << "rows " << m << " row " << r << " n " << n << " k " << k << " form " << form
                                        << " beta " << beta << " kernel " << int(kind) << " threads " << threads;
                            }
                            ++cases;
                        }
    EXPECT_EQ(cases, int(kinds.size()) * 6 * 6 * 4 * 3 * 2);
}
