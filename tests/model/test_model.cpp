// The whole model's gradient against central differences of its loss, RoPE/YaRN tables
// against the DESIGN formulas, and layout-invariant initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/rope.hpp"
#include "quintet/model/transformer.hpp"
#include "support/gradcheck.hpp"

using namespace quintet;

namespace {

struct Tiny {
    ModelConfig m;
    RopeConfig rope;
    InitConfig init;
    Tiny(bool tied, bool yarn) {
        m.vocab_size = 17;
        m.d_model = 16;
        m.n_layers = 2;
        m.n_heads = 4;
        m.n_kv_heads = 2;
        m.ffn_dim = 24;
        m.tie_embeddings = tied;
        if (yarn) {
            rope.scaling = "yarn";
            rope.factor = 4.0;
            rope.original_max_position = 4;
        }
        init.std = 0.3;  // large enough that every path carries gradient well above fp32 noise
    }
};

void check_model_gradient(bool tied, bool yarn) {
    Tiny c(tied, yarn);
    auto be = make_cpu_backend(1);
    ParamTable table = make_param_table(c.m);
    const int B = 2, T = 9, N = B * T;
    quintet::MpiCommunicator self(MPI_COMM_SELF);
    TensorParallel tp(self, false);
    ModelChunk model(*be, c.m, c.rope, table, stage_chunks(c.m.n_layers, 1, 1, 0, "")[0], tp, B, T);
    std::vector<float> params(table.total), grads(table.total, 0.0f);
    init_params(params.data(), table, c.m, c.init, 42, 0, table.total);
    std::mt19937 g(3);
    std::vector<int32_t> ids(N), tgt(N);
    for (int i = 0; i < N; ++i) {
        ids[i] = int32_t(g() % 17);
        tgt[i] = int32_t(g() % 17);
    }
    double l1 = model.forward_backward(params.data(), grads.data(), ids.data(), tgt.data(), 1.0f);
    auto f = [&] { return model.forward_loss(params.data(), ids.data(), tgt.data()); };
    EXPECT_NEAR(f(), l1, 1e-4 * std::abs(l1));
    // Every tensor, a few elements each.
    for (const auto& s : table.specs) {
        std::vector<float> x(params.begin() + s.offset, params.begin() + s.offset + s.numel());
        std::vector<float> an(grads.begin() + s.offset, grads.begin() + s.offset + s.numel());
        auto fx = [&] {
            std::copy(x.begin(), x.end(), params.begin() + s.offset);
            return f();
        };
        auto r = quintet::testing::gradcheck(x, an, fx, 1e-2f, 12, 5);
        std::copy(x.begin(), x.end(), params.begin() + s.offset);
        EXPECT_LT(r.rel(), 2e-2) << s.name << " max grad " << r.max_grad << " err " << r.max_abs_err;
        EXPECT_GT(r.max_grad, 1e-4) << s.name << " has no gradient";
    }
}

TEST(Model, GradientMatchesFiniteDifferences) { check_model_gradient(false, false); }
TEST(Model, GradientMatchesFiniteDifferencesTiedWithYarn) { check_model_gradient(true, true); }

TEST(Rope, YarnRampFollowsTheDesignFormula) {
    RopeConfig r;
    r.theta = 10000;
    r.scaling = "yarn";
    r.factor = 8;
    r.original_max_position = 4096;
    const int d = 128;
    auto inv = rope_inv_freq(r, d, 4096);
    // low = floor(128 ln(4096/(32*2pi)) / (2 ln 1e4)) = 20, high = ceil(128 ln(4096/(2pi)) / (2 ln 1e4)) = 46
    for (int i = 0; i < d / 2; ++i) {
        double base = std::pow(10000.0, -2.0 * i / d);
        double ramp = std::clamp((i - 20.0) / 26.0, 0.0, 1.0);
        EXPECT_NEAR(inv[i], base / 8 * ramp + base * (1 - ramp), 1e-15) << i;
    }
    EXPECT_DOUBLE_EQ(inv[3], std::pow(10000.0, -6.0 / d));   // high frequency: untouched
    EXPECT_NEAR(inv[60], std::pow(10000.0, -120.0 / d) / 8, 1e-18);  // low: interpolated
    EXPECT_NEAR(rope_mscale(r), 0.1 * std::log(8.0) + 1.0, 1e-15);
    RopeConfig plain;
    EXPECT_EQ(rope_mscale(plain), 1.0);
}

TEST(Init, EachElementIsAFunctionOfSeedNameAndIndexOnly) {
    Tiny c(false, false);
    c.init.scheme = "scaled";
    ParamTable t = make_param_table(c.m);
    std::vector<float> whole(t.total), pieces(t.total, -7.0f);
    init_params(whole.data(), t, c.m, c.init, 9, 0, t.total);
    // Made in three arbitrary slices (as three ranks would): identical bits.
    size_t a = t.total / 3, b = 2 * t.total / 3 + 5;
    init_params(pieces.data(), t, c.m, c.init, 9, 0, a);
    init_params(pieces.data(), t, c.m, c.init, 9, a, b);
    init_params(pieces.data(), t, c.m, c.init, 9, b, t.total);
    EXPECT_EQ(0, std::memcmp(whole.data(), pieces.data(), t.total * 4));
    // Norm weights are one; scaled out-projections have std init.std/sqrt(2L).
    EXPECT_EQ(whole[t.find("model.norm.weight")->offset], 1.0f);
    auto stdev = [&](const std::string& name) {
        const auto& s = *t.find(name);
        double ss = 0;
        for (size_t i = 0; i < s.numel(); ++i) ss += double(whole[s.offset + i]) * whole[s.offset + i];
        return std::sqrt(ss / s.numel());
    };
    EXPECT_NEAR(stdev("model.layers.0.mlp.down_proj.weight"), 0.3 / std::sqrt(4.0), 0.03);
    EXPECT_NEAR(stdev("model.layers.0.mlp.up_proj.weight"), 0.3, 0.03);
    // A different seed gives different values.
    std::vector<float> other(t.total);
    init_params(other.data(), t, c.m, c.init, 10, 0, t.total);
    EXPECT_NE(0, std::memcmp(whole.data(), other.data(), t.total * 4));
}

TEST(Params, CountsMatmulParametersForSixNP) {
    Tiny c(false, false);
    ParamTable t = make_param_table(c.m);
    // per layer: q 16x16, k 8x16, v 8x16, o 16x16, gate/up 24x16, down 16x24; head 17x16
    size_t layer = 256 + 128 + 128 + 256 + 3 * 384;
    EXPECT_EQ(t.matmul_params, 2 * layer + 17 * 16);
    c.m.tie_embeddings = true;
    ParamTable tt = make_param_table(c.m);
    EXPECT_EQ(tt.matmul_params, t.matmul_params);  // the tied head still multiplies every token
    EXPECT_EQ(tt.total + 17 * 16, t.total);
}

}  // namespace
