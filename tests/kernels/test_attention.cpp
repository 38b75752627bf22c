// The CPU backend's one general attention operation (docs/math.md §5.3) and RoPE: against a naive
// double-precision attention for queries and keys of different lengths and positions, mixed
// q.k / v head dims, GQA, document masks, rows that see no key; the log-sum-exp merge of two
// key blocks against the whole; the accumulating backward against finite differences and
// against the whole over split key blocks; the backward's work split over threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/rope.hpp"
#include "support/attention_ref.hpp"
#include "support/gradcheck.hpp"

using namespace quintet;
using quintet::testing::AttnProblem;
using quintet::testing::attention_reference;
using quintet::testing::dot;
using quintet::testing::gradcheck;
using quintet::testing::make_problem;
using quintet::testing::randn;

namespace {

struct Case {
    const char* what;
    int B, Tq, Tk, NH, NKV, Dqk, Dv, q0, k0;
    bool causal;
    int doc_len;
};

// Across 64-row tiles, Tq != Tk at offsets, mixed head dims, MQA, non-causal, documents, rows
// that see nothing.
const Case kCases[] = {
    {"square causal GQA, three tiles", 2, 150, 150, 4, 2, 16, 16, 0, 0, true, 0},
    {"suffix queries over a longer key range", 1, 40, 130, 2, 1, 8, 8, 90, 0, true, 0},
    {"mixed head dims, MQA", 2, 70, 70, 4, 1, 24, 16, 0, 0, true, 0},
    {"not causal, Tq != Tk", 1, 33, 65, 2, 2, 8, 12, 0, 0, false, 0},
    {"documents of 23 tokens", 2, 100, 100, 2, 1, 8, 8, 0, 0, true, 23},
    {"documents, keys ahead of queries", 1, 50, 80, 2, 2, 8, 4, 30, 0, true, 17},
    {"first rows see no key", 1, 40, 30, 2, 1, 8, 8, 20, 30, true, 0},
    {"no row sees a key", 1, 20, 30, 2, 1, 8, 8, 0, 50, true, 0},
    // One query row (a decoder step: the path without key tiles).
    {"one query row over 150 keys, GQA", 1, 1, 150, 4, 2, 16, 16, 149, 0, true, 0},
    {"one query row a sequence, documents, mixed dims", 2, 1, 70, 4, 1, 24, 16, 60, 0, true, 23},
    {"one query row, not causal", 1, 1, 65, 2, 2, 8, 12, 0, 0, false, 0},
    {"one query row that sees no key", 1, 1, 30, 2, 1, 8, 8, 0, 50, true, 0},
    // MLA's latent cache: every head over one shared row (a group's heads split among threads).
    {"one query row, 8 heads over one kv head, mixed dims", 1, 1, 90, 8, 1, 40, 32, 89, 0, true, 0},
    {"one query row a sequence, 7 heads over one kv head", 3, 1, 40, 7, 1, 16, 8, 39, 0, true, 0},
};

TEST(Attention, ForwardMatchesNaiveDouble) {
    for (int threads : {1, 2, 3}) {
        auto be = make_cpu_backend(threads);
        for (const Case& c : kCases) {
            AttnProblem p = make_problem(c.B, c.Tq, c.Tk, c.NH, c.NKV, c.Dqk, c.Dv, c.q0, c.k0,
                                         c.causal, c.doc_len, 10);
            std::vector<float> out(p.out_size(), 9.0f), lse(p.lse_size());
            be->attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), p.a);
            std::vector<double> ro, rl;
            attention_reference(p, ro, rl);
            EXPECT_LT(quintet::testing::out_rel_err(p, out, ro), 2e-6) << c.what << " threads=" << threads;
            EXPECT_LT(quintet::testing::lse_err(lse, rl), 2e-5) << c.what << " threads=" << threads;
        }
    }
}

// Rows [s0, s1) of the keys of every sequence, as a problem of their own (same queries).
AttnProblem key_block(const AttnProblem& p, int s0, int s1) {
    AttnProblem b = p;
    const AttentionArgs& a = p.a;
    b.a.Tk = s1 - s0;
    b.k.clear(), b.v.clear(), b.kpos.clear(), b.kdoc.clear();
    for (int bb = 0; bb < a.B; ++bb)
        for (int s = s0; s < s1; ++s) {
            const size_t r = size_t(bb) * a.Tk + s;
            b.k.insert(b.k.end(), p.k.begin() + long(r * a.k_stride), p.k.begin() + long((r + 1) * a.k_stride));
            b.v.insert(b.v.end(), p.v.begin() + long(r * a.v_stride), p.v.begin() + long((r + 1) * a.v_stride));
            b.kpos.push_back(p.kpos[r]);
            if (!p.kdoc.empty()) b.kdoc.push_back(p.kdoc[r]);
        }
    b.bind();
    return b;
}

TEST(Attention, TwoKeyBlocksMergedEqualTheWhole) {
    auto be = make_cpu_backend(2);
    for (const Case& c : kCases) {
        if (c.Tk < 4) continue;
        AttnProblem p = make_problem(c.B, c.Tq, c.Tk, c.NH, c.NKV, c.Dqk, c.Dv, c.q0, c.k0,
                                     c.causal, c.doc_len, 20);
        std::vector<float> out(p.out_size()), lse(p.lse_size());
        be->attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), p.a);
        const int cut = c.Tk * 3 / 7;  // not on a tile boundary
        AttnProblem lo = key_block(p, 0, cut), hi = key_block(p, cut, c.Tk);
        std::vector<float> o1(p.out_size()), l1(p.lse_size()), o2(p.out_size()), l2(p.lse_size());
        be->attention_forward(o1.data(), l1.data(), lo.q.data(), lo.k.data(), lo.v.data(), lo.a);
        be->attention_forward(o2.data(), l2.data(), hi.q.data(), hi.k.data(), hi.v.data(), hi.a);
        // Merge in either order.
        std::vector<float> oa = o1, la = l1, ob = o2, lb = l2;
        be->attention_merge(oa.data(), la.data(), o2.data(), l2.data(), p.a);
        be->attention_merge(ob.data(), lb.data(), o1.data(), l1.data(), p.a);
        std::vector<double> ro(out.begin(), out.end()), rl(lse.begin(), lse.end());
        EXPECT_LT(quintet::testing::out_rel_err(p, oa, ro), 1e-6) << c.what;
        EXPECT_LT(quintet::testing::out_rel_err(p, ob, ro), 1e-6) << c.what;
        EXPECT_LT(quintet::testing::lse_err(la, rl), 1e-5) << c.what;
        EXPECT_LT(quintet::testing::lse_err(lb, rl), 1e-5) << c.what;
    }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
    auto be = make_cpu_backend(1);
    const Case small[] = {
        {"mixed dims, offsets, GQA", 1, 20, 30, 4, 2, 6, 4, 10, 0, true, 0},
        {"documents", 2, 24, 24, 2, 1, 6, 6, 0, 0, true, 7},
        {"not causal", 1, 9, 13, 2, 2, 4, 6, 0, 0, false, 0},
        {"first rows see no key", 1, 12, 10, 2, 1, 4, 4, 5, 10, true, 0},
    };
    for (const Case& c : small) {
        AttnProblem p = make_problem(c.B, c.Tq, c.Tk, c.NH, c.NKV, c.Dqk, c.Dv, c.q0, c.k0,
                                     c.causal, c.doc_len, 30, 0);
        auto R = randn(p.out_size(), 33);
        std::vector<float> out(p.out_size()), lse(p.lse_size());
        auto f = [&] {
            be->attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), p.a);
            return dot(out, R);
        };
        f();
        std::vector<float> dq(p.q.size()), dk(p.k.size()), dv(p.v.size());
        be->attention_backward(dq.data(), dk.data(), dv.data(), R.data(), out.data(), lse.data(),
                               p.q.data(), p.k.data(), p.v.data(), p.a);
        EXPECT_LT(gradcheck(p.q, dq, f, 1e-2f, 120).rel(), 1e-2) << c.what;
        EXPECT_LT(gradcheck(p.k, dk, f, 1e-2f, 120).rel(), 1e-2) << c.what;
        EXPECT_LT(gradcheck(p.v, dv, f, 1e-2f, 120).rel(), 1e-2) << c.what;
        double g = 0;
        for (float x : dq) g = std::max(g, double(std::abs(x)));
        EXPECT_GT(g, 1e-3) << c.what;
        // It accumulates: a second call adds the same again (out, lse of the unperturbed inputs).
        f();
        std::vector<float> dq2 = dq, dk2 = dk, dv2 = dv;
        be->attention_backward(dq2.data(), dk2.data(), dv2.data(), R.data(), out.data(), lse.data(),
                               p.q.data(), p.k.data(), p.v.data(), p.a);
        for (size_t i = 0; i < dq.size(); ++i) ASSERT_NEAR(dq2[i], 2 * dq[i], 1e-5 * std::max(1.0, std::abs(double(dq[i])))) << c.what;
        for (size_t i = 0; i < dk.size(); ++i) ASSERT_NEAR(dk2[i], 2 * dk[i], 1e-5 * std::max(1.0, std::abs(double(dk[i])))) << c.what;
        for (size_t i = 0; i < dv.size(); ++i) ASSERT_NEAR(dv2[i], 2 * dv[i], 1e-5 * std::max(1.0, std::abs(double(dv[i])))) << c.what;
    }
}

// Ring attention's backward: each key block from the final out and lse; dq summed over blocks.
TEST(Attention, BackwardOverKeyBlocksSumsToTheWhole) {
    auto be = make_cpu_backend(2);
    AttnProblem p = make_problem(2, 90, 140, 4, 2, 12, 8, 50, 0, true, 31, 40);
    auto R = randn(p.out_size(), 41);
    std::vector<float> out(p.out_size()), lse(p.lse_size());
    be->attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), p.a);
    std::vector<float> dq(p.q.size()), dk(p.k.size()), dv(p.v.size());
    be->attention_backward(dq.data(), dk.data(), dv.data(), R.data(), out.data(), lse.data(),
                           p.q.data(), p.k.data(), p.v.data(), p.a);
    const int cut = 57;
    AttnProblem lo = key_block(p, 0, cut), hi = key_block(p, cut, p.a.Tk);
    std::vector<float> dqb(p.q.size(), 0.0f), dk1(lo.k.size()), dv1(lo.v.size()), dk2(hi.k.size()),
        dv2(hi.v.size());
    be->attention_backward(dqb.data(), dk1.data(), dv1.data(), R.data(), out.data(), lse.data(),
                           lo.q.data(), lo.k.data(), lo.v.data(), lo.a);
    be->attention_backward(dqb.data(), dk2.data(), dv2.data(), R.data(), out.data(), lse.data(),
                           hi.q.data(), hi.k.data(), hi.v.data(), hi.a);
    double e = 0, m = 0;
    for (size_t i = 0; i < dq.size(); ++i) {
        e = std::max(e, double(std::abs(dq[i] - dqb[i])));
        m = std::max(m, double(std::abs(dq[i])));
    }
    EXPECT_LT(e, 1e-5 * m);
    AttnProblem whole_lo = key_block(p, 0, cut);
    for (int b = 0; b < p.a.B; ++b)
        for (int s = 0; s < p.a.Tk; ++s) {
            const bool first = s < cut;
            const size_t wr = size_t(b) * p.a.Tk + s;
            const size_t br = size_t(b) * (first ? cut : p.a.Tk - cut) + (first ? s : s - cut);
            const auto& bk = first ? dk1 : dk2;
            const auto& bv = first ? dv1 : dv2;
            for (int c = 0; c < p.a.NKV * p.a.Dqk; ++c)
                ASSERT_NEAR(bk[br * p.a.k_stride + c], dk[wr * p.a.k_stride + c], 1e-5 * m) << b << " " << s;
            for (int c = 0; c < p.a.NKV * p.a.Dv; ++c)
                ASSERT_NEAR(bv[br * p.a.v_stride + c], dv[wr * p.a.v_stride + c], 1e-5 * m) << b << " " << s;
        }
}

// One sequence and one kv head (a single (batch, kv head) pair): the backward still splits over
// (head, query tile) tasks and every thread count gives the same gradients, bit for bit per
// thread count.
TEST(Attention, BackwardSplitsOverThreadsDeterministically) {
    AttnProblem p = make_problem(1, 200, 200, 4, 1, 16, 16, 0, 0, true, 0, 50);  // 1 pair
    auto R = randn(p.out_size(), 51);
    std::vector<float> out(p.out_size()), lse(p.lse_size());
    make_cpu_backend(1)->attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), p.a);
    auto grads = [&](int threads) {
        auto be = make_cpu_backend(threads);
        std::vector<float> g(p.q.size() + p.k.size() + p.v.size(), 0.0f);
        float* dq = g.data();
        float* dk = dq + p.q.size();
        float* dv = dk + p.k.size();
        be->attention_backward(dq, dk, dv, R.data(), out.data(), lse.data(), p.q.data(), p.k.data(),
                               p.v.data(), p.a);
        return g;
    };
    auto g1 = grads(1);
    double m = 0;
    for (float x : g1) m = std::max(m, double(std::abs(x)));
    for (int threads : {2, 3, 8}) {
        auto a = grads(threads), b = grads(threads);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << threads;
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], g1[i], 1e-5 * m) << threads << " " << i;
    }
}

// With as many (batch, kv head) pairs as threads (or many more), one task per pair: every thread
// count gives the bits of one thread.
TEST(Attention, BackwardOverPairsIsBitIdenticalForAnyThreadCount) {
    AttnProblem p = make_problem(2, 150, 150, 4, 2, 16, 16, 0, 0, true, 0, 60);  // 4 pairs
    auto R = randn(p.out_size(), 61);
    std::vector<float> out(p.out_size()), lse(p.lse_size());
    make_cpu_backend(1)->attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), p.a);
    auto grads = [&](int threads) {
        auto be = make_cpu_backend(threads);
        std::vector<float> g(p.q.size() + p.k.size() + p.v.size(), 0.0f);
        float* dq = g.data();
        float* dk = dq + p.q.size();
        float* dv = dk + p.k.size();
        be->attention_backward(dq, dk, dv, R.data(), out.data(), lse.data(), p.q.data(), p.k.data(),
                               p.v.data(), p.a);
        return g;
    };
    auto g1 = grads(1);
    for (int threads : {2, 4}) {
        auto g = grads(threads);
        EXPECT_EQ(0, std::memcmp(g.data(), g1.data(), g.size() * 4)) << threads;
    }
}

// RoPE on a sub-range of each head's columns, at explicit positions.
TEST(Rope, SubRangeAtPositionsIsARotationWithATransposeBackward) {
    auto b = make_cpu_backend(1);
    const int N = 7, heads = 3, head_stride = 11, col0 = 4, dim = 6, row_stride = heads * head_stride + 2;
    RopeConfig rc;
    std::vector<float> cs, sn;
    const int P = 200;
    rope_tables(cs, sn, P, rope_inv_freq(rc, dim, P), 1.0);
    std::vector<int32_t> pos = {0, 5, 199, 3, 3, 100, 42};
    RopeArgs a{N, heads, head_stride, col0, dim, row_stride};
    auto x = randn(size_t(N) * row_stride, 6), R = randn(size_t(N) * row_stride, 7);
    std::vector<float> y = x;
    b->rope_forward(y.data(), cs.data(), sn.data(), pos.data(), a);
    // Columns outside [col0, col0 + dim) of every head are untouched; the norm of each rotated
    // pair is kept.
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < row_stride; ++c) {
            const int h = c / head_stride, in = c % head_stride;
            if (h >= heads || in < col0 || in >= col0 + dim)
                ASSERT_EQ(y[size_t(n) * row_stride + c], x[size_t(n) * row_stride + c]) << n << " " << c;
        }
    for (int n = 0; n < N; ++n)
        for (int h = 0; h < heads; ++h)
            for (int i = 0; i < dim / 2; ++i) {
                const size_t o = size_t(n) * row_stride + h * head_stride + col0;
                const double before = std::hypot(x[o + i], x[o + i + dim / 2]);
                const double after = std::hypot(y[o + i], y[o + i + dim / 2]);
                ASSERT_NEAR(before, after, 1e-5);
            }
    auto f = [&] {
        std::vector<float> z = x;
        b->rope_forward(z.data(), cs.data(), sn.data(), pos.data(), a);
        return dot(z, R);
    };
    std::vector<float> dx = R;
    b->rope_backward(dx.data(), cs.data(), sn.data(), pos.data(), a);
    EXPECT_LT(gradcheck(x, dx, f, 1e-2f, 200).rel(), 1e-3);
    // <R(m) q, R(n) k> depends on m - n only.
    RopeArgs one{1, 1, dim, 0, dim, dim};
    std::vector<float> q = randn(dim, 8), k = randn(dim, 9);
    auto rotdot = [&](int m, int n) {
        std::vector<float> qq = q, kk = k;
        int32_t pm = m, pn = n;
        b->rope_forward(qq.data(), cs.data(), sn.data(), &pm, one);
        b->rope_forward(kk.data(), cs.data(), sn.data(), &pn, one);
        return dot(qq, kk);
    };
    EXPECT_NEAR(rotdot(150, 147), rotdot(7, 4), 1e-4);
    EXPECT_NEAR(rotdot(3, 3), dot(q, k), 1e-5);
}

}  // namespace
