// The KV-cache decoder of `quintet generate` against the training forward: feeding a sequence
// token by token must give the same next-token log-likelihoods as one full causal forward.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <random>
#include <algorithm>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/model/decoder.hpp"
#include "quintet/model/speculative.hpp"
#include "quintet/model/transformer.hpp"

using namespace quintet;

namespace {

// The model's weights in `table`'s layout, drawn at standard deviation `std` from `seed`.
std::vector<float> weights(const ModelConfig& m, const ParamTable& table, double std, uint64_t seed) {
    InitConfig init;
    init.std = std;
    std::vector<float> params(table.total);
    init_params(params.data(), table, m, init, seed, 0, table.total);
    return params;
}

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
    const int T = 20;
    ParamTable table = make_param_table(m);
    const std::vector<float> params = weights(m, table, 0.2, 5);
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
    ParamTable table = make_param_table(m);
    const std::vector<float> params = weights(m, table, 0.2, 5);
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

// Speculative decoding's two parts: truncating the caches forgets tokens as if they had never
// been fed (a rejected draft), and MTP drafting + verification gives plain greedy decoding's tokens.
ModelConfig mtp_model(const std::string& attention, int depth, bool moe = false) {
    ModelConfig m;
    m.vocab_size = 23;
    m.d_model = 24;
    m.n_layers = 2;
    m.n_heads = 4;
    m.n_kv_heads = 2;
    m.ffn_dim = 40;
    m.mtp_depth = depth;
    if (attention == "mla") {
        m.attention = "mla";
        m.n_kv_heads = 0;
        m.kv_lora_rank = 6;
        m.qk_nope_dim = 4;
        m.qk_rope_dim = 4;
        m.v_head_dim = 8;
    }
    if (moe) {  // every layer, the MTP modules' too; a capacity that a many-row forward could exceed
        m.moe.experts = 4;
        m.moe.top_k = 2;
        m.moe.ffn_dim = 16;
        m.moe.capacity_factor = 1.0;
        EXPECT_TRUE(m.moe.layers.parse("all"));
    }
    return m;
}

void check_truncate(const std::string& attention, bool full_kv) {
    const ModelConfig m = mtp_model(attention, 1);
    RopeConfig rope;
    const int T = 16;
    auto be = make_cpu_backend(1);
    ParamTable table = make_param_table(m);
    const std::vector<float> params = weights(m, table, 0.2, 5);
    const std::vector<int32_t> kept{3, 9, 1, 4}, wrong{7, 7, 2}, right{5, 11};
    Decoder a(*be, m, rope, T, table, params, T, full_kv), b(*be, m, rope, T, table, params, T, full_kv);
    a.forward(kept.data(), 4, 0);
    a.forward(wrong.data(), 3, 4);
    EXPECT_EQ(a.cached(), 7);
    a.truncate(4);
    const std::vector<float> za = a.forward(right.data(), 2, 4);
    b.forward(kept.data(), 4, 0);
    const std::vector<float> zb = b.forward(right.data(), 2, 4);
    ASSERT_EQ(za.size(), zb.size());
    for (size_t v = 0; v < za.size(); ++v) EXPECT_NEAR(za[v], zb[v], 1e-5) << attention << " " << v;
}

TEST(Decoder, TruncateForgetsRejectedTokens) { check_truncate("mha", false); }
TEST(Decoder, TruncateForgetsRejectedTokensMlaLatent) { check_truncate("mla", false); }
TEST(Decoder, TruncateForgetsRejectedTokensMlaFull) { check_truncate("mla", true); }

// An untrained model's drafts are mostly rejected: this exercises the rejections and trimming
// (the trained model's acceptances: tests/train/test_mtp.cpp). A prompt of one token and of
// several, every depth.
void check_speculative(const std::string& attention, int depth, int prompt_len, bool full_kv = false, bool moe = false) {
    const ModelConfig m = mtp_model(attention, depth, moe);
    RopeConfig rope;
    const int new_tokens = 25, T = prompt_len + new_tokens;
    auto be = make_cpu_backend(1);
    ParamTable table = make_param_table(m);
    const std::vector<float> params = weights(m, table, 0.3, 9);
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
    for (int t = 0; t < prompt_len; ++t) prompt[size_t(t)] = int32_t((t * 5 + 2) % m.vocab_size);
    auto argmax = [](const std::vector<float>& z) { return int32_t(std::max_element(z.begin(), z.end()) - z.begin()); };
    // Plain greedy: one step per token.
    Decoder plain(*be, m, rope, T, table, params, T, full_kv);
    std::vector<int32_t> want;
    const std::vector<float>* z = &plain.prefill(prompt.data(), prompt_len);
    for (int n = 0; n < new_tokens; ++n) {
        want.push_back(argmax(*z));
        z = &plain.step(want.back(), prompt_len + n);
    }
    Decoder dec(*be, m, rope, T, table, params, T, full_kv);
    dec.keep_hidden(true);
    std::vector<int32_t> got{argmax(dec.prefill(prompt.data(), prompt_len))};
    MtpSpeculator sp(dec, prompt);
    while (int(got.size()) < new_tokens) {
        const auto more = sp.advance(got.back(), new_tokens - int(got.size()));
        ASSERT_FALSE(more.empty());
        got.insert(got.end(), more.begin(), more.end());
    }
    EXPECT_EQ(got, want) << attention << " depth " << depth;
    const SpeculativeStats& st = sp.stats();
    // Every round gives its accepted drafts and the model's own next token (the last may drop it).
    EXPECT_GE(st.rounds + st.accepted, int64_t(new_tokens) - 1);
    EXPECT_LE(st.rounds + st.accepted, int64_t(new_tokens));
    EXPECT_LE(st.accepted, st.drafted);
    EXPECT_GT(st.drafted, 0);
}

TEST(Decoder, SpeculativeMtpIsPlainGreedy) {
    for (int depth : {1, 2, 3})
        for (int p : {1, 6}) check_speculative("mha", depth, p);
}
TEST(Decoder, SpeculativeMtpIsPlainGreedyMla) {
    for (int depth : {1, 2})
        for (int p : {1, 6}) {
            check_speculative("mla", depth, p);
            check_speculative("mla", depth, p, true);  // the per-head K|V caches
        }
}
// MoE layers with a capacity factor: generation drops no token, so verifying several rows at
// once routes each as a one-token step would.
TEST(Decoder, SpeculativeMtpIsPlainGreedyMoe) {
    for (int depth : {1, 2}) {
        check_speculative("mha", depth, 6, false, true);
        check_speculative("mla", depth, 6, false, true);
    }
}

// Drafting runs each module as training does: module k's rows through the generation caches,
// one row at a time, give the cross-entropies of the training forward's MTP loss.
void check_mtp_rows(const std::string& attention, int depth) {
    const ModelConfig m = mtp_model(attention, depth);
    RopeConfig rope;
    const int T = 12, C = m.d_model;
    auto be = make_cpu_backend(1);
    ParamTable table = make_param_table(m);
    const std::vector<float> params = weights(m, table, 0.3, 3);
    std::vector<int32_t> seq(T + 1);  // the sample and the target after its last token
    for (int t = 0; t <= T; ++t) seq[size_t(t)] = int32_t((t * 11 + 5) % m.vocab_size);
    const std::vector<int32_t> tgt(seq.begin() + 1, seq.end());
    MpiCommunicator self(MPI_COMM_SELF);
    TensorParallel tp(self, false);
    ModelChunk full(*be, m, rope, table, stage_chunks(m.n_layers, 1, 1, 0, {})[0], tp, 1, T);
    full.add_slot();
    full.forward(0, params.data(), seq.data(), tgt.data(), 1.0f, true);
    const double want = full.mtp_loss(0);
    Decoder dec(*be, m, rope, T, table, params, T + 1);
    dec.keep_hidden(true);
    dec.prefill(seq.data(), T);
    std::vector<float> h = dec.hidden(), next(size_t(T) * C);
    double got = 0;
    for (int k = 0; k < depth; ++k) {
        // Row p embeds seq[p + k + 1] and predicts seq[p + k + 2].
        for (int p = 0; p + k + 1 <= T; ++p) {
            const std::vector<float>& z = dec.mtp(k, h.data() + size_t(p) * C, &seq[size_t(p + k + 1)], 1, p,
                                                  next.data() + size_t(p) * C);
            if (p + k + 2 > T) continue;
            const double mx = *std::max_element(z.begin(), z.end());
            double sum = 0;
            for (float x : z) sum += std::exp(double(x) - mx);
            got += std::log(sum) + mx - z[size_t(seq[size_t(p + k + 2)])];
        }
        h = next;
    }
    EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << attention << " depth " << depth;
}

TEST(Decoder, MtpDraftingRowsAreTheTrainingRows) {
    for (int depth : {1, 2, 3}) {
        check_mtp_rows("mha", depth);
        check_mtp_rows("mla", depth);
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

// Several sequences decoded together (quintet generate --prompts): a step with one row per
// sequence gives each row the bits that a step of that sequence alone gives (the few-row GEMM
// keeps each row's sums; attention runs per sequence over its own cache), with prompts of
// different lengths, sequences leaving the batch and a slot reset for a new prompt.
void check_batch(const std::string& attention, bool full_kv, bool moe = false) {
    const ModelConfig m = mtp_model(attention, 0, moe);
    RopeConfig rope;
    const int T = 24, S = 3;
    auto be = make_cpu_backend(1);
    ParamTable table = make_param_table(m);
    const std::vector<float> params = weights(m, table, 0.3, 11);
    // Four prompts for three slots: the fourth takes the slot of the first when it ends.
    const std::vector<std::vector<int32_t>> prompts{{3, 9, 1, 4, 4}, {7}, {2, 2, 8}, {5, 11, 0, 6}};
    const std::vector<int> steps{3, 8, 6, 5};  // batched steps each sequence takes
    auto argmax = [&](const float* z) { return int32_t(std::max_element(z, z + m.vocab_size) - z); };
    // Alone: prefill (or one step), then greedy steps; the logits of every step.
    std::vector<std::vector<std::vector<float>>> alone(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        Decoder d(*be, m, rope, T, table, params, T, full_kv);
        const auto& p = prompts[i];
        std::vector<float> z = p.size() > 1 ? d.prefill(p.data(), int(p.size())) : d.step(p[0], 0);
        alone[i].push_back(z);
        for (int s = 0; s < steps[i]; ++s) {
            z = d.step(argmax(z.data()), int(p.size()) + s);
            alone[i].push_back(z);
        }
    }
    Decoder dec(*be, m, rope, T, table, params, T, full_kv, S);
    std::vector<int> slot_of{0, 1, 2, -1}, done(prompts.size(), 0);
    std::vector<std::vector<float>> last(prompts.size());
    auto start = [&](size_t i, int slot) {
        dec.reset(slot);
        dec.select(slot);
        const auto& p = prompts[i];
        last[i] = p.size() > 1 ? dec.prefill(p.data(), int(p.size())) : dec.step(p[0], 0);
        EXPECT_EQ(last[i], alone[i][0]) << attention << " prompt " << i;
        slot_of[i] = slot;
    };
    for (size_t i = 0; i < 3; ++i) start(i, int(i));
    int batched_rows = 0;
    for (;;) {
        std::vector<int> seqs;
        std::vector<size_t> who;
        std::vector<int32_t> ids;
        for (size_t i = 0; i < prompts.size(); ++i)
            if (slot_of[i] >= 0 && done[i] < steps[i]) {
                seqs.push_back(slot_of[i]);
                who.push_back(i);
                ids.push_back(argmax(last[i].data()));
            }
        if (seqs.empty()) break;
        const std::vector<float>& z = dec.step_batch(seqs.data(), ids.data(), int(seqs.size()));
        batched_rows += int(seqs.size());
        ASSERT_EQ(z.size(), seqs.size() * size_t(m.vocab_size));
        for (size_t r = 0; r < who.size(); ++r) {
            const size_t i = who[r];
            last[i].assign(z.begin() + long(r * m.vocab_size), z.begin() + long((r + 1) * m.vocab_size));
            ++done[i];
            EXPECT_EQ(last[i], alone[i][size_t(done[i])]) << attention << " prompt " << i << " step " << done[i];
            EXPECT_EQ(dec.length(slot_of[i]), int(prompts[i].size()) + done[i]);
            if (done[i] == steps[i] && i == 0) start(3, slot_of[0]);  // the fourth prompt takes slot 0
        }
    }
    EXPECT_EQ(batched_rows, 3 + 8 + 6 + 5);
}

TEST(Decoder, BatchedSequencesGiveEachSequenceItsOwnBits) { check_batch("mha", false); }
TEST(Decoder, BatchedSequencesGiveEachSequenceItsOwnBitsMlaLatent) { check_batch("mla", false); }
TEST(Decoder, BatchedSequencesGiveEachSequenceItsOwnBitsMlaFull) { check_batch("mla", true); }
TEST(Decoder, BatchedSequencesGiveEachSequenceItsOwnBitsMoe) {
    check_batch("mha", false, true);
    check_batch("mla", false, true);
}

// MLA's latent cache (kv_b absorbed into the query and the output) against the per-head K|V
// cache that training's attention reads: the same logits to fp32 rounding at every step.
TEST(Decoder, MlaLatentCacheEqualsTheExpandedForm) {
    ModelConfig m = mtp_model("mla", 0);
    m.q_lora_rank = 12;
    RopeConfig rope;
    rope.scaling = "yarn";
    rope.factor = 4;
    rope.original_max_position = 8;
    rope.mscale = 0.707;
    rope.mscale_all_dim = 0.707;
    const int T = 40;
    auto be = make_cpu_backend(1);
    ParamTable table = make_param_table(m);
    const std::vector<float> params = weights(m, table, 0.3, 13);
    Decoder lat(*be, m, rope, 8, table, params, T, false), full(*be, m, rope, 8, table, params, T, true);
    double worst = 0;
    int32_t id = 1;
    for (int t = 0; t < T; ++t) {
        const std::vector<float>& a = lat.step(id, t);
        const std::vector<float>& b = full.step(id, t);
        float scale = 0;
        for (float x : b) scale = std::max(scale, std::abs(x));
        for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, double(std::abs(a[v] - b[v])) / scale);
        id = int32_t(std::max_element(b.begin(), b.end()) - b.begin());
    }
    EXPECT_LT(worst, 2e-6) << "largest difference relative to the largest logit";
    EXPECT_GT(worst, 0.0) << "the two forms sum in different orders: some rounding difference is expected";
}
