// Parameter groups and µP's rules (model/param_groups.hpp): each tensor's group, its init std and
// its learning-rate multiplier under every scheme, against the rules written out in
// docs/scaling-laws.md; multiplier 1 = the scaled scheme; the deck's [groups] overrides; and a
// trained width's init against its formula (the std of its elements).
#include <gtest/gtest.h>

#include <cmath>

#include "quintet/model/param_groups.hpp"
#include "quintet/model/params.hpp"

using namespace quintet;

namespace {

ModelConfig moe_model(int width) {
    ModelConfig m;
    m.d_model = width;
    m.n_layers = 2;
    m.n_heads = width / 8;
    m.n_kv_heads = width / 16;
    m.ffn_dim = 3 * width;
    m.vocab_size = 50;
    m.moe.experts = 4;
    m.moe.top_k = 2;
    m.moe.shared_experts = 1;
    m.moe.ffn_dim = width;
    m.moe.layers.parse("1");
    return m;
}

TensorRule rule(const ModelConfig& m, const InitConfig& in, const std::string& name, const GroupOverrides& o = {}) {
    const ParamTable t = make_param_table(m);
    const ParamSpec* s = t.find(name);
    EXPECT_NE(s, nullptr) << name;
    return s ? tensor_rule(*s, m, in, o) : TensorRule{};
}

TEST(ParamGroups, EveryTensorHasItsGroup) {
    const ModelConfig m = moe_model(32);
    const ParamTable t = make_param_table(m);
    for (const ParamSpec& s : t.specs) {
        const ParamGroup g = param_group(s);
        if (s.name == "model.embed_tokens.weight") EXPECT_EQ(g, ParamGroup::embedding);
        else if (s.name == "lm_head.weight") EXPECT_EQ(g, ParamGroup::output);
        else if (s.name.find("layernorm") != std::string::npos || s.name == "model.norm.weight") EXPECT_EQ(g, ParamGroup::norm);
        else if (s.name.find(".mlp.gate.weight") != std::string::npos) EXPECT_EQ(g, ParamGroup::router);
        else if (s.name.find(".mlp.experts.") != std::string::npos) EXPECT_EQ(g, ParamGroup::expert);
        else EXPECT_EQ(g, ParamGroup::hidden) << s.name;
    }
}

TEST(ParamGroups, MupAtMultiplierOneIsTheScaledScheme) {
    const ModelConfig m = moe_model(32);
    InitConfig scaled, mup;
    mup.scheme = "mup";
    mup.base_width = 32;
    const ParamTable t = make_param_table(m);
    for (const ParamSpec& s : t.specs) {
        const TensorRule a = tensor_rule(s, m, scaled), b = tensor_rule(s, m, mup);
        EXPECT_EQ(a.std, b.std) << s.name;  // the same double, bit for bit
        EXPECT_EQ(a.lr_mult, b.lr_mult) << s.name;
        EXPECT_EQ(b.lr_mult, param_group(s) == ParamGroup::buffer ? 0.0 : 1.0) << s.name;
    }
    EXPECT_EQ(mup_shape(m, mup).width, 1.0);
}

TEST(ParamGroups, MupWidthRules) {
    const ModelConfig m = moe_model(128);
    InitConfig in;
    in.scheme = "mup";
    in.base_width = 32;  // width multiplier 4
    in.base_ffn = 48;    // F = 384: ffn multiplier 8
    in.std = 0.02;
    const double s = 0.02, out = 1 / std::sqrt(2.0 * m.n_layers);
    const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
    struct Want { std::string name; double std, lr; };
    for (const Want& w : std::vector<Want>{
             {"model.embed_tokens.weight", s, 1},                  // input: unchanged
             {"lm_head.weight", s, 1},                             // readout: logits x 1/m instead
             {l0 + "self_attn.q_proj.weight", s / 2, 0.25},        // fan-in C: var / 4, lr / 4
             {l0 + "self_attn.o_proj.weight", s * out / 2, 0.25},  // and the residual branch's 1/sqrt(2L)
             {l0 + "mlp.gate_proj.weight", s / 2, 0.25},
             {l0 + "mlp.down_proj.weight", s * out / std::sqrt(8.0), 0.125},  // fan-in F: the ffn multiplier
             {l1 + "mlp.gate.weight", s / 4, 0.25},                // router: std / m, lr / m
             {l1 + "mlp.experts.2.up_proj.weight", s / 2, 0.25},
             {l1 + "mlp.experts.2.down_proj.weight", s * out / std::sqrt(8.0), 0.125},
             {l1 + "mlp.shared_experts.down_proj.weight", s * out / std::sqrt(8.0), 0.125},
             {l0 + "input_layernorm.weight", s, 1}}) {
        const TensorRule r = rule(m, in, w.name);
        if (w.name.find("layernorm") == std::string::npos) EXPECT_NEAR(r.std, w.std, 1e-12 * w.std) << w.name;
        EXPECT_DOUBLE_EQ(r.lr_mult, w.lr) << w.name;
    }
    EXPECT_EQ(rule(m, in, l0 + "input_layernorm.weight").wd_mult, 0.0);  // norms are never decayed
    const MupShape ms = mup_shape(m, in);
    EXPECT_DOUBLE_EQ(ms.width, 4.0);
    EXPECT_DOUBLE_EQ(ms.ffn, 8.0);
    EXPECT_DOUBLE_EQ(ms.attn, 1.0);  // base_head_dim 0: the head dim's own scale
    in.base_head_dim = 4;            // head dim 8: scale sqrt(4)/8 = 1/sqrt(8) x sqrt(4/8)
    EXPECT_DOUBLE_EQ(mup_shape(m, in).attn, std::sqrt(0.5));
}

TEST(ParamGroups, DeckOverridesReplaceTheSchemesMultipliers) {
    const ModelConfig m = moe_model(64);
    InitConfig in;
    in.scheme = "mup";
    in.base_width = 32;
    GroupOverrides o;
    o.lr[size_t(ParamGroup::hidden)] = 0.3;
    o.wd[size_t(ParamGroup::expert)] = 0;
    EXPECT_DOUBLE_EQ(rule(m, in, "model.layers.0.self_attn.q_proj.weight", o).lr_mult, 0.3);
    EXPECT_DOUBLE_EQ(rule(m, in, "model.layers.0.self_attn.q_proj.weight").lr_mult, 0.5);
    EXPECT_DOUBLE_EQ(rule(m, in, "model.layers.1.mlp.experts.0.up_proj.weight", o).wd_mult, 0.0);
    EXPECT_DOUBLE_EQ(rule(m, in, "model.layers.1.mlp.experts.0.up_proj.weight", o).lr_mult, 0.5);
}

TEST(ParamGroups, InitialisedWeightsHaveTheRulesStd) {
    const ModelConfig m = moe_model(128);
    InitConfig in;
    in.scheme = "mup";
    in.base_width = 32;
    const ParamTable t = make_param_table(m);
    std::vector<float> w(t.total);
    init_params(w.data(), t, m, in, 5, 0, t.total);
    for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.gate.weight", "lm_head.weight"}) {
        const ParamSpec* s = t.find(name);
        double ss = 0;
        for (size_t i = 0; i < s->numel(); ++i) ss += double(w[s->offset + i]) * w[s->offset + i];
        const double got = std::sqrt(ss / double(s->numel())), want = tensor_rule(*s, m, in).std;
        EXPECT_NEAR(got, want, 0.1 * want) << name;  // thousands of normal draws: within 10%
    }
}

TEST(ParamGroups, SummaryListsEachGroupOnce) {
    const ModelConfig m = moe_model(64);
    InitConfig in;
    in.scheme = "mup";
    in.base_width = 32;
    const auto g = summarise_groups(m, in, {});
    ASSERT_EQ(g.size(), 6u);  // embedding, hidden, output, norm, router, expert (no buffer: aux-loss balancing)
    size_t total = 0;
    for (const auto& x : g) total += x.elements;
    size_t want = 0;
    for (const auto& l : make_param_table(m).logical) want += l.numel();
    EXPECT_EQ(total, want);
    const std::string text = groups_text(g);
    for (const char* name : {"embedding", "hidden", "output", "norm", "router", "expert"})
        EXPECT_NE(text.find(name), std::string::npos) << text;
}

}  // namespace
