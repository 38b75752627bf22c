// The KV-cache decoder of `quintet generate` against the training forward: feeding a sequence
// token by token must give the same next-token log-likelihoods as one full causal forward.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <random>
#include <algorithm>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/model/decoder.hpp"
#include "quintet/model/transformer.hpp"

using namespace quintet;

namespace {

void check(bool yarn, bool tied) {
    ModelConfig m;
    m.vocab_size = 23;
    m.d_model = 24;
    m.n_layers = 2;
    m.n_heads = 4;
    m.n_kv_heads = 2;
    m.ffn_dim = 40;
    m.tie_embeddings = tied;
    RopeConfig rope;
    if (yarn) {
        rope.scaling = "yarn";
        rope.factor = 4;
        rope.original_max_position = 8;
    }
    InitConfig init;
    init.std = 0.2;
    const int T = 20;
    ParamTable table = make_param_table(m);
    std::vector<float> params(table.total);
    init_params(params.data(), table, m, init, 5, 0, table.total);
    std::mt19937 g(1);
    std::vector<int32_t> ids(T), tgt(T);
    for (int t = 0; t < T; ++t) ids[t] = int32_t(g() % 23);
    for (int t = 0; t < T; ++t) tgt[t] = t + 1 < T ? ids[t + 1] : 0;
    auto be = make_cpu_backend(1);
    MpiCommunicator self(MPI_COMM_SELF);
    TensorParallel tp(self, false);
    ModelChunk full(*be, m, rope, table, stage_chunks(m.n_layers, 1, 1, 0, "")[0], tp, 1, T);
    double expect = full.forward_loss(params.data(), ids.data(), tgt.data());
    Decoder dec(*be, m, rope, T, table, params, T);
    double got = 0;
    for (int t = 0; t < T; ++t) {
        const auto& z = dec.step(ids[t], t);
        double mx = *std::max_element(z.begin(), z.end()), s = 0;
        for (float x : z) s += std::exp(double(x) - mx);
        got += std::log(s) + mx - z[tgt[t]];
    }
    EXPECT_NEAR(got, expect, 1e-4 * std::abs(expect));
}

TEST(Decoder, KvCacheMatchesTheFullForward) { check(false, false); }
TEST(Decoder, KvCacheMatchesTheFullForwardWithYarnAndTiedHead) { check(true, true); }

}  // namespace
