#include "quintet/model/params.hpp"

#include <cmath>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/core/rng.hpp"

namespace quintet {

ModelDims model_dims(const ModelConfig& m, int tp, int tp_rank) {
    ModelDims d{};
    d.V = m.vocab_size;
    d.C = m.d_model;
    d.L = m.n_layers;
    d.NH = m.n_heads;
    d.NKV = m.n_kv_heads == 0 ? m.n_heads : m.n_kv_heads;
    d.HD = m.d_model / m.n_heads;
    d.F = m.ffn_dim > 0 ? m.ffn_dim : ((8 * m.d_model / 3 + 63) / 64) * 64;
    d.tied = m.tie_embeddings;
    d.tp = tp;
    d.tp_rank = tp_rank;
    d.NHl = d.NH / tp;
    d.NKVl = tp <= d.NKV ? d.NKV / tp : 1;
    d.Fl = d.F / tp;
    Range v = split_range(size_t(d.V), tp, tp_rank);
    d.v0 = int(v.lo);
    d.v1 = int(v.hi);
    return d;
}

std::vector<ChunkPlan> stage_chunks(int L, int pp, int v, int stage, const std::string& pp_layers) {
    std::vector<int> counts;
    if (!pp_layers.empty() && v == 1) {
        std::stringstream s(pp_layers);
        std::string item;
        while (std::getline(s, item, ',')) counts.push_back(std::stoi(item));
    } else {
        counts.assign(size_t(pp) * v, L / (pp * v));
    }
    std::vector<ChunkPlan> out;
    for (int c = 0; c < v; ++c) {
        int vs = c * pp + stage;
        ChunkPlan p;
        p.vstage = vs;
        p.layer_begin = 0;
        for (int i = 0; i < vs; ++i) p.layer_begin += counts[i];
        p.layer_end = p.layer_begin + counts[vs];
        p.first = vs == 0;
        p.last = vs == pp * v - 1;
        out.push_back(p);
    }
    return out;
}

const ParamSpec* ParamTable::find(const std::string& name) const {
    for (auto& s : specs)
        if (s.name == name) return &s;
    return nullptr;
}

ParamTable make_param_table(const ModelConfig& m) {
    return make_param_table(m, 1, 0, stage_chunks(m.n_layers, 1, 1, 0, ""), false, 1);
}

ParamTable make_param_table(const ModelConfig& m, int tp, int tp_rank,
                            const std::vector<ChunkPlan>& chunks, bool sp, int pp) {
    const ModelDims d = model_dims(m, tp, tp_rank);
    ParamTable t;
    // ---- the whole model, in checkpoint order ----
    auto logical = [&](const std::string& name, int rows, int cols, int ndim) {
        t.logical.push_back({name, rows, cols, ndim});
        if (ndim == 2 && name != "model.embed_tokens.weight") t.matmul_params += size_t(rows) * cols;
    };
    logical("model.embed_tokens.weight", d.V, d.C, 2);
    for (int l = 0; l < d.L; ++l) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        logical(p + "input_layernorm.weight", d.C, 1, 1);
        logical(p + "self_attn.q_proj.weight", d.NH * d.HD, d.C, 2);
        logical(p + "self_attn.k_proj.weight", d.NKV * d.HD, d.C, 2);
        logical(p + "self_attn.v_proj.weight", d.NKV * d.HD, d.C, 2);
        logical(p + "self_attn.o_proj.weight", d.C, d.NH * d.HD, 2);
        logical(p + "post_attention_layernorm.weight", d.C, 1, 1);
        logical(p + "mlp.gate_proj.weight", d.F, d.C, 2);
        logical(p + "mlp.up_proj.weight", d.F, d.C, 2);
        logical(p + "mlp.down_proj.weight", d.C, d.F, 2);
    }
    logical("model.norm.weight", d.C, 1, 1);
    if (!d.tied) logical("lm_head.weight", d.V, d.C, 2);
    if (d.tied) t.matmul_params += size_t(d.V) * d.C;  // the head still multiplies every token
    // ---- this rank's shards ----
    auto add = [&](const std::string& name, int rows, int cols, int ndim, int lrows, int lcols,
                   int row0, int col0, InitRule init, GradSync sync, bool writer) {
        ParamSpec s;
        s.name = name;
        s.rows = rows; s.cols = cols; s.ndim = ndim;
        s.lrows = lrows; s.lcols = lcols; s.row0 = row0; s.col0 = col0;
        s.init = init;
        s.sync = sync;
        s.writer = writer;
        s.offset = t.total;
        t.total += s.numel();
        t.specs.push_back(s);
    };
    const bool tp0 = tp_rank == 0;
    const GradSync norm_sync = sp && tp > 1 ? GradSync::tp : GradSync::none;
    const int h0 = tp_rank * d.NHl;
    int kv_row0;
    bool kv_writer = true;
    GradSync kv_sync = GradSync::none;
    if (tp <= d.NKV) {
        kv_row0 = tp_rank * d.NKVl * d.HD;
    } else {
        int g = tp_rank / d.kv_group();
        kv_row0 = g * d.HD;
        kv_writer = tp_rank % d.kv_group() == 0;
        kv_sync = GradSync::kv_group;
    }
    bool holds_embedding = false;
    for (const auto& c : chunks)
        if (c.first) holds_embedding = true;
    for (const auto& c : chunks) {
        if (c.first)
            add("model.embed_tokens.weight", d.V, d.C, 2, d.Vl(), d.C, d.v0, 0, InitRule::embedding,
                d.tied && pp > 1 ? GradSync::tied : GradSync::none, true);
        for (int l = c.layer_begin; l < c.layer_end; ++l) {
            std::string p = "model.layers." + std::to_string(l) + ".";
            add(p + "input_layernorm.weight", d.C, 1, 1, d.C, 1, 0, 0, InitRule::ones, norm_sync, tp0);
            add(p + "self_attn.q_proj.weight", d.NH * d.HD, d.C, 2, d.NHl * d.HD, d.C, h0 * d.HD, 0,
                InitRule::normal, GradSync::none, true);
            for (const char* kv : {"k_proj", "v_proj"})
                add(p + "self_attn." + kv + ".weight", d.NKV * d.HD, d.C, 2, d.NKVl * d.HD, d.C, kv_row0, 0,
                    InitRule::normal, kv_sync, kv_writer);
            add(p + "self_attn.o_proj.weight", d.C, d.NH * d.HD, 2, d.C, d.NHl * d.HD, 0, h0 * d.HD,
                InitRule::out_proj, GradSync::none, true);
            add(p + "post_attention_layernorm.weight", d.C, 1, 1, d.C, 1, 0, 0, InitRule::ones, norm_sync, tp0);
            for (const char* gu : {"gate_proj", "up_proj"})
                add(p + "mlp." + gu + ".weight", d.F, d.C, 2, d.Fl, d.C, tp_rank * d.Fl, 0,
                    InitRule::normal, GradSync::none, true);
            add(p + "mlp.down_proj.weight", d.C, d.F, 2, d.C, d.Fl, 0, tp_rank * d.Fl,
                InitRule::out_proj, GradSync::none, true);
        }
        if (c.last) {
            add("model.norm.weight", d.C, 1, 1, d.C, 1, 0, 0, InitRule::ones, norm_sync, tp0);
            if (!d.tied)
                add("lm_head.weight", d.V, d.C, 2, d.Vl(), d.C, d.v0, 0, InitRule::normal,
                    GradSync::none, true);
            else if (!holds_embedding)  // the last stage's copy of the tied table
                add("model.embed_tokens.weight", d.V, d.C, 2, d.Vl(), d.C, d.v0, 0,
                    InitRule::embedding, GradSync::tied, false);
        }
    }
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
        // fan_in: 1/sqrt(in) for weights that multiply activations; a lookup has no fan-in.
        if (init.scheme == "fan_in" && s.init != InitRule::embedding) std = 1.0 / std::sqrt(double(s.cols));
        if (s.init == InitRule::out_proj) std *= out_scale;
        Philox rng{stream_key(seed, s.name)};
        const float fstd = float(std);
        const size_t lc = size_t(s.lcols);
#pragma omp parallel for schedule(static)
        for (size_t i = a; i < b; ++i) {
            size_t li = i - s.offset;
            size_t logical = (s.row0 + li / lc) * size_t(s.cols) + s.col0 + li % lc;
            arena[i] = rng.normal(logical) * fstd;
        }
    }
}

ChunkView chunk_view(const ParamTable& t, const ChunkPlan& c, float* arena) {
    auto at = [&](const std::string& name) {
        const ParamSpec* s = t.find(name);
        if (!s) rank_fail("parameter " + name + " is not held by this rank");
        return arena + s->offset;
    };
    ChunkView v;
    if (c.first) v.wte = at("model.embed_tokens.weight");
    for (int l = c.layer_begin; l < c.layer_end; ++l) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        LayerView lv;
        lv.ln1 = at(p + "input_layernorm.weight");
        lv.wqkv = at(p + "self_attn.q_proj.weight");  // k_proj, v_proj follow contiguously
        lv.wo = at(p + "self_attn.o_proj.weight");
        lv.ln2 = at(p + "post_attention_layernorm.weight");
        lv.wgu = at(p + "mlp.gate_proj.weight");      // up_proj follows contiguously
        lv.wdown = at(p + "mlp.down_proj.weight");
        v.layers.push_back(lv);
    }
    if (c.last) {
        v.norm = at("model.norm.weight");
        v.head = t.find("lm_head.weight") ? at("lm_head.weight") : at("model.embed_tokens.weight");
    }
    return v;
}

}  // namespace quintet
