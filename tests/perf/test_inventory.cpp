// perf/inventory against what it stands in for: a rank's parameters composed per layer kind
// equal the trainer's parameter table for that rank to the float (every region, every stage,
// MHA and MLA, MoE on some layers, tied embeddings, uneven pipeline splits, interleaving, tp
// and ep, zbv's V); the ZeRO-2/3 slice sizes composed by unit equal those of the table laid out
// by unit; the capped replay of a schedule gives the full action list's in-flight counts (the
// zero-bubble schedules' held until W); the
// whole-model counts are exact (the Llama 3 405B shape has 405,853,388,800 parameters); DeepSeek-V3's
// multi-token prediction modules are counted on the last stage.
// ctest: labels=unit
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "quintet/model/params.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"
#include "quintet/perf/inventory.hpp"

using namespace quintet;

namespace {

ModelConfig base() {
    ModelConfig m;
    m.d_model = 64, m.n_layers = 6, m.n_heads = 8, m.n_kv_heads = 4, m.ffn_dim = 96, m.vocab_size = 301;
    return m;
}

void expect_same(const ModelConfig& m, int tp, int pp, int v, int ep, const std::vector<int>& pp_layers,
                 Placement placement = Placement::loop) {
    const ModelInventory inv(m, tp, ep, tp > 1);
    for (int stage = 0; stage < pp; ++stage) {
        ShardPlan plan;
        plan.tp = tp, plan.sequence_parallel = tp > 1, plan.pp = pp, plan.ep = ep;
        plan.chunks = stage_chunks(m.n_layers, pp, v, stage, pp_layers, placement);
        const ParamTable t = make_param_table(m, plan);
        const RegionFloats f = inv.stage_params(plan.chunks, pp);
        const std::string what = " stage " + std::to_string(stage) + " tp " + std::to_string(tp) + " pp " +
                                 std::to_string(pp) + " v " + std::to_string(v) + " ep " + std::to_string(ep) +
                                 " attention " + m.attention + " moe " + std::to_string(m.moe.experts) + " tied " +
                                 std::to_string(m.tie_embeddings) + " vee " + std::to_string(placement == Placement::vee);
        for (int r = 0; r < kNumRegions; ++r) EXPECT_EQ(f.r[size_t(r)], double(t.region_used[r])) << "region " << r << what;
        // ZeRO-2/3: the slices' sizes composed by unit equal those of the table laid out by unit
        // (the MTP modules' units and the embedding's second copy in unit "head" included).
        for (int g : {1, 3, 4}) {
            const int ge = std::max(1, g / ep);
            ShardPlan zp = plan;
            zp.zero = 2, zp.pad[int(Replicas::dense)] = g, zp.pad[int(Replicas::expert)] = ge;
            const ParamTable zt = make_param_table(m, zp);
            const int size[kNumRegions] = {g, ge, 1}, rank[kNumRegions] = {0, 0, 0};
            const ZeroLayout want = zero_layout(zt, size, rank);
            const double group[kNumRegions] = {double(g), double(ge), 1};
            double arena = 0;
            const ZeroLayout got = zero_sizes(inv.stage_units(plan.chunks, pp), group, &arena);
            EXPECT_EQ(arena, double(zt.total)) << "g " << g << what;
            EXPECT_EQ(got.trainable, want.trainable) << "g " << g << what;
            EXPECT_EQ(got.buffers, want.buffers) << "g " << g << what;
            EXPECT_EQ(got.largest_unit, want.largest_unit) << "g " << g << what;
            EXPECT_EQ(got.largest_unit_shard, want.largest_unit_shard) << "g " << g << what;
        }
    }
}

}  // namespace

TEST(Inventory, StageParamsEqualTheParameterTable) {
    for (bool tied : {false, true})
        for (int tp : {1, 2, 4}) {
            ModelConfig m = base();
            m.tie_embeddings = tied;
            expect_same(m, tp, 1, 1, 1, {});
            expect_same(m, tp, 2, 1, 1, {});
            expect_same(m, tp, 3, 1, 1, {1, 3, 2});
            expect_same(m, tp, 3, 2, 1, {});
            expect_same(m, tp, 3, 2, 1, {}, Placement::vee);  // zbv's V: stage 0 holds both ends
        }
    // MoE on some layers, with a shared expert and aux-free biases (the buffers region).
    ModelConfig moe = base();
    moe.moe.experts = 4, moe.moe.top_k = 2, moe.moe.shared_experts = 1, moe.moe.ffn_dim = 32;
    moe.moe.layers.parse("1,3-5");
    moe.moe.balance = "aux_free";
    for (int ep : {1, 2, 4})
        for (int tp : {1, 2}) {
            expect_same(moe, tp, 1, 1, ep, {});
            expect_same(moe, tp, 2, 1, ep, {4, 2});
            expect_same(moe, tp, 3, 2, ep, {});
        }
    moe.moe.layers.parse("all");
    expect_same(moe, 2, 2, 1, 2, {});
    // Many experts per rank (their counts extrapolated from two small tables).
    moe.moe.experts = 16;
    for (int ep : {1, 2, 8}) expect_same(moe, 2, 2, 1, ep, {});
    // MLA, with and without the q low-rank projection.
    ModelConfig mla = base();
    mla.attention = "mla", mla.n_kv_heads = 0, mla.kv_lora_rank = 16, mla.q_lora_rank = 24, mla.qk_nope_dim = 8,
    mla.qk_rope_dim = 4, mla.v_head_dim = 8;
    for (int tp : {1, 2, 4}) expect_same(mla, tp, 2, 1, 1, {});
    mla.q_lora_rank = 0;
    expect_same(mla, 2, 3, 2, 1, {});
    // DeepSeek-V3's multi-token prediction modules on the last stage (with the embedding's copy
    // when the first stage is another), dense and MoE, MHA and MLA.
    for (ModelConfig mtp : {base(), moe, mla}) {
        mtp.mtp_depth = 2;
        expect_same(mtp, 1, 1, 1, 1, {});
        expect_same(mtp, 2, 2, 1, mtp.moe.experts > 0 ? 2 : 1, {});
        expect_same(mtp, 1, 3, 2, 1, {});
    }
}

TEST(Inventory, ChunkSlotsMatchTheFullSchedule) {
    for (const std::string kind : {"1f1b", "gpipe", "interleaved", "zb_h1", "zbv"})
        for (int pp = 1; pp <= 6; ++pp)
            for (int v : kind == "interleaved" ? std::vector<int>{2, 3} : kind == "zbv" ? std::vector<int>{2} : std::vector<int>{1}) {
                if ((kind == "interleaved" || kind == "zbv") && pp < 2) continue;
                for (int m = 1; m <= 12 * pp; ++m) {
                    if (!schedule_check(kind, pp, m, v, 0).empty()) continue;
                    for (int stage = 0; stage < pp; ++stage) {
                        std::vector<int> now(size_t(v), 0), peak(size_t(v), 0);
                        for (const Action& a : make_schedule(kind, pp, stage, m, v)) {
                            if (a.op == Op::forward) peak[size_t(a.chunk)] = std::max(peak[size_t(a.chunk)], ++now[size_t(a.chunk)]);
                            else if (a.op == Op::backward || a.op == Op::backward_weight) --now[size_t(a.chunk)];
                        }
                        EXPECT_EQ(chunk_slots(kind, pp, stage, m, v), peak)
                            << kind << " pp " << pp << " v " << v << " m " << m << " stage " << stage;
                    }
                }
            }
}

TEST(Inventory, ModelCountsAreExact) {
    // The Llama 3 405B shape (arXiv 2407.21783, Table 3) with its 128,256-token vocabulary.
    ModelConfig m;
    m.d_model = 16384, m.n_layers = 126, m.n_heads = 128, m.n_kv_heads = 8, m.ffn_dim = 53248, m.vocab_size = 128256;
    const ModelCounts c = model_counts(m);
    EXPECT_EQ(c.total, 405853388800.0);
    // Active: every matmul a token goes through (the embedding is a lookup).
    EXPECT_EQ(c.active, 405853388800.0 - 128256.0 * 16384 - 16384.0 * (2 * 126 + 1));
    // MoE: the active count takes k of E experts.
    ModelConfig moe = base();
    moe.moe.experts = 8, moe.moe.top_k = 2, moe.moe.ffn_dim = 32;
    const ModelCounts mc = model_counts(moe);
    EXPECT_LT(mc.active, mc.total);
    const ParamTable t = make_param_table(moe);
    EXPECT_EQ(mc.active, double(t.matmul_params));
    double total = 0;
    for (const auto& l : t.logical) total += l.trainable ? double(l.numel()) : 0;
    EXPECT_EQ(mc.total, total);
    moe.tie_embeddings = true, moe.moe.shared_experts = 2, moe.moe.layers.parse("0,2-4");
    const ParamTable tt = make_param_table(moe);
    EXPECT_EQ(model_counts(moe).active, double(tt.matmul_params));
    // With MTP modules: every module's tensors, and its pass through the head, counted.
    for (int depth : {1, 3}) {
        moe.mtp_depth = depth;
        const ParamTable mt = make_param_table(moe);
        double all = 0;
        for (const auto& l : mt.logical) all += l.trainable ? double(l.numel()) : 0;
        EXPECT_EQ(model_counts(moe).total, all) << depth;
        EXPECT_EQ(model_counts(moe).active, double(mt.matmul_params)) << depth;
    }
}
