// The MoE block's stages on their own, without MPI or a model: the router (top-k with ties to
// the lower expert, the balance term against its formula, the aux-free sign rule) and the token
// dispatcher's counting sort (stable, capacity drops of the lightest choices). The whole block
// is checked by finite differences in test_model and across layouts in test_expert_parallel.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/moe_dispatch.hpp"
#include "quintet/model/moe_router.hpp"

using namespace quintet;

namespace {

struct Stage {
    std::unique_ptr<Backend> be = make_cpu_backend(1);
    MoeConfig moe;
    int rows;
    float *logits = nullptr, *probs = nullptr, *weight = nullptr;
    int32_t *expert = nullptr, *slot = nullptr, *src = nullptr;
    MoeRouting r;
    Stage(int E, int k, int n, double capacity = 0) : rows(n) {
        moe.experts = E, moe.top_k = k, moe.capacity_factor = capacity, moe.norm_topk = true;
        logits = be->alloc(size_t(n) * E), probs = be->alloc(size_t(n) * E), weight = be->alloc(size_t(n) * k);
        expert = be->alloc_i32(size_t(n) * k), slot = be->alloc_i32(size_t(n) * k), src = be->alloc_i32(size_t(n) * k);
        r.probs = probs, r.expert = expert, r.weight = weight, r.slot = slot, r.src = src;
    }
    ~Stage() {
        for (float* p : {logits, probs, weight}) be->release(p);
        for (int32_t* p : {expert, slot, src}) be->release_i32(p);
    }
    std::vector<int32_t> ints(const int32_t* p, size_t n) {
        std::vector<int32_t> v(n);
        be->to_host_i32(v.data(), p, n);
        return v;
    }
    std::vector<float> floats(const float* p, size_t n) {
        std::vector<float> v(n);
        be->to_host(v.data(), p, n);
        return v;
    }
};

TEST(MoeRouter, TopKTiesGoToTheLowerExpertAndWeightsRenormalise) {
    Stage st(4, 2, 2);
    // Row 0: experts 1 and 3 tie for the top; row 1: a clear order 2 > 0 > others.
    const std::vector<float> z = {0.f, 2.f, 1.f, 2.f, 1.5f, -1.f, 3.f, 0.f};
    st.be->from_host(st.logits, z.data(), z.size());
    MoeRouter router(*st.be, st.moe, st.rows);
    router.init(st.r);
    router.route(st.r, st.logits, nullptr);
    EXPECT_EQ(st.ints(st.expert, 4), (std::vector<int32_t>{1, 3, 2, 0}));
    const auto w = st.floats(st.weight, 4);
    EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);  // norm_topk
    EXPECT_NEAR(w[0], 0.5, 1e-6);
    const auto p = st.floats(st.probs, 8);
    EXPECT_NEAR(std::accumulate(p.begin(), p.begin() + 4, 0.0), 1.0, 1e-6);
    // The bias chooses (it makes expert 0 win row 0) but never weights.
    const std::vector<float> bias = {5.f, 0.f, 0.f, 0.f};
    float* b = st.be->alloc(4);
    st.be->from_host(b, bias.data(), 4);
    router.route(st.r, st.logits, b);
    EXPECT_EQ(st.ints(st.expert, 2)[0], 0);
    st.be->release(b);
}

TEST(MoeRouter, BalanceTermIsESumFP) {
    Stage st(4, 1, 4);
    MoeRouter router(*st.be, st.moe, st.rows);
    // Summed statistics of 8 rows: choices per expert, probability sums, rows.
    const std::vector<float> stats = {4, 2, 2, 0, 3.0f, 2.0f, 2.0f, 1.0f, 8};
    std::vector<float> daux(4);
    const double aux = router.balance_loss(stats.data(), 0.5, daux.data());
    double want = 0;
    for (int e = 0; e < 4; ++e) want += 4.0 * (stats[size_t(e)] / 8.0) * (stats[size_t(4 + e)] / 8.0);
    EXPECT_NEAR(aux, want, 1e-12);
    EXPECT_NEAR(daux[0], 0.5 * 4 * (4.0 / 8) / 8, 1e-7);
    EXPECT_EQ(daux[3], 0.f);  // an expert no row chose gets no gradient
}

TEST(MoeRouter, AuxFreeBiasMovesByTheSignOfTheLoadGap) {
    std::vector<float> bias = {0, 0, 0, 0};
    const double load[4] = {10, 2, 2, 2};  // mean 4
    MoeRouter::update_bias(bias.data(), load, 4, 0.01);
    EXPECT_FLOAT_EQ(bias[0], -0.01f);
    EXPECT_FLOAT_EQ(bias[1], 0.01f);
    const double even[4] = {3, 3, 3, 3};
    MoeRouter::update_bias(bias.data(), even, 4, 0.01);
    EXPECT_FLOAT_EQ(bias[0], -0.01f);  // no gap: no move
    // proportional: the move is rate x the relative gap (mean - load) / mean.
    std::vector<float> p = {0, 0, 0, 0};
    MoeRouter::update_bias(p.data(), load, 4, 0.01, /*proportional=*/true);
    EXPECT_FLOAT_EQ(p[0], float(0.01 * (4.0 - 10.0) / 4.0));
    EXPECT_FLOAT_EQ(p[1], float(0.01 * (4.0 - 2.0) / 4.0));
}

TEST(MoeDispatcher, CountingSortIsStableAndDropsTheLightestOverCapacity) {
    // 4 rows, k = 1, 2 experts; every row picks expert 0, with weights 0.9 0.6 0.9 0.7.
    Stage st(2, 1, 4, /*capacity=*/1.0);  // cap = ceil(1 * 1 * 4 / 2) = 2
    const std::vector<int32_t> e = {0, 0, 0, 0};
    const std::vector<float> w = {0.9f, 0.6f, 0.9f, 0.7f};
    st.be->from_host_i32(st.expert, e.data(), 4);
    st.be->from_host(st.weight, w.data(), 4);
    MoeDispatcher d(*st.be, nullptr, st.moe, st.rows, 8);
    MoeRouter(*st.be, st.moe, st.rows).init(st.r);
    d.plan(st.r);
    EXPECT_EQ(st.r.routed, (std::vector<int>{4, 0}));
    EXPECT_EQ(st.r.count, (std::vector<int>{2, 0}));
    EXPECT_EQ(st.r.kept, 2);
    EXPECT_EQ(st.r.dropped, 2);
    // Kept: the two heaviest (rows 0 and 2, in token order); the others go to the zero row R.
    EXPECT_EQ(st.ints(st.slot, 4), (std::vector<int32_t>{0, 4, 1, 4}));
    EXPECT_EQ(st.ints(st.src, 2), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(MoeDispatcher::expert_rows(st.moe, 4, 1), 4);
    st.moe.experts = 8, st.moe.top_k = 2;
    EXPECT_EQ(MoeDispatcher::expert_rows(st.moe, 4, 2), 2 * 4 * 2);  // the dropless worst case
}

}  // namespace
