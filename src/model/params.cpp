#include "quintet/model/params.hpp"

#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/core/rng.hpp"

namespace quintet {

ModelDims model_dims(const ModelConfig& m) {
    ModelDims d{};
    d.V = m.vocab_size;
    d.C = m.d_model;
    d.L = m.n_layers;
    d.NH = m.n_heads;
    d.NKV = m.n_kv_heads == 0 ? m.n_heads : m.n_kv_heads;
    d.HD = m.d_model / m.n_heads;
    d.F = m.ffn_dim > 0 ? m.ffn_dim : ((8 * m.d_model / 3 + 63) / 64) * 64;
    d.tied = m.tie_embeddings;
    return d;
}

const ParamSpec& ParamTable::find(const std::string& name) const {
    for (auto& s : specs)
        if (s.name == name) return s;
    rank_fail("no parameter named " + name);
}

ParamTable make_param_table(const ModelConfig& m) {
    ModelDims d = model_dims(m);
    ParamTable t;
    auto add = [&](std::string name, int rows, int cols, int ndim, InitRule init) {
        ParamSpec s;
        s.name = std::move(name);
        s.rows = rows;
        s.cols = cols;
        s.ndim = ndim;
        s.init = init;
        s.offset = t.total;
        t.total += s.numel();
        t.specs.push_back(s);
    };
    add("model.embed_tokens.weight", d.V, d.C, 2, InitRule::normal);
    for (int l = 0; l < d.L; ++l) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", d.C, 1, 1, InitRule::ones);
        add(p + "self_attn.q_proj.weight", d.NH * d.HD, d.C, 2, InitRule::normal);
        add(p + "self_attn.k_proj.weight", d.NKV * d.HD, d.C, 2, InitRule::normal);
        add(p + "self_attn.v_proj.weight", d.NKV * d.HD, d.C, 2, InitRule::normal);
        add(p + "self_attn.o_proj.weight", d.C, d.NH * d.HD, 2, InitRule::out_proj);
        add(p + "post_attention_layernorm.weight", d.C, 1, 1, InitRule::ones);
        add(p + "mlp.gate_proj.weight", d.F, d.C, 2, InitRule::normal);
        add(p + "mlp.up_proj.weight", d.F, d.C, 2, InitRule::normal);
        add(p + "mlp.down_proj.weight", d.C, d.F, 2, InitRule::out_proj);
    }
    add("model.norm.weight", d.C, 1, 1, InitRule::ones);
    if (!d.tied) add("lm_head.weight", d.V, d.C, 2, InitRule::normal);
    for (auto& s : t.specs)
        if (s.ndim == 2 && s.name != "model.embed_tokens.weight") t.matmul_params += s.numel();
    if (d.tied) t.matmul_params += size_t(d.V) * d.C;  // the head still multiplies every token
    return t;
}

void init_params(float* arena, const ParamTable& table, const ModelConfig& m,
                 const InitConfig& init, uint64_t seed, size_t lo, size_t hi) {
    const double out_scale = init.scheme == "scaled" ? 1.0 / std::sqrt(2.0 * m.n_layers) : 1.0;
    for (const auto& s : table.specs) {
        size_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel());
        if (a >= b) continue;
        if (s.init == InitRule::ones) {
            for (size_t i = a; i < b; ++i) arena[i] = 1.0f;
            continue;
        }
        double std = init.std;
        if (init.scheme == "fan_in" && s.name != "model.embed_tokens.weight") std = 1.0 / std::sqrt(double(s.cols));
        if (s.init == InitRule::out_proj) std *= out_scale;
        Philox rng{stream_key(seed, s.name)};
        const float fstd = float(std);
#pragma omp parallel for schedule(static)
        for (size_t i = a; i < b; ++i) arena[i] = rng.normal(i - s.offset) * fstd;
    }
}

ModelView model_view(const ParamTable& t, const ModelDims& d, float* arena) {
    ModelView v;
    size_t i = 0;
    auto next = [&]() { return arena + t.specs[i++].offset; };
    v.wte = next();
    v.layers.resize(d.L);
    for (int l = 0; l < d.L; ++l) {
        LayerView& lv = v.layers[l];
        lv.ln1 = next();
        lv.wqkv = next();
        i += 2;  // k_proj, v_proj follow q_proj contiguously
        lv.wo = next();
        lv.ln2 = next();
        lv.wgu = next();
        i += 1;  // up_proj follows gate_proj
        lv.wdown = next();
    }
    v.norm = next();
    v.head = d.tied ? v.wte : next();
    return v;
}

}  // namespace quintet
