// The whole model's gradient against central differences of its loss, RoPE/YaRN tables
// against the formulas of docs/math.md §3-4, and layout-invariant initialisation.
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
    // attention: "mha" (GQA), "mla" (with query compression), "mla_q" (MLA, plain q_proj).
    Tiny(bool tied, bool yarn, const std::string& kind = "mha") {
        // mtp_<kind>: <kind> with two multi-token prediction modules.
        const std::string attention = kind.rfind("mtp", 0) == 0 ? (kind.size() > 4 ? kind.substr(4) : "mha") : kind;
        if (attention != kind) m.mtp_depth = 2;
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
        if (attention.rfind("moe", 0) == 0) {  // moe | moe_free | moe_cap: the feed-forward kind
            m.moe.experts = 4;
            m.moe.top_k = 2;
            m.moe.ffn_dim = 8;
            const bool free = attention == "moe_free";  // else moe | moe_cap
            m.moe.shared_experts = free ? 0 : 1;
            m.moe.balance = free ? "aux_free" : "aux_loss";
            m.moe.aux_coef = 0.5;  // large, so that the aux term's gradient shows
            m.moe.norm_topk = !free;
            m.moe.layers.parse(free ? "1" : "all");
            // moe_cap: a cap of ceil(0.5 * 2 * 18 / 4) = 5 of a microbatch's 36 choices per
            // expert; the dropped choices are fixed under the small FD steps, like the top-k.
            if (attention == "moe_cap") m.moe.capacity_factor = 0.5;
            return;
        }
        if (attention != "mha") {
            m.attention = "mla";
            m.n_kv_heads = 0;
            m.kv_lora_rank = 6;
            m.q_lora_rank = attention == "mla" ? 10 : 0;
            m.qk_nope_dim = 4;
            m.qk_rope_dim = 4;
            m.v_head_dim = 6;
        }
    }
};

// N random ids and targets of Tiny's 17-token vocabulary (fixed seed).
void random_tokens(int N, std::vector<int32_t>& ids, std::vector<int32_t>& tgt) {
    std::mt19937 g(3);
    ids.resize(N);
    tgt.resize(N);
    for (int i = 0; i < N; ++i) {
        ids[i] = int32_t(g() % 17);
        tgt[i] = int32_t(g() % 17);
    }
}

// The whole chunk's gradient, every trainable tensor a few elements each, against central
// differences of its loss (ce, plus the aux loss of MoE layers). kind: a Tiny variant. MoE takes
// steps of 1e-3, so that every token's top-k choice stays fixed (a flip would show as an O(1)
// error), and an expert may have been routed no token. The loss is a sum over tokens (~70 for
// MoE), so at that step fp32 rounding alone moves the difference by ~1e-3 (measured by the
// probes), as much as 3% of a rarely routed expert's largest gradient (0.047 under the capacity
// cut): it is measured for every tensor and allowed for. A tensor whose round-off is not below a
// fifth of its largest gradient fails (an expert's is only left out of the count of checked ones).
// split: the chunk runs its backward in two parts (B, then W), as the zero-bubble schedules do.
// mup: the forward's µP multipliers (logits x 0.5, attention scale x 0.7) set.
void check_model_gradient(bool tied, bool yarn, const std::string& kind = "mha", bool split = false, bool mup = false) {
    const bool mtp = kind.rfind("mtp", 0) == 0;
    const bool moe = kind.rfind("moe", 0) == 0 || kind.rfind("mtp_moe", 0) == 0;
    const float h = moe ? 1e-3f : 1e-2f;
    const double tol = moe ? 3e-2 : 2e-2, min_grad = moe ? 1e-5 : 1e-4;
    Tiny c(tied, yarn, kind);
    if (mup) c.m.logit_mult = 0.5, c.m.attn_mult = 0.7;
    auto be = make_cpu_backend(1);
    ParamTable table = make_param_table(c.m);
    const int B = 2, T = 9, N = B * T;
    quintet::MpiCommunicator self(MPI_COMM_SELF);
    TensorParallel tp(self, false);
    ChunkOptions o;
    o.split_bw = split;
    ModelChunk model(*be, c.m, c.rope, table, stage_chunks(c.m.n_layers, 1, 1, 0, {})[0], tp, B, T, o);
    std::vector<float> params(table.total), grads(table.total, 0.0f);
    init_params(params.data(), table, c.m, c.init, 42, 0, table.total);
    std::vector<int32_t> ids, tgt;
    random_tokens(N, ids, tgt);
    double ce = 0;
    if (split) {
        model.add_slot();
        ce = model.forward(0, params.data(), ids.data(), tgt.data(), 1.0f, true);
        model.backward_input(0, params.data());
        model.backward_weight(0, params.data(), grads.data());
    } else {
        ce = model.forward_backward(params.data(), grads.data(), ids.data(), tgt.data(), 1.0f);
    }
    const double aux = model.aux_loss(0);
    if (kind == "moe") EXPECT_GT(aux, 0.0);
    // With MTP the loss adds mtp_weight / D times the modules' summed cross-entropies (a
    // training forward: an evaluation's is the main loss alone).
    const double mtp_w = o.mtp_weight / std::max(1, c.m.mtp_depth);
    const double mtp_sum = model.mtp_loss(0);
    if (mtp) EXPECT_GT(mtp_sum, 0.0);
    auto f = [&] {
        if (!mtp) return model.forward_loss(params.data(), ids.data(), tgt.data()) + model.aux_loss(0);
        const double l = model.forward(0, params.data(), ids.data(), tgt.data(), 1.0f, true);
        return l + model.aux_loss(0) + mtp_w * model.mtp_loss(0);
    };
    EXPECT_NEAR(f(), ce + aux + mtp_w * mtp_sum, (moe ? 1e-5 : 1e-4) * std::abs(ce));
    int experts = 0, with_grad = 0;
    for (const auto& s : table.specs) {
        if (!s.trainable()) continue;
        std::vector<float> x(params.begin() + s.offset, params.begin() + s.offset + s.numel());
        std::vector<float> an(grads.begin() + s.offset, grads.begin() + s.offset + s.numel());
        auto fx = [&] {
            std::copy(x.begin(), x.end(), params.begin() + s.offset);
            return f();
        };
        auto r = quintet::testing::gradcheck(x, an, fx, h, 12, 5, 12);
        std::copy(x.begin(), x.end(), params.begin() + s.offset);
        EXPECT_TRUE(r.within(tol)) << kind << " " << s.name << " max grad " << r.max_grad << " err "
                                   << r.max_abs_err << " (round-off of the difference " << r.noise << ")";
        // A tensor is checked only where a wrong gradient (off by ~max grad) would stand far
        // above the round-off allowed for.
        const bool checked = r.max_grad > min_grad && r.noise < 0.2 * r.max_grad;
        if (s.name.find(".mlp.experts.") != std::string::npos) {
            ++experts;
            with_grad += checked;
        } else {
            EXPECT_TRUE(checked) << kind << " " << s.name << " max grad " << r.max_grad << ", round-off "
                                 << r.noise << ": no gradient to check";
        }
    }
    if (moe) {
        EXPECT_EQ(experts, (kind == "moe_free" ? 1 : mtp ? 4 : 2) * 4 * 3);  // every expert tensor of every MoE layer
        EXPECT_GE(with_grad, experts * 2 / 3) << "too few experts were routed to for the check to mean much";
    }
}

TEST(Model, GradientMatchesFiniteDifferences) { check_model_gradient(false, false); }
TEST(Model, GradientMatchesFiniteDifferencesTiedWithYarn) { check_model_gradient(true, true); }
// MLA: every tensor (q_a, q_a_layernorm, q_b or q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b,
// o_proj) against central differences, with and without query compression and YaRN.
TEST(Model, MlaGradientMatchesFiniteDifferences) { check_model_gradient(false, false, "mla"); }
// µP's logits multiplier (the head's GEMMs' alpha, forward and both backward products) and
// attention-scale multiplier, tied and untied, MHA and MLA.
TEST(Model, MupMultipliersGradientMatchesFiniteDifferences) {
    check_model_gradient(false, false, "mha", false, true);
    check_model_gradient(true, true, "mla", true, true);
}
TEST(Model, MlaGradientMatchesFiniteDifferencesPlainQueryWithYarn) { check_model_gradient(true, true, "mla_q"); }
// MoE: router, k of E SwiGLU experts, a shared expert and the aux loss; aux-free on one layer.
TEST(Model, MoeGradientMatchesFiniteDifferences) { check_model_gradient(false, false, "moe"); }
TEST(Model, MoeAuxFreeOnOneLayerGradientMatchesFiniteDifferences) { check_model_gradient(false, false, "moe_free"); }
// DeepSeek-V3's multi-token prediction: two modules (their norms, eh_proj, a decoder layer of the
// model's kinds; the shared embedding and head), dense MHA, MLA and MoE.
TEST(Model, MtpGradientMatchesFiniteDifferences) {
    check_model_gradient(false, false, "mtp");
    check_model_gradient(true, false, "mtp_mla");
    check_model_gradient(false, false, "mtp_moe");
}
TEST(Model, MoeWithCapacityDropsGradientMatchesFiniteDifferences) { check_model_gradient(false, false, "moe_cap"); }
// The backward split into B (input gradients) and W (weight gradients), as zb_h1 and zbv run it:
// every block kind against central differences too.
TEST(Model, SplitBackwardMatchesFiniteDifferences) {
    check_model_gradient(true, true, "mha", true);
    check_model_gradient(false, false, "mla", true);
    check_model_gradient(false, false, "mla_q", true);
    check_model_gradient(false, false, "moe", true);
    check_model_gradient(false, false, "mtp_moe", true);  // the MTP modules' B and W too
}

// train.precision = bf16: the same chunk with bf16 GEMM operands. Its loss and gradients follow
// the fp32 ones to bf16's precision (8 bits of mantissa), yet really differ from them (the bf16
// path is taken), and the weights the GEMMs read are the shadow, not the fp32 master.
TEST(Model, Bf16FollowsFp32ToBf16Precision) {
    for (const auto& [tied, kind] : std::vector<std::pair<bool, std::string>>{{false, "mha"}, {true, "mha"}, {false, "mla"}}) {
        Tiny c(tied, false, kind);
        auto be = make_cpu_backend(1);
        ParamTable table = make_param_table(c.m);
        const int B = 2, T = 9, N = B * T;
        quintet::MpiCommunicator self(MPI_COMM_SELF);
        TensorParallel tp(self, false);
        const ChunkPlan plan = stage_chunks(c.m.n_layers, 1, 1, 0, {})[0];
        ModelChunk f32(*be, c.m, c.rope, table, plan, tp, B, T);
        ModelChunk b16(*be, c.m, c.rope, table, plan, tp, B, T, ChunkOptions{Precision::bf16});
        std::vector<float> params(table.total), g32(table.total, 0.0f), g16(table.total, 0.0f);
        init_params(params.data(), table, c.m, c.init, 42, 0, table.total);
        std::vector<bf16_bits> shadow(table.total);
        be->to_bf16(shadow.data(), params.data(), table.total);
        b16.set_bf16_weights(params.data(), shadow.data());
        std::vector<int32_t> ids, tgt;
        random_tokens(N, ids, tgt);
        double l32 = f32.forward_backward(params.data(), g32.data(), ids.data(), tgt.data(), 1.0f);
        double l16 = b16.forward_backward(params.data(), g16.data(), ids.data(), tgt.data(), 1.0f);
        EXPECT_NE(l16, l32);
        EXPECT_NEAR(l16, l32, 1e-2 * std::abs(l32));
        for (const auto& s : table.specs) {
            double num = 0, den = 0;
            for (size_t i = s.offset; i < s.offset + s.numel(); ++i) {
                num += std::pow(double(g16[i]) - g32[i], 2);
                den += std::pow(double(g32[i]), 2);
            }
            const double rel = std::sqrt(num / den);
            EXPECT_LT(rel, 3e-2) << s.name << " tied=" << tied << " " << kind;
            EXPECT_GT(rel, 1e-6) << s.name << " tied=" << tied << " " << kind << ": bf16 gives fp32's gradient";
        }
        // The GEMMs read the shadow: zeroing it (master untouched) changes the loss.
        std::fill(shadow.begin(), shadow.end(), bf16_bits(0));
        EXPECT_GT(std::abs(b16.forward_loss(params.data(), ids.data(), tgt.data()) - l16), 0.1);
    }
}

// data.document_mask: a packed sample [doc A, eos | doc B, eos | doc C] gives each token the loss
// and gradient it has when its document runs alone (attention never crosses a boundary; every
// target counts, also the one after an eos), with RoPE positions restarting per document or not
// (RoPE is relative, so only rounding differs).
TEST(Model, DocumentMaskEqualsEachDocumentAlone) {
    for (bool restart : {true, false}) {
        Tiny c(false, false);
        auto be = make_cpu_backend(1);
        ParamTable table = make_param_table(c.m);
        quintet::MpiCommunicator self(MPI_COMM_SELF);
        TensorParallel tp(self, false);
        const ChunkPlan plan = stage_chunks(c.m.n_layers, 1, 1, 0, {})[0];
        const int32_t eos = 16;
        const std::vector<int> lens = {5, 7, 4};  // A and B end with eos, C is cut off
        std::vector<int32_t> ids, tgt;
        std::mt19937 g(7);
        for (size_t d = 0; d < lens.size(); ++d)
            for (int t = 0; t < lens[d]; ++t)
                ids.push_back(d + 1 < lens.size() && t == lens[d] - 1 ? eos : int32_t(g() % 16));
        for (size_t i = 0; i < ids.size(); ++i) tgt.push_back(i + 1 < ids.size() ? ids[i + 1] : 3);
        const int T = int(ids.size());
        std::vector<float> params(table.total);
        init_params(params.data(), table, c.m, c.init, 42, 0, table.total);
        ChunkOptions o;
        o.document_mask = true;
        o.document_positions = restart;
        o.eos_id = eos;
        ModelChunk packed(*be, c.m, c.rope, table, plan, tp, 1, T, o);
        std::vector<float> gp(table.total, 0.0f), gs(table.total, 0.0f);
        const double lp = packed.forward_backward(params.data(), gp.data(), ids.data(), tgt.data(), 1.0f);
        double ls = 0;
        int at = 0;
        for (int len : lens) {
            ModelChunk alone(*be, c.m, c.rope, table, plan, tp, 1, len);
            ls += alone.forward_backward(params.data(), gs.data(), ids.data() + at, tgt.data() + at, 1.0f);
            at += len;
        }
        EXPECT_NEAR(lp, ls, (restart ? 1e-6 : 1e-5) * std::abs(ls)) << restart;
        double num = 0, den = 0;
        for (size_t i = 0; i < gp.size(); ++i) {
            num += std::pow(double(gp[i]) - gs[i], 2);
            den += std::pow(double(gs[i]), 2);
        }
        EXPECT_LT(std::sqrt(num / den), restart ? 1e-5 : 1e-4) << restart;
        // Without the mask the documents see each other: a different loss.
        ModelChunk leaky(*be, c.m, c.rope, table, plan, tp, 1, T);
        EXPECT_GT(std::abs(leaky.forward_loss(params.data(), ids.data(), tgt.data()) - lp), 1e-3);
    }
}

// train.recompute: selective (the attention core) and full (whole layers) give the same loss and
// the same gradients, bit for bit -- the same arithmetic on the same inputs -- and keep less.
TEST(Model, RecomputationGivesTheSameBits) {
    for (const auto& [prec, kind] : std::vector<std::pair<Precision, std::string>>{
             {Precision::fp32, "mha"}, {Precision::bf16, "mha"}, {Precision::fp32, "mla"}, {Precision::bf16, "mla"}}) {
        Tiny c(false, false, kind);
        auto be = make_cpu_backend(1);
        ParamTable table = make_param_table(c.m);
        quintet::MpiCommunicator self(MPI_COMM_SELF);
        TensorParallel tp(self, false);
        const ChunkPlan plan = stage_chunks(c.m.n_layers, 1, 1, 0, {})[0];
        const int B = 2, T = 9, N = B * T;
        std::vector<float> params(table.total);
        init_params(params.data(), table, c.m, c.init, 42, 0, table.total);
        std::vector<bf16_bits> shadow(table.total);
        be->to_bf16(shadow.data(), params.data(), table.total);
        std::vector<int32_t> ids, tgt;
        random_tokens(N, ids, tgt);
        std::vector<std::vector<float>> grads;
        std::vector<double> losses;
        std::vector<size_t> kept;
        for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
            ChunkOptions o;
            o.precision = prec;
            o.recompute = r;
            ModelChunk m(*be, c.m, c.rope, table, plan, tp, B, T, o);
            if (prec == Precision::bf16) m.set_bf16_weights(params.data(), shadow.data());
            std::vector<float> g(table.total, 0.0f);
            // Two microbatches in flight, backward in reverse order (as a pipeline runs them).
            m.add_slot();
            m.add_slot();
            double l = m.forward(0, params.data(), ids.data(), tgt.data(), 1.0f, true);
            l += m.forward(1, params.data(), tgt.data(), ids.data(), 1.0f, true);
            m.backward(1, params.data(), g.data());
            m.backward(0, params.data(), g.data());
            losses.push_back(l);
            grads.push_back(g);
            kept.push_back(2 * m.slot_bytes() + m.workspace_bytes());
        }
        for (int k = 1; k < 3; ++k) {
            EXPECT_EQ(losses[k], losses[0]) << k << " " << kind;
            EXPECT_EQ(0, std::memcmp(grads[k].data(), grads[0].data(), grads[0].size() * 4)) << k << " " << kind;
            EXPECT_LT(kept[k], kept[0]) << k << " " << kind;
        }
        EXPECT_LT(kept[2], kept[1]);
    }
}

// The zero-bubble split: B (backward_input) then W (backward_weight), with other microbatches'
// forwards, B's and W's run in between, gives the whole backward's gradients and input gradients
// bit for bit -- every block kind (MHA, MLA with and without query compression, SwiGLU, MoE
// with aux loss, aux-free bias and capacity drops), tied or not, with two MTP modules (dense, MLA,
// MoE: their B gives dL/dh^0, their W runs later), fp32 and bf16, under each recomputation -- and
// keeps W's operands per slot only when split, most of them in the bytes of what B has read.
TEST(Model, SplitBackwardGivesTheWholeBackwardsBits) {
    struct Case {
        std::string kind;
        bool tied;
        Precision prec;
        Recompute r;
    };
    std::vector<Case> cases;
    for (const std::string kind : {"mha", "mla", "mla_q", "moe", "moe_free", "moe_cap", "mtp", "mtp_mla", "mtp_moe"})
        for (Precision prec : {Precision::fp32, Precision::bf16})
            for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
                cases.push_back({kind, (kind == "mha" || kind == "mtp") && r == Recompute::none, prec, r});
    for (const Case& k : cases) {
        const std::string what = k.kind + (k.tied ? " tied" : "") + (k.prec == Precision::bf16 ? " bf16" : " fp32") +
                                 " recompute " + std::to_string(int(k.r));
        SCOPED_TRACE(what);
        Tiny c(k.tied, false, k.kind);
        auto be = make_cpu_backend(1);
        ParamTable table = make_param_table(c.m);
        quintet::MpiCommunicator self(MPI_COMM_SELF);
        TensorParallel tp(self, false);
        const ChunkPlan plan = stage_chunks(c.m.n_layers, 1, 1, 0, {})[0];
        const int B = 2, T = 9, N = B * T, C = c.m.d_model;
        std::vector<float> params(table.total);
        init_params(params.data(), table, c.m, c.init, 42, 0, table.total);
        std::vector<bf16_bits> shadow(table.total);
        be->to_bf16(shadow.data(), params.data(), table.total);
        std::vector<int32_t> ids, tgt;
        random_tokens(N, ids, tgt);
        // Three microbatches: ids/tgt, tgt/ids, and ids/ids.
        const int32_t* mb_ids[3] = {ids.data(), tgt.data(), ids.data()};
        const int32_t* mb_tgt[3] = {tgt.data(), ids.data(), ids.data()};
        std::vector<float> g_whole(table.total, 0.0f), g_split(table.total, 0.0f);
        std::vector<std::vector<float>> dx_whole(3), dx_split(3);
        double l_whole = 0, l_split = 0;
        size_t slot_whole = 0, slot_split = 0;
        for (bool split : {false, true}) {
            ChunkOptions o;
            o.precision = k.prec;
            o.recompute = k.r;
            o.split_bw = split;
            ModelChunk m(*be, c.m, c.rope, table, plan, tp, B, T, o);
            if (k.prec == Precision::bf16) m.set_bf16_weights(params.data(), shadow.data());
            for (int i = 0; i < 3; ++i) m.add_slot();
            auto& g = split ? g_split : g_whole;
            auto& dx = split ? dx_split : dx_whole;
            double& l = split ? l_split : l_whole;
            auto fwd = [&](int i) {
                l += m.forward(i, params.data(), mb_ids[i], mb_tgt[i], 1.0f, true) + m.aux_loss(i) + m.mtp_loss(i);
            };
            auto take_dx = [&](int i) {
                dx[size_t(i)].resize(size_t(N) * C);
                be->to_host(dx[size_t(i)].data(), m.grad_input(i), size_t(N) * C);
            };
            if (!split) {  // the order a 1F1B stage runs: F0 F1 B0 F2 B1 B2
                fwd(0), fwd(1);
                m.backward(0, params.data(), g.data()), take_dx(0);
                fwd(2);
                m.backward(1, params.data(), g.data()), take_dx(1);
                m.backward(2, params.data(), g.data()), take_dx(2);
            } else {  // ZB-H1-like: F0 F1 B0 F2 B1 W0 B2 W1 W2 (each W after other work)
                fwd(0), fwd(1);
                m.backward_input(0, params.data()), take_dx(0);
                fwd(2);
                m.backward_input(1, params.data()), take_dx(1);
                m.backward_weight(0, params.data(), g.data());
                m.backward_input(2, params.data()), take_dx(2);
                m.backward_weight(1, params.data(), g.data());
                m.backward_weight(2, params.data(), g.data());
            }
            (split ? slot_split : slot_whole) = m.slot_bytes();
        }
        EXPECT_EQ(l_split, l_whole);
        EXPECT_EQ(0, std::memcmp(g_split.data(), g_whole.data(), g_whole.size() * 4));
        for (int i = 0; i < 3; ++i)
            EXPECT_EQ(0, std::memcmp(dx_split[size_t(i)].data(), dx_whole[size_t(i)].data(), size_t(N) * C * 4))
                << "microbatch " << i;
        EXPECT_GT(slot_split, slot_whole);  // W's operands, per slot
        if (k.kind == "mha" && k.r == Recompute::none) {
            // d(q|k|v) and d(gate|up) live in q|k|v's and gate|up's bytes once B has read them
            // (and, in bf16, the norms' fp32 incoming gradients in the rest of those bytes); what
            // a slot gains is o_proj's and down_proj's output gradients, [N, C] each, the norms'
            // two [N, C] fp32 per layer in fp32, and the final norm's incoming gradient.
            const size_t nc = size_t(N) * C, nl = size_t(c.m.n_layers);
            const size_t want = k.prec == Precision::bf16 ? nl * 2 * nc * 2 + nc * 4 : (nl * 4 + 1) * nc * 4;
            EXPECT_EQ(slot_split - slot_whole, want);
        }
    }
}

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
    EXPECT_EQ(rope_table_factor(plain), 1.0);
    EXPECT_EQ(rope_softmax_factor(plain), 1.0);
    // DeepSeek's two coefficients (V2-Lite: factor 40, mscale = mscale_all_dim = 0.707): m(c) =
    // 0.1 c ln s + 1; the tables times m(mscale) / m(mscale_all_dim), the softmax times m(mscale_all_dim)^2.
    r.factor = 40, r.mscale = 0.707, r.mscale_all_dim = 0.707;
    const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
    EXPECT_NEAR(rope_table_factor(r), 1.0, 1e-15);
    EXPECT_NEAR(rope_softmax_factor(r), m * m, 1e-14);
    r.mscale = 1.0, r.mscale_all_dim = 0.0;
    EXPECT_NEAR(rope_table_factor(r), 0.1 * std::log(40.0) + 1.0, 1e-15);
    EXPECT_EQ(rope_softmax_factor(r), 1.0);
    EXPECT_EQ(yarn_mscale(1.0, 5.0), 1.0);  // no extension, no temperature
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
    // MLA (nope 4, rope 4, v 6, kv_lora 6, q_lora 10, 4 heads): q_a 10x16, q_b 32x10,
    // kv_a 10x16, kv_b 40x6, o 16x24; the norms do not multiply tokens.
    Tiny mla(false, false, "mla");
    ParamTable tm = make_param_table(mla.m);
    layer = 160 + 320 + 160 + 240 + 384 + 3 * 384;
    EXPECT_EQ(tm.matmul_params, 2 * layer + 17 * 16);
    EXPECT_EQ(tm.find("model.layers.1.self_attn.kv_b_proj.weight")->rows, 40);
    EXPECT_EQ(tm.find("model.layers.1.self_attn.kv_a_layernorm.weight")->ndim, 1);
    EXPECT_EQ(tm.find("model.layers.1.self_attn.q_proj.weight"), nullptr);
    // MoE (4 experts of width 8, top 2, 1 shared): P counts the router, k experts and the shared
    // one -- the parameters a token multiplies -- not all E experts.
    Tiny moe(false, false, "moe");
    ParamTable te = make_param_table(moe.m);
    EXPECT_EQ(te.matmul_params, 2 * (768 + 4 * 16 + 2 * 3 * 8 * 16 + 3 * 8 * 16) + 17 * 16);
    EXPECT_EQ(te.find("model.layers.0.mlp.experts.3.down_proj.weight")->cols, 8);
    EXPECT_EQ(te.find("model.layers.0.mlp.shared_experts.up_proj.weight")->rows, 8);
    EXPECT_EQ(te.find("model.layers.0.mlp.gate_proj.weight"), nullptr);
    Tiny free(false, false, "moe_free");  // MoE on layer 1 only, an aux-free bias buffer
    ParamTable tf = make_param_table(free.m);
    EXPECT_NE(tf.find("model.layers.0.mlp.gate_proj.weight"), nullptr);
    const ParamSpec* bias = tf.find("model.layers.1.mlp.gate.e_score_correction_bias");
    ASSERT_NE(bias, nullptr);
    EXPECT_FALSE(bias->trainable());
    EXPECT_EQ(tf.find("model.layers.1.mlp.shared_experts.up_proj.weight"), nullptr);
    Tiny mq(false, false, "mla_q");
    ParamTable tq = make_param_table(mq.m);
    EXPECT_EQ(tq.find("model.layers.0.self_attn.q_proj.weight")->rows, 32);
    EXPECT_EQ(tq.find("model.layers.0.self_attn.q_a_proj.weight"), nullptr);
}

}  // namespace
