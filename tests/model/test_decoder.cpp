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

// attention: mha, or mla with the latent cache (kv_b absorbed) or the full per-head K|V cache.
void check(bool yarn, bool tied, const std::string& attention = "mha", bool full_kv = false) {
    ModelConfig m;
    m.vocab_size = 23;
    m.d_model = 24;
    m.n_layers = 2;
    m.n_heads = 4;
    m.n_kv_heads = 2;
    m.ffn_dim = 40;
    m.tie_embeddings = tied;
    if (attention == "mla") {
        m.attention = "mla";
        m.n_kv_heads = 0;
        m.kv_lora_rank = 10;
        m.q_lora_rank = 12;
        m.qk_nope_dim = 6;
        m.qk_rope_dim = 4;
        m.v_head_dim = 8;
    }
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
    ModelChunk full(*be, m, rope, table, stage_chunks(m.n_layers, 1, 1, 0, {})[0], tp, 1, T);
    double expect = full.forward_loss(params.data(), ids.data(), tgt.data());
    Decoder dec(*be, m, rope, T, table, params, T, full_kv);
    // Bytes cached per token: MLA's latent [c_kv | k_rope] per layer, or K|V of every kv head.
    const size_t per_layer = attention == "mla" ? (full_kv ? size_t(4 * (6 + 4) + 4 * 8) : size_t(10 + 4))
                                                : size_t(2 * 2 * (24 / 4));
    EXPECT_EQ(dec.cache_bytes_per_token(), per_layer * 2 * sizeof(float));
    double got = 0;
    for (int t = 0; t < T; ++t) {
        const auto& z = dec.step(ids[t], t);
        double mx = *std::max_element(z.begin(), z.end()), s = 0;
        for (float x : z) s += std::exp(double(x) - mx);
        got += std::log(s) + mx - z[tgt[t]];
    }
    EXPECT_NEAR(got, expect, 1e-4 * std::abs(expect));
    // Greedy decoding from a prompt gives the tokens of the uncached full forward over the
    // growing prefix.
    Decoder greedy(*be, m, rope, T, table, params, T, full_kv);
    std::vector<int32_t> seq(ids.begin(), ids.begin() + 4);
    const std::vector<float>* z = nullptr;
    for (int t = 0; t < 4; ++t) z = &greedy.step(seq[size_t(t)], t);
    for (int t = 4; t < T; ++t) {
        const int next = int(std::max_element(z->begin(), z->end()) - z->begin());
        // The uncached forward over the whole prefix at once (per-head K|V as in training): its
        // last row's argmax.
        Decoder pre(*be, m, rope, t, table, params, t, true);
        const std::vector<float>& logits = pre.prefill(seq.data(), t);
        const int want = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
        ASSERT_EQ(next, want) << "position " << t;
        seq.push_back(next);
        z = &greedy.step(next, t);
    }
}

// prefill (the prompt in one forward) leaves the caches and logits that steps would, and steps
// continue from it.
void check_prefill(const std::string& attention, bool full_kv) {
    ModelConfig m;
    m.vocab_size = 23;
    m.d_model = 24;
    m.n_layers = 2;
    m.n_heads = 4;
    m.n_kv_heads = 2;
    m.ffn_dim = 40;
    if (attention == "mla") {
        m.attention = "mla";
        m.n_kv_heads = 0;
        m.kv_lora_rank = 6;
        m.qk_nope_dim = 4;
        m.qk_rope_dim = 4;
        m.v_head_dim = 8;
    }
    RopeConfig rope;
    const int T = 12, P = 7;
    auto be = make_cpu_backend(1);
    InitConfig init;
    init.std = 0.2;
    ParamTable table = make_param_table(m);
    std::vector<float> params(table.total);
    init_params(params.data(), table, m, init, 5, 0, table.total);
    std::vector<int32_t> ids(T);
    for (int t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7 + 3) % m.vocab_size);
    Decoder a(*be, m, rope, T, table, params, T, full_kv), b(*be, m, rope, T, table, params, T, full_kv);
    std::vector<float> za, zb;
    for (int t = 0; t < P; ++t) za = a.step(ids[size_t(t)], t);
    zb = b.prefill(ids.data(), P);
    for (int t = P; t <= T; ++t) {
        ASSERT_EQ(za.size(), zb.size());
        for (size_t v = 0; v < za.size(); ++v) EXPECT_NEAR(za[v], zb[v], 1e-4) << attention << " position " << t;
        if (t == T) break;
        za = a.step(ids[size_t(t)], t);
        zb = b.step(ids[size_t(t)], t);
    }
}

TEST(Decoder, PrefillEqualsSteps) { check_prefill("mha", false); }
TEST(Decoder, PrefillEqualsStepsMlaLatent) { check_prefill("mla", false); }
TEST(Decoder, PrefillEqualsStepsMlaFull) { check_prefill("mla", true); }

TEST(Decoder, KvCacheMatchesTheFullForward) { check(false, false); }
TEST(Decoder, KvCacheMatchesTheFullForwardWithYarnAndTiedHead) { check(true, true); }
TEST(Decoder, MlaLatentCacheMatchesTheFullForward) { check(false, false, "mla"); }
TEST(Decoder, MlaLatentCacheMatchesTheFullForwardWithYarn) { check(true, true, "mla"); }
TEST(Decoder, MlaFullCacheMatchesTheFullForward) { check(true, false, "mla", true); }

}  // namespace
