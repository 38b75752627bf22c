#include "quintet/model/params.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/core/rng.hpp"
#include "quintet/model/block.hpp"
#include "quintet/model/param_groups.hpp"

namespace quintet {

Group replica_group(Replicas r) {
    switch (r) {
    case Replicas::dense: return Group::dp_cp;
    case Replicas::expert: return Group::edp;
    case Replicas::none: return Group::world;
    }
    return Group::world;
}

ModelDims model_dims(const ModelConfig& m, int tp, int tp_rank) {
    ModelDims d{};
    d.V = m.vocab_size;
    d.C = m.d_model;
    d.L = m.n_layers;
    d.NH = m.n_heads;
    d.NKV = m.n_kv_heads == 0 ? m.n_heads : m.n_kv_heads;
    d.HD = m.d_model / m.n_heads;
    const bool mla = m.attention == "mla";
    d.Dqk = mla ? m.qk_nope_dim + m.qk_rope_dim : d.HD;
    d.Dv = mla ? m.v_head_dim : d.HD;
    d.F = m.ffn_width();
    d.mtp = m.mtp_depth;
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

std::vector<ChunkPlan> stage_chunks(int L, int pp, int v, int stage, const std::vector<int>& pp_layers,
                                    Placement placement) {
    std::vector<int> counts;
    if (!pp_layers.empty() && v == 1) {
        counts = pp_layers;
    } else {
        counts.assign(size_t(pp) * v, L / (pp * v));
    }
    std::vector<ChunkPlan> out;
    for (int c = 0; c < v; ++c) {
        int vs = virtual_stage(pp, stage, c, placement);
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

ShardPlan whole_model_plan(const ModelConfig& m) {
    ShardPlan p;
    p.chunks = stage_chunks(m.n_layers, 1, 1, 0, {});
    return p;
}

const ParamSpec* ParamTable::find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? nullptr : &specs[it->second];
}

size_t ParamTable::offset_of(const std::string& name) const {
    const ParamSpec* s = find(name);
    if (!s) rank_fail("parameter " + name + " is not held by this rank");
    return s->offset;
}

int ParamTable::unit_index(const std::string& name) const {
    for (size_t u = 0; u < units.size(); ++u)
        if (units[u].name == name) return int(u);
    return -1;
}

const ParamSpec* ParamTable::writer_spec(const std::string& name) const {
    const ParamSpec* s = find(name);
    return s && s->writer ? s : nullptr;
}

// ---- ParamBuilder ----------------------------------------------------------------------------

ParamBuilder::ParamBuilder(const ModelDims& d, const ShardPlan& plan) : d_(d), plan_(plan) {}

bool ParamBuilder::holds_layer(int layer) const {
    for (const auto& c : plan_.chunks)
        if (layer >= c.layer_begin && layer < c.layer_end) return true;
        else if (layer >= d_.L && c.last) return true;  // the MTP modules live with the head
    return false;
}

ParamSpec ParamBuilder::whole(const std::string& name, int rows, int cols, InitRule init) {
    ParamSpec s;
    s.name = name;
    s.rows = s.lrows = rows;
    s.cols = s.lcols = cols;
    s.ndim = 2;
    s.init = init;
    return s;
}

ParamSpec ParamBuilder::vector(const std::string& name, int n, InitRule init) {
    ParamSpec s = whole(name, n, 1, init);
    s.ndim = 1;
    return s;
}

ParamSpec ParamBuilder::row_shard(const std::string& name, int rows, int cols, int lrows, int row0,
                                  InitRule init) {
    ParamSpec s = whole(name, rows, cols, init);
    s.lrows = lrows;
    s.row0 = row0;
    s.shard = lrows == rows ? Shard::none : Shard::tp;
    return s;
}

ParamSpec ParamBuilder::col_shard(const std::string& name, int rows, int cols, int lcols, int col0,
                                  InitRule init) {
    ParamSpec s = whole(name, rows, cols, init);
    s.lcols = lcols;
    s.col0 = col0;
    s.shard = lcols == cols ? Shard::none : Shard::tp;
    return s;
}

void ParamBuilder::add(const ParamSpec& spec, bool held, bool matmul) {
    // A tensor held twice (the tied embedding's second copy) appears once in the model.
    if (listed_.insert(spec.name).second) {
        t_.logical.push_back({spec.name, spec.rows, spec.cols, spec.ndim, spec.trainable()});
        if (matmul) t_.matmul_params += spec.numel() == 0 ? 0 : size_t(spec.rows) * spec.cols;
    }
    if (!held) return;
    ParamSpec s = spec;
    s.matmul = matmul;
    t_.specs.push_back(s);
    unit_of_spec_.push_back(unit_);
}

ParamTable ParamBuilder::finish() {
    std::vector<ParamSpec> ordered;
    size_t at = 0;
    if (plan_.zero >= 2) {
        // By unit (in the order the units were begun), each unit's regions back to back, every
        // part padded to its group's multiple; inside a part tensors keep the order they were
        // added in.
        std::vector<std::string> names;
        for (const auto& u : unit_of_spec_)
            if (std::find(names.begin(), names.end(), u) == names.end()) names.push_back(u);
        for (int r = 0; r < kNumRegions; ++r) t_.region_used[r] = 0;
        for (const auto& name : names) {
            ParamUnit unit;
            unit.name = name;
            unit.range.lo = at;
            for (int r = 0; r < kNumRegions; ++r) {
                const size_t lo = at;
                for (size_t i = 0; i < t_.specs.size(); ++i)
                    if (unit_of_spec_[i] == name && int(t_.specs[i].replicas) == r) {
                        ParamSpec x = t_.specs[i];
                        x.offset = at;
                        x.unit = int(t_.units.size());
                        at += x.numel();
                        ordered.push_back(x);
                    }
                unit.used[r] = at - lo;
                t_.region_used[r] += at - lo;
                const size_t pad = size_t(std::max(1, plan_.pad[r]));
                at = lo + (at - lo + pad - 1) / pad * pad;
                unit.part[r] = {lo, at};
            }
            unit.range.hi = at;
            t_.units.push_back(unit);
        }
        for (int r = 0; r < kNumRegions; ++r) t_.region[r] = {0, 0};
    } else {
        // Lay the regions out one after another, each padded to its group's multiple; inside a
        // region tensors keep the order they were added in (the model's order).
        for (int r = 0; r < kNumRegions; ++r) {
            const size_t lo = at;
            for (const auto& s : t_.specs)
                if (int(s.replicas) == r) {
                    ParamSpec x = s;
                    x.offset = at;
                    at += x.numel();
                    ordered.push_back(x);
                }
            t_.region_used[r] = at - lo;
            const size_t pad = size_t(std::max(1, plan_.pad[r]));
            at = lo + (at - lo + pad - 1) / pad * pad;
            t_.region[r] = {lo, at};
        }
    }
    t_.specs = std::move(ordered);
    t_.total = at;
    t_.index.clear();
    for (size_t i = 0; i < t_.specs.size(); ++i) t_.index[t_.specs[i].name] = i;
    return std::move(t_);
}

ZeroLayout zero_layout(const ParamTable& table, const int group_size[kNumRegions], const int group_rank[kNumRegions]) {
    ZeroLayout z;
    for (size_t u = 0; u < table.units.size(); ++u) {
        const ParamUnit& unit = table.units[u];
        z.largest_unit = std::max(z.largest_unit, unit.range.size());
        size_t unit_shard = 0;
        for (int r = 0; r < kNumRegions; ++r) {
            const Range part = unit.part[r];
            if (part.size() == 0) continue;
            ZeroPiece p;
            p.unit = int(u), p.region = r, p.part = part;
            if (Replicas(r) == Replicas::none) {
                p.owned = part;  // buffers: every rank holds them whole
            } else {
                const size_t g = size_t(std::max(1, group_size[r])), S = part.size() / g;
                p.owned = {part.lo + S * size_t(group_rank[r]), part.lo + S * size_t(group_rank[r] + 1)};
                unit_shard += S;
            }
            z.pieces.push_back(p);
        }
        z.largest_unit_shard = std::max(z.largest_unit_shard, unit_shard);
    }
    for (auto& p : z.pieces)
        if (Replicas(p.region) != Replicas::none) p.at = z.trainable, z.trainable += p.owned.size();
    for (auto& p : z.pieces)
        if (Replicas(p.region) == Replicas::none) p.at = z.trainable + z.buffers, z.buffers += p.owned.size();
    return z;
}

// ---- the model's tensors ---------------------------------------------------------------------

double model_flops_per_token(const ParamTable& table, const ModelDims& d, int T) {
    return 6.0 * double(table.matmul_params) + 6.0 * (d.L + d.mtp) * double(T) * d.NH * double(d.Dqk + d.Dv);
}

ParamTable make_param_table(const ModelConfig& m) { return make_param_table(m, whole_model_plan(m)); }

ParamTable make_param_table(const ModelConfig& m, const ShardPlan& plan) {
    const ModelDims d = model_dims(m, plan.tp, plan.tp_rank);
    ParamBuilder b(d, plan);
    const bool tp0 = plan.tp_rank == 0;
    // Norm weights are replicated over tp; under sequence parallelism each tp rank sees only its
    // rows, so their gradients are partial sums, completed over tp.
    const GradSync norm_sync = plan.sequence_parallel && plan.tp > 1 ? GradSync::tp : GradSync::none;
    auto norm = [&](const std::string& name, bool held) {
        ParamSpec s = ParamBuilder::vector(name, d.C, InitRule::ones);
        s.sync = norm_sync;
        s.writer = tp0;
        b.add(s, held, false);
    };
    bool holds_first = false, holds_last = false;
    for (const auto& c : plan.chunks) {
        holds_first = holds_first || c.first;
        holds_last = holds_last || c.last;
    }
    // The embedding's vocabulary rows are split over tp (vocab-parallel); with tied embeddings
    // and pp > 1 the last stage holds a second copy, its gradient summed with the first's --
    // unless one stage holds both ends (zbv's V), which needs no copy.
    ParamSpec emb = ParamBuilder::row_shard("model.embed_tokens.weight", d.V, d.C, d.Vl(), d.v0,
                                            InitRule::embedding);
    // The MTP modules read the embedding too (docs/math.md §11): the same second copy.
    const bool second_copy = (d.tied || d.mtp > 0) && plan.pp > 1 && !(holds_first && holds_last);
    if (second_copy) emb.sync = GradSync::tied;
    b.begin_unit("embed");
    b.add(emb, holds_first, false);
    for (int l = 0; l < d.L; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        const bool held = b.holds_layer(l);
        b.begin_unit("layers." + std::to_string(l));
        norm(p + "input_layernorm.weight", held);
        attention_add_params(m, b, l);
        norm(p + "post_attention_layernorm.weight", held);
        feed_forward_add_params(m, b, l);
    }
    // The MTP modules (DeepSeek-V3's names): module k is layer L+k-1 -- RMSNorms of the embedding
    // and of the previous depth's hidden state, the projection of their concatenation 2C -> C,
    // a decoder layer of the model's kinds, and the norm before the shared head.
    for (int k = 0; k < d.mtp; ++k) {
        const int l = d.L + k;
        const std::string p = "model.layers." + std::to_string(l) + ".";
        b.begin_unit("layers." + std::to_string(l));
        norm(p + "enorm.weight", holds_last);
        norm(p + "hnorm.weight", holds_last);
        ParamSpec eh = ParamBuilder::whole(p + "eh_proj.weight", d.C, 2 * d.C, InitRule::normal);
        eh.sync = norm_sync;  // whole on every tp rank, on its own rows under SP
        eh.writer = tp0;
        b.add(eh, holds_last, true);
        norm(p + "input_layernorm.weight", holds_last);
        attention_add_params(m, b, l);
        norm(p + "post_attention_layernorm.weight", holds_last);
        feed_forward_add_params(m, b, l);
        norm(p + "shared_head.norm.weight", holds_last);
    }
    // The final norm and the head are units of their own: under tensor parallelism the head's
    // vocabulary slice differs in size between ranks, the norm's gradient is completed over tp.
    b.begin_unit("norm");
    norm("model.norm.weight", holds_last);
    b.begin_unit("head");
    if (!d.tied) {
        b.add(ParamBuilder::row_shard("lm_head.weight", d.V, d.C, d.Vl(), d.v0, InitRule::normal),
              holds_last, true);
    } else {
        // The head still multiplies every token: it counts in 6·N·P.
        ParamSpec second = emb;
        second.writer = false;
        if (holds_last && !holds_first) b.add(second, true, false);
    }
    if (!d.tied && d.mtp > 0 && second_copy && holds_last) {  // the MTP modules' embedding
        // A unit of its own, as the first stage's: ZeRO reduces the tied pair's slices alike.
        b.begin_unit("embed");
        ParamSpec second = emb;
        second.writer = false;
        b.add(second, true, false);
    }
    ParamTable t = b.finish();
    if (d.tied) t.matmul_params += size_t(d.V) * d.C;
    // Each MTP module's logits multiply every token by the shared head once more.
    t.matmul_params += size_t(d.mtp) * size_t(d.V) * d.C;
    return t;
}

double zero_param_bytes(double arena_floats, const ZeroLayout& z, int zero, bool bf16) {
    const double per = 4.0 + (bf16 ? 2.0 : 0.0);
    if (zero == 2) return arena_floats * per;
    return double(std::max<size_t>(z.trainable + z.buffers, 1)) * 4 +
           double(kZeroGatherWindows) * double(std::max<size_t>(z.largest_unit, 1)) * per;
}

double zero_grad_bytes(const ZeroLayout& z) {
    return double(std::max<size_t>(z.trainable, 1)) * 4 +
           double(kZeroGradWindows) *
               (double(std::max<size_t>(z.largest_unit, 1)) + double(std::max<size_t>(z.largest_unit_shard, 1))) * 4;
}

void init_params(float* arena, const ParamTable& table, const ModelConfig& m,
                 const InitConfig& init, uint64_t seed, size_t lo, size_t hi) {
    if (lo < hi) init_params_range(arena + lo, table, m, init, seed, lo, hi);
}

void init_params_range(float* out, const ParamTable& table, const ModelConfig& m, const InitConfig& init,
                       uint64_t seed, size_t lo, size_t hi) {
    for (const auto& s : table.specs) {
        size_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel());
        if (a >= b) continue;
        if (s.init == InitRule::ones || s.init == InitRule::zeros) {
            const float v = s.init == InitRule::ones ? 1.0f : 0.0f;
            for (size_t i = a; i < b; ++i) out[i - lo] = v;
            continue;
        }
        // The scheme's std for this tensor (model/param_groups.hpp: normal, scaled, fan_in, mup).
        const float fstd = float(tensor_rule(s, m, init).std);
        Philox rng{stream_key(seed, s.name)};
        const size_t lc = size_t(s.lcols);
#pragma omp parallel for schedule(static)
        for (size_t i = a; i < b; ++i) {
            size_t li = i - s.offset;
            size_t logical = (s.row0 + li / lc) * size_t(s.cols) + s.col0 + li % lc;
            out[i - lo] = rng.normal(logical) * fstd;
        }
    }
}

}  // namespace quintet
