// The CUDA kernels' device code, run on CPU threads by emulate.hpp, against the CPU backend:
// the same checks as tests/kernels/test_cuda_vs_cpu.cpp where they concern a kernel's logic
// (tiling across tile boundaries, causal masks, GQA head mapping, both backward tile sizes,
// ignored targets and ids, determinism of the reductions). The launch configurations come from
// the same helpers the real launchers use; cuBLAS, CUB and the CUDA API are not emulated (the
// embedding's radix sort is std::stable_sort here). Runs in every CUDA build, GPU or not.
// ctest: labels=unit requires=cuda
#include "emulate/emulate.hpp"  // first: defines the CUDA keywords for the kernel headers

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_kernels.cuh"
#include "elementwise_kernels.cuh"
#include "embedding_kernels.cuh"
#include "moe_kernels.cuh"
#include "reduce_kernels.cuh"
#include "rmsnorm_kernels.cuh"
#include "rope_kernels.cuh"
#include "xent_kernels.cuh"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/rope.hpp"
#include "support/attention_ref.hpp"
#include "support/compare.hpp"
#include "support/gradcheck.hpp"

using namespace quintet;
using namespace quintet::cuda;
using namespace quintet::cuda::kern;
using quintet::testing::randn;
using quintet::testing::rel_err;
using quintet_emu::launch;

namespace {

constexpr double kTol = 1e-5;

std::unique_ptr<Backend> cpu() { return make_cpu_backend(1); }

TEST(EmulatedKernels, EmbeddingForwardBackward) {
    auto be = cpu();
    const int V = 23, C = 300, N = 70;
    std::mt19937 g(5);
    std::vector<int32_t> ids(N);
    for (int n = 0; n < N; ++n) ids[n] = (n % 11 == 0) ? -1 : int32_t(g() % 9);
    auto wte = randn(size_t(V) * C, 6), dout = randn(size_t(N) * C, 7), dw = randn(size_t(V) * C, 8);
    std::vector<float> out(size_t(N) * C), out_e(out.size(), 3.0f), dw_e = dw;
    be->embedding_forward(out.data(), ids.data(), wte.data(), N, C);
    be->embedding_backward(dw.data(), dout.data(), ids.data(), N, C, V);
    launch(dim3(N), dim3(kThreads), 0,
           [&] { embedding_forward_kernel(out_e.data(), ids.data(), wte.data(), C); });
    EXPECT_LT(rel_err(out_e, out), kTol);
    std::vector<uint32_t> keys(N), toks(N);
    launch(dim3(grid_for(N)), dim3(kThreads), 0,
           [&] { embedding_keys_kernel(keys.data(), toks.data(), ids.data(), N, V); });
    // CUB's stable radix sort of (key, token), by std::stable_sort.
    std::vector<uint32_t> order(N);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
    std::vector<uint32_t> skeys(N), stoks(N);
    for (int i = 0; i < N; ++i) {
        skeys[i] = keys[order[i]];
        stoks[i] = toks[order[i]];
    }
    launch(dim3(N), dim3(kThreads), 0, [&] {
        embedding_backward_runs_kernel(dw_e.data(), dout.data(), skeys.data(), stoks.data(), N, C, V);
    });
    EXPECT_EQ(0, std::memcmp(dw_e.data(), dw.data(), dw.size() * 4)) << "not the CPU's order";
}

TEST(EmulatedKernels, RmsnormForwardBackward) {
    auto be = cpu();
    for (int C : {24, 300}) {
        const int N = 67;
        auto x = randn(size_t(N) * C, 10), w = randn(C, 11), dy = randn(size_t(N) * C, 12);
        auto dx = randn(size_t(N) * C, 13), dw = randn(C, 14);
        std::vector<float> out(size_t(N) * C), rstd(N), out_e(out.size()), rstd_e(N), dx_e = dx, dw_e = dw;
        be->rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
        be->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
        launch(dim3(N), dim3(kThreads), 0, [&] {
            rmsnorm_forward_kernel(out_e.data(), rstd_e.data(), x.data(), w.data(), C, 1e-5f);
        });
        EXPECT_LT(rel_err(out_e, out), kTol) << C;
        EXPECT_LT(rel_err(rstd_e, rstd), kTol) << C;
        launch(dim3(N), dim3(kThreads), 0, [&] {
            rmsnorm_backward_dx_kernel(dx_e.data(), dy.data(), x.data(), w.data(), rstd_e.data(), C);
        });
        const int rows = dw_rows_per_chunk(N), chunks = dw_chunks(N);
        std::vector<float> partial(size_t(chunks) * C);
        const unsigned cblocks = unsigned((C + kThreads - 1) / kThreads);
        launch(dim3(cblocks, unsigned(chunks)), dim3(kThreads), 0, [&] {
            rmsnorm_dw_partial_kernel(partial.data(), dy.data(), x.data(), rstd_e.data(), N, C, rows);
        });
        launch(dim3(cblocks), dim3(kThreads), 0,
               [&] { rmsnorm_dw_final_kernel(dw_e.data(), partial.data(), chunks, C); });
        EXPECT_LT(rel_err(dx_e, dx), kTol) << C;
        EXPECT_LT(rel_err(dw_e, dw), kTol) << C;
    }
}

TEST(EmulatedKernels, RopeForwardBackward) {
    auto be = cpu();
    const int N = 18, heads = 3, head_stride = 10, col0 = 2, dim = 8, stride = heads * head_stride + 4;
    RopeConfig rc;
    std::vector<float> cs, sn;
    rope_tables(cs, sn, 40, rope_inv_freq(rc, dim, 40), 1.0);
    std::vector<int32_t> pos(N);
    for (int n = 0; n < N; ++n) pos[size_t(n)] = (n * 11) % 40;
    const RopeArgs ra{N, heads, head_stride, col0, dim, stride};
    const RopeShape rs{N, heads, head_stride, col0, dim, stride};
    auto x = randn(size_t(N) * stride, 15);
    std::vector<float> y = x, y_e = x;
    const size_t total = size_t(N) * heads * (dim / 2);
    for (float sign : {1.0f, -1.0f}) {
        if (sign > 0) be->rope_forward(y.data(), cs.data(), sn.data(), pos.data(), ra);
        else be->rope_backward(y.data(), cs.data(), sn.data(), pos.data(), ra);
        launch(dim3(grid_for(total)), dim3(kThreads), 0,
               [&] { rope_kernel(y_e.data(), cs.data(), sn.data(), pos.data(), rs, sign); });
        EXPECT_LT(rel_err(y_e, y), kTol) << sign;
    }
}

struct AttnCase {
    int B, Tq, Tk, NH, NKV, Dqk, Dv, q0, k0;
    bool causal;
    int doc, max_smem;  // max_smem picks the backward tile (32 or 16 rows)
};

TEST(EmulatedKernels, GeneralAttentionForwardMergeBackward) {
    auto be = cpu();
    const AttnCase cases[] = {{2, 70, 70, 4, 2, 16, 16, 0, 0, true, 0, 232448},
                              {1, 45, 45, 2, 2, 64, 64, 0, 0, true, 0, 232448},
                              {1, 40, 40, 4, 1, 8, 8, 0, 0, true, 0, 1000},
                              {2, 5, 5, 2, 1, 4, 4, 0, 0, true, 0, 232448},
                              {1, 20, 70, 4, 2, 12, 8, 50, 0, true, 0, 232448},
                              {2, 40, 40, 2, 1, 8, 8, 0, 0, true, 13, 1000},
                              {1, 30, 40, 2, 1, 8, 8, 10, 20, true, 0, 232448},
                              {1, 9, 37, 2, 2, 4, 6, 0, 0, false, 0, 232448}};
    for (const auto& c : cases) {
        auto p = quintet::testing::make_problem(c.B, c.Tq, c.Tk, c.NH, c.NKV, c.Dqk, c.Dv, c.q0,
                                                c.k0, c.causal, c.doc, 20);
        const AttentionArgs& a = p.a;
        const AttnShape sh{a.B, a.Tq, a.Tk, a.NH, a.NKV, a.Dqk, a.Dv, a.q_stride, a.k_stride,
                           a.v_stride, a.o_stride, a.scale, a.causal ? 1 : 0, a.q_pos, a.k_pos,
                           a.q_doc, a.k_doc};
        auto dout = randn(p.out_size(), 21);
        std::vector<float> out(p.out_size()), lse(p.lse_size());
        std::vector<float> dq(p.q.size(), 0.5f), dk(p.k.size(), 0.5f), dv(p.v.size(), 0.5f);
        be->attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), a);
        be->attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                               p.q.data(), p.k.data(), p.v.data(), a);
        const std::string what = "Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) +
                                 " NH=" + std::to_string(c.NH) + " NKV=" + std::to_string(c.NKV) +
                                 " D=" + std::to_string(c.Dqk) + "/" + std::to_string(c.Dv);
        // forward, as attention_forward() launches it
        std::vector<float> out_e(out.size()), lse_e(lse.size());
        launch(dim3(unsigned((c.Tq + kFwdTile - 1) / kFwdTile), unsigned(c.NH), unsigned(c.B)),
               dim3(kAttnThreads), fwd_smem_bytes(c.Dqk, c.Dv), [&] {
                   attention_forward_kernel(out_e.data(), lse_e.data(), p.q.data(), p.k.data(),
                                            p.v.data(), sh);
               });
        EXPECT_LT(rel_err(out_e, out), kTol) << what;
        for (size_t i = 0; i < lse.size(); ++i)
            if (std::isinf(lse[i])) ASSERT_TRUE(std::isinf(lse_e[i])) << what;
            else ASSERT_NEAR(lse_e[i], lse[i], 1e-4) << what;
        // backward, as attention_backward() launches it
        std::vector<float> dsum(lse.size());
        std::vector<float> dq_e(dq.size(), 0.5f), dk_e(dk.size(), 0.5f), dv_e(dv.size(), 0.5f);
        const size_t rows = lse.size();
        launch(dim3(unsigned((rows * 32 + kAttnThreads - 1) / kAttnThreads)), dim3(kAttnThreads), 0,
               [&] { attention_dsum_kernel(dsum.data(), dout.data(), out_e.data(), sh); });
        const int bt = backward_tile(c.Dqk, c.Dv, c.max_smem);
        launch(dim3(unsigned((c.Tk + bt - 1) / bt), unsigned(c.NKV), unsigned(c.B)), dim3(kAttnThreads),
               dkv_smem_bytes(c.Dqk, c.Dv, bt), [&] {
                   attention_backward_dkv_kernel(dk_e.data(), dv_e.data(), dout.data(), lse_e.data(),
                                                 dsum.data(), p.q.data(), p.k.data(), p.v.data(), sh, bt);
               });
        launch(dim3(unsigned((c.Tq + bt - 1) / bt), unsigned(c.NH), unsigned(c.B)), dim3(kAttnThreads),
               dq_smem_bytes(c.Dqk, c.Dv, bt), [&] {
                   attention_backward_dq_kernel(dq_e.data(), dout.data(), lse_e.data(), dsum.data(),
                                                p.q.data(), p.k.data(), p.v.data(), sh, bt);
               });
        EXPECT_LT(rel_err(dq_e, dq), kTol) << what << " bt=" << bt;
        EXPECT_LT(rel_err(dk_e, dk), kTol) << what << " bt=" << bt;
        EXPECT_LT(rel_err(dv_e, dv), kTol) << what << " bt=" << bt;
        // merge against the CPU's merge: the whole (out, lse) with a perturbed copy of itself
        std::vector<float> o2 = randn(out.size(), 22), l2 = lse;
        for (size_t i = 0; i < l2.size(); ++i) l2[i] = (i % 3 == 0) ? -INFINITY : l2[i] + 0.3f * float(i % 5);
        std::vector<float> oc = out, lc = lse, oe = out, le = lse;
        be->attention_merge(oc.data(), lc.data(), o2.data(), l2.data(), a);
        const size_t total = size_t(a.B) * a.Tq * a.NH * a.Dv;
        launch(dim3(grid_for(total)), dim3(kThreads), 0,
               [&] { attention_merge_kernel(oe.data(), le.data(), o2.data(), l2.data(), sh); });
        launch(dim3(grid_for(lse.size())), dim3(kThreads), 0,
               [&] { attention_merge_lse_kernel(le.data(), l2.data(), lse.size()); });
        EXPECT_LT(rel_err(oe, oc), kTol) << what;
        for (size_t i = 0; i < lc.size(); ++i)
            if (std::isinf(lc[i])) ASSERT_TRUE(std::isinf(le[i])) << what;
            else ASSERT_NEAR(le[i], lc[i], 1e-5) << what;
    }
}

TEST(EmulatedKernels, Copy2dAccumulates) {
    auto be = cpu();
    const size_t rows = 37, cols = 13, ld_dst = 20, ld_src = 15;
    auto dst = randn(rows * ld_dst, 40), src = randn(rows * ld_src, 41);
    std::vector<float> c = dst, e = dst;
    be->copy_2d(c.data(), ld_dst, src.data(), ld_src, rows, cols, true);
    launch(dim3(grid_for(rows * cols)), dim3(kThreads), 0,
           [&] { add_2d_kernel(e.data(), ld_dst, src.data(), ld_src, rows, cols); });
    EXPECT_TRUE(std::equal(c.begin(), c.end(), e.begin()));  // the same float additions
    for (size_t r = 0; r < rows; ++r)
        for (size_t k = cols; k < ld_dst; ++k) ASSERT_EQ(e[r * ld_dst + k], dst[r * ld_dst + k]);
}

// The MoE routing kernels against the CPU backend: the same expert choices and bits.
TEST(EmulatedKernels, MoeRouteGatherCombine) {
    auto be = cpu();
    const int N = 45, E = 8, k = 3, C = 33;
    auto logits = randn(size_t(N) * E, 50, 2.0f), bias = randn(E, 51, 0.05f);
    for (int e = 0; e < E; ++e) logits[size_t(4) * E + e] = 0.5f;  // row 4: all tied
    for (int variant = 0; variant < 12; ++variant)
        for (const float* b : {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
            // softmax and sigmoid; greedy, group_limited_greedy and noaux_tc; with and without
            // renormalisation (and with it, scaling) (E = 8: 4 groups of 2, 2 kept).
            MoeRouteRule rule;
            rule.norm = variant % 2 == 1;
            rule.sigmoid = (variant / 2) % 2 == 1;
            rule.method = variant / 4;
            if (rule.method) rule.groups = 4, rule.group_top_k = 2;
            rule.scale = rule.norm && rule.sigmoid ? 2.5f : 1.0f;
            std::vector<float> p(size_t(N) * E), w(size_t(N) * k), p_e(p.size()), w_e(w.size());
            std::vector<int32_t> ex(size_t(N) * k), ex_e(ex.size());
            be->moe_route(p.data(), ex.data(), w.data(), logits.data(), b, N, E, k, rule);
            launch(dim3(grid_for(N)), dim3(kThreads), 0, [&] {
                moe_route_kernel(p_e.data(), ex_e.data(), w_e.data(), logits.data(), b, N, E, k, rule);
            });
            EXPECT_EQ(ex, ex_e);
            EXPECT_EQ(0, std::memcmp(w.data(), w_e.data(), w.size() * 4));
            EXPECT_EQ(0, std::memcmp(p.data(), p_e.data(), p.size() * 4));
            if (!b && rule.method == 0)
                EXPECT_EQ((std::vector<int32_t>(ex.begin() + 12, ex.begin() + 15)), (std::vector<int32_t>{0, 1, 2}));
            auto dw = randn(w.size(), 52), daux = randn(E, 53);
            std::vector<float> dz(p.size()), dz_e(p.size());
            be->moe_route_backward(dz.data(), dw.data(), p.data(), ex.data(), w.data(), daux.data(), N, E, k, rule);
            launch(dim3(grid_for(N)), dim3(kThreads), 0, [&] {
                moe_route_backward_kernel(dz_e.data(), dw.data(), p.data(), ex.data(), w.data(), daux.data(), N,
                                          E, k, rule);
            });
            EXPECT_LT(rel_err(dz_e, dz), kTol) << variant;  // (the compilers may contract to FMAs differently)
        }
    // Gather, combine and its backward over a permutation of the N*k slots.
    std::vector<int32_t> slot(size_t(N) * k), src(size_t(N) * k);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), std::mt19937(54));
    for (size_t tj = 0; tj < slot.size(); ++tj) src[size_t(slot[tj])] = int32_t(tj / k);
    auto x = randn(size_t(N) * C, 55), y = randn(size_t(N) * k * C, 56), w = randn(size_t(N) * k, 57);
    auto out = randn(size_t(N) * C, 58), dout = randn(size_t(N) * C, 59);
    std::vector<float> xs(y.size()), xs_e(y.size()), o = out, o_e = out, dy(y.size()), dy_e(y.size());
    std::vector<float> dw(w.size()), dw_e(w.size());
    be->gather_rows(xs.data(), x.data(), src.data(), N * k, C);
    be->moe_combine(o.data(), y.data(), slot.data(), w.data(), N, k, C);
    be->moe_combine_backward(dy.data(), dw.data(), dout.data(), y.data(), slot.data(), w.data(), N, k, C);
    launch(dim3(grid_for(xs.size())), dim3(kThreads), 0,
           [&] { gather_rows_kernel(xs_e.data(), x.data(), src.data(), N * k, C); });
    launch(dim3(grid_for(o.size())), dim3(kThreads), 0,
           [&] { moe_combine_kernel(o_e.data(), y.data(), slot.data(), w.data(), N, k, C); });
    launch(dim3(grid_for(w.size())), dim3(kThreads), 0, [&] {
        moe_combine_backward_kernel(dy_e.data(), dw_e.data(), dout.data(), y.data(), slot.data(), w.data(), N, k, C);
    });
    EXPECT_EQ(xs, xs_e);
    EXPECT_EQ(0, std::memcmp(o.data(), o_e.data(), o.size() * 4));
    EXPECT_EQ(0, std::memcmp(dy.data(), dy_e.data(), dy.size() * 4));
    EXPECT_LT(rel_err(dw_e, dw), kTol);  // the same sums in the same order
}

TEST(EmulatedKernels, SwigluAddScaleAdamw) {
    auto be = cpu();
    const int N = 7, F = 37;
    const size_t total = size_t(N) * F;
    auto gu = randn(size_t(N) * 2 * F, 30, 2.0f), dy = randn(total, 31);
    std::vector<float> out(total), dgu(gu.size(), 5.0f), out_e(total), dgu_e(gu.size(), 5.0f);
    be->swiglu_forward(out.data(), gu.data(), N, F);
    be->swiglu_backward(dgu.data(), dy.data(), gu.data(), N, F);
    launch(dim3(grid_for(total)), dim3(kThreads), 0,
           [&] { swiglu_forward_kernel(out_e.data(), gu.data(), N, F); });
    launch(dim3(grid_for(total)), dim3(kThreads), 0,
           [&] { swiglu_backward_kernel(dgu_e.data(), dy.data(), gu.data(), N, F); });
    EXPECT_LT(rel_err(out_e, out), kTol);
    EXPECT_LT(rel_err(dgu_e, dgu), kTol);

    auto a = randn(1001, 32), b = randn(1001, 33);
    auto a_e = a;
    be->add_inplace(a.data(), b.data(), a.size());
    be->scale(a.data(), a.size(), -0.37f);
    launch(dim3(grid_for(a.size())), dim3(kThreads), 0, [&] { add_kernel(a_e.data(), b.data(), a.size()); });
    launch(dim3(grid_for(a.size())), dim3(kThreads), 0, [&] { scale_kernel(a_e.data(), a.size(), -0.37f); });
    EXPECT_LT(rel_err(a_e, a), kTol);

    const size_t m = 3001;
    auto p = randn(m, 51);
    std::vector<float> mo(m, 0.0f), ve(m, 0.0f), p_e = p, mo_e = mo, ve_e = ve;
    for (int step = 1; step <= 3; ++step) {
        auto g = randn(m, 52 + step, 0.1f * step);
        const float b1 = 0.9f, b2 = 0.95f;
        const float bc1 = 1.0f - std::pow(b1, float(step)), bc2 = 1.0f - std::pow(b2, float(step));
        be->adamw(p.data(), g.data(), mo.data(), ve.data(), m, 1e-2f, b1, b2, 1e-8f, 0.1f, bc1, bc2);
        const AdamwScalars sc = adamw_scalars(1e-2f, b1, b2, 1e-8f, 0.1f, bc1, bc2);
        launch(dim3(grid_for(m)), dim3(kThreads), 0,
               [&] { adamw_kernel(p_e.data(), g.data(), mo_e.data(), ve_e.data(), m, sc); });
    }
    EXPECT_LT(rel_err(p_e, p), kTol);
    EXPECT_LT(rel_err(mo_e, mo), kTol);
    EXPECT_LT(rel_err(ve_e, ve), kTol);
}

TEST(EmulatedKernels, CrossEntropyFusedAndVocabParallel) {
    auto be = cpu();
    for (int V : {50, 1000}) {
        const int N = 9;
        auto logits = randn(size_t(N) * V, 40, 3.0f);
        std::mt19937 g(41);
        std::vector<int32_t> tgt(N);
        for (int n = 0; n < N; ++n) tgt[n] = (n % 4 == 3) ? -1 : int32_t(g() % uint32_t(V));
        const float gs = 1.0f / N;
        std::vector<float> l(N), l_e(N);
        be->xent_forward(l.data(), logits.data(), tgt.data(), N, V);
        launch(dim3(N), dim3(kXentThreads), 0,
               [&] { xent_forward_kernel(l_e.data(), logits.data(), tgt.data(), V); });
        EXPECT_LT(rel_err(l_e, l), kTol) << V;
        std::vector<float> z = logits, z_e = logits;
        be->xent_forward_backward(z.data(), l.data(), tgt.data(), N, V, gs);
        launch(dim3(N), dim3(kXentThreads), 0, [&] {
            xent_forward_backward_kernel(z_e.data(), l_e.data(), tgt.data(), V, gs);
        });
        EXPECT_LT(rel_err(l_e, l), kTol) << V;
        EXPECT_LT(rel_err(z_e, z), kTol) << V;
        std::vector<float> mx(N), sum(N), tl(N), stats(3 * size_t(N));
        be->xent_local_stats(mx.data(), sum.data(), tl.data(), logits.data(), tgt.data(), N, V);
        launch(dim3(N), dim3(kXentThreads), 0, [&] {
            xent_local_stats_kernel(stats.data(), logits.data(), tgt.data(), N, V);
        });
        EXPECT_LT(rel_err(std::vector<float>(stats.begin(), stats.begin() + N), mx), kTol) << V;
        EXPECT_LT(rel_err(std::vector<float>(stats.begin() + N, stats.begin() + 2 * N), sum), kTol) << V;
        EXPECT_LT(rel_err(std::vector<float>(stats.begin() + 2 * N, stats.end()), tl), kTol) << V;
        std::vector<float> z2 = logits, z2_e = logits, gstats(mx);
        gstats.insert(gstats.end(), sum.begin(), sum.end());
        be->xent_grad_from_stats(z2.data(), mx.data(), sum.data(), tgt.data(), N, V, gs);
        launch(dim3(N), dim3(kXentThreads), 0, [&] {
            xent_grad_from_stats_kernel(z2_e.data(), gstats.data(), tgt.data(), N, V, gs);
        });
        EXPECT_LT(rel_err(z2_e, z2), kTol) << V;
    }
}

TEST(EmulatedKernels, SumsqDeterministic) {
    auto be = cpu();
    const size_t n = 20011;
    auto x = randn(n, 50);
    const double ref = be->sumsq(x.data(), n);
    double results[2];
    for (double& r : results) {
        const int blocks = sumsq_blocks(n);
        std::vector<double> partial(static_cast<size_t>(kSumsqBlocks));
        launch(dim3(unsigned(blocks)), dim3(kThreads), 0,
               [&] { sumsq_partial_kernel(partial.data(), x.data(), n); });
        launch(dim3(1), dim3(kThreads), 0, [&] { sumsq_final_kernel(&r, partial.data(), blocks); });
    }
    EXPECT_NEAR(results[0], ref, 1e-10 * ref);
    EXPECT_EQ(0, std::memcmp(&results[0], &results[1], sizeof(double)));
}

}  // namespace
