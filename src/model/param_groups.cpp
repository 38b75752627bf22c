#include "quintet/model/param_groups.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {
bool ends_with(const std::string& s, const char* tail) {
    const size_t n = std::char_traits<char>::length(tail);
    return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}
}  // namespace

const char* group_name(ParamGroup g) {
    switch (g) {
    case ParamGroup::embedding: return "embedding";
    case ParamGroup::hidden: return "hidden";
    case ParamGroup::output: return "output";
    case ParamGroup::norm: return "norm";
    case ParamGroup::router: return "router";
    case ParamGroup::expert: return "expert";
    case ParamGroup::buffer: return "buffer";
    }
    return "?";
}

MupShape mup_shape(const ModelConfig& m, const InitConfig& init) {
    MupShape s;
    if (init.scheme != "mup") return s;
    if (init.base_width > 0) s.width = double(m.d_model) / double(init.base_width);
    s.ffn = init.base_ffn > 0 ? double(m.ffn_width()) / double(init.base_ffn) : s.width;
    const int dqk = m.attention == "mla" ? m.qk_nope_dim + m.qk_rope_dim : m.head_dim();
    if (init.base_head_dim > 0 && dqk > 0) s.attn = std::sqrt(double(init.base_head_dim) / double(dqk));
    return s;
}

ParamGroup param_group(const ParamSpec& s) {
    if (!s.trainable()) return ParamGroup::buffer;
    if (s.name == "model.embed_tokens.weight") return ParamGroup::embedding;
    if (s.name == "lm_head.weight") return ParamGroup::output;
    if (s.ndim < 2) return ParamGroup::norm;
    if (ends_with(s.name, ".mlp.gate.weight")) return ParamGroup::router;
    if (s.name.find(".mlp.experts.") != std::string::npos) return ParamGroup::expert;
    return ParamGroup::hidden;
}

ParamGroup param_group(const LogicalTensor& t) {
    ParamSpec s;
    s.name = t.name, s.rows = t.rows, s.cols = t.cols, s.ndim = t.ndim;
    if (!t.trainable) s.replicas = Replicas::none;
    return param_group(s);
}

bool muon_takes(const ParamSpec& s) {
    const ParamGroup g = param_group(s);
    return s.ndim == 2 && (g == ParamGroup::hidden || g == ParamGroup::expert);
}

bool muon_takes(const LogicalTensor& t) {
    const ParamGroup g = param_group(t);
    return t.ndim == 2 && (g == ParamGroup::hidden || g == ParamGroup::expert);
}

TensorRule tensor_rule(const ParamSpec& s, const ModelConfig& m, const InitConfig& init, const GroupOverrides& over) {
    TensorRule r;
    r.group = param_group(s);
    // The init std of the schemes that do not depend on width: normal = init.std; scaled also
    // divides the residual branches' output projections by sqrt(2L); fan_in = 1/sqrt(fan-in) for
    // every weight that multiplies activations (a lookup has no fan-in).
    double std = init.std;
    if (init.scheme == "fan_in" && s.init != InitRule::embedding) std = 1.0 / std::sqrt(double(s.cols));
    const double out_scale = init.scheme == "scaled" || init.scheme == "mup" ? 1.0 / std::sqrt(2.0 * m.n_layers) : 1.0;
    if (s.init == InitRule::out_proj) std *= out_scale;
    // µP for AdamW: a matrix whose fan-in grows with the width by w gets init variance / w and
    // learning rate / w (its update then changes its output by O(1) per step at any width); the
    // readout's logits are multiplied by 1/m in the forward instead (ModelConfig::logit_mult); the
    // router, a readout of fixed width E inside the network, gets std / w and learning rate / w;
    // embeddings and norms keep theirs.
    if (init.scheme == "mup") {
        const MupShape ms = mup_shape(m, init);
        r.width_mult = ends_with(s.name, "down_proj.weight") ? ms.ffn : ms.width;
        if (r.group == ParamGroup::hidden || r.group == ParamGroup::expert) {
            std /= std::sqrt(r.width_mult);
            r.lr_mult = 1.0 / r.width_mult;
        } else if (r.group == ParamGroup::router) {
            std /= r.width_mult;
            r.lr_mult = 1.0 / r.width_mult;
        } else {
            r.width_mult = r.group == ParamGroup::output ? ms.width : 1.0;
        }
    }
    r.std = std;
    const int g = int(r.group);
    if (over.lr[size_t(g)] >= 0) r.lr_mult = over.lr[size_t(g)];
    if (over.wd[size_t(g)] >= 0) r.wd_mult = over.wd[size_t(g)];
    if (r.group == ParamGroup::buffer) r.lr_mult = r.wd_mult = 0;
    if (r.group == ParamGroup::norm) r.wd_mult = 0;  // weight decay on rank >= 2 tensors only
    return r;
}

std::vector<TensorRule> tensor_rules(const ParamTable& t, const ModelConfig& m, const InitConfig& init,
                                     const GroupOverrides& over) {
    std::vector<TensorRule> r;
    r.reserve(t.specs.size());
    for (const ParamSpec& s : t.specs) r.push_back(tensor_rule(s, m, init, over));
    return r;
}

std::vector<GroupSummary> summarise_groups(const ModelConfig& m, const InitConfig& init, const GroupOverrides& over) {
    std::vector<GroupSummary> out;
    const ParamTable t = make_param_table(m);
    for (const ParamSpec& s : t.specs) {
        const TensorRule r = tensor_rule(s, m, init, over);
        auto it = std::find_if(out.begin(), out.end(), [&](const GroupSummary& g) { return g.group == r.group; });
        if (it == out.end()) {
            out.push_back({r.group, 0, 0, r.lr_mult, r.lr_mult, r.wd_mult, r.std, r.std});
            it = out.end() - 1;
        }
        ++it->tensors;
        it->elements += s.numel();
        it->lr_min = std::min(it->lr_min, r.lr_mult), it->lr_max = std::max(it->lr_max, r.lr_mult);
        it->wd = r.wd_mult;
        if (s.init != InitRule::ones && s.init != InitRule::zeros)
            it->std_min = std::min(it->std_min, r.std), it->std_max = std::max(it->std_max, r.std);
    }
    std::sort(out.begin(), out.end(), [](const GroupSummary& a, const GroupSummary& b) { return a.group < b.group; });
    return out;
}

std::string groups_text(const std::vector<GroupSummary>& groups) {
    std::string out;
    auto range = [](double lo, double hi) {
        char b[64];
        if (lo == hi) std::snprintf(b, sizeof b, "%.4g", lo);
        else std::snprintf(b, sizeof b, "%.4g-%.4g", lo, hi);
        return std::string(b);
    };
    for (const GroupSummary& g : groups) {
        char line[256];
        std::snprintf(line, sizeof line, "  %-10s %4d tensors %11zu elements   lr x%-12s wd x%-6.4g init %s\n",
                      group_name(g.group), g.tensors, g.elements, range(g.lr_min, g.lr_max).c_str(), g.wd,
                      g.group == ParamGroup::norm ? "ones"
                      : g.group == ParamGroup::buffer ? "zeros"
                      : ("std " + range(g.std_min, g.std_max)).c_str());
        out += line;
    }
    return out;
}

}  // namespace quintet
