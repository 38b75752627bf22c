#include "quintet/perf/inventory.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "quintet/model/param_groups.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"

namespace quintet {

namespace {

// The small model: layer 0 dense and layer 1 MoE (or one layer of the only kind), the same
// shapes otherwise.
ModelConfig small_model(const ModelConfig& m, int* dense_layer, int* moe_layer_index) {
    bool any_dense = false, any_moe = false;
    for (int l = 0; l < m.n_layers; ++l) (moe_layer(m, l) ? any_moe : any_dense) = true;
    ModelConfig s = m;
    s.mtp_depth = 0;  // the MTP module is read on its own (ModelInventory::mtp)
    *dense_layer = *moe_layer_index = -1;
    if (any_dense && any_moe) {
        s.n_layers = 2;
        s.moe.layers.parse("1");
        *dense_layer = 0, *moe_layer_index = 1;
    } else {
        s.n_layers = 1;
        if (any_moe) s.moe.layers.parse("all"), *moe_layer_index = 0;
        else *dense_layer = 0;
    }
    return s;
}

RegionFloats floats_of(const ParamSpec& s) {
    RegionFloats f;
    f.r[size_t(int(s.replicas))] = double(s.numel());
    return f;
}

GemmRows rows_of(const std::string& name) {
    if (name.find(".mlp.experts.") != std::string::npos) return GemmRows::expert;
    if (name.find(".mlp.gate.weight") != std::string::npos || name.find(".mlp.shared_experts.") != std::string::npos)
        return GemmRows::own;
    return GemmRows::gathered;
}

// One layer of each kind, the embedding, the final norm and the head, read off the small
// model's parameter table for this rank.
struct Parts {
    LayerKind dense, moe, mtp;
    RegionFloats embed, final_norm, head;
    double head_active = 0;
};

Parts read_parts(const ModelConfig& s, int dl, int ml, int tp, int ep, bool sequence_parallel, int mtp_layer = -1) {
    ShardPlan plan;
    plan.tp = tp;
    plan.sequence_parallel = sequence_parallel;
    plan.pp = 1;
    plan.chunks = stage_chunks(s.n_layers, 1, 1, 0, {});
    plan.ep = ep;
    const ParamTable t = make_param_table(s, plan);
    Parts p;
    p.dense.present = dl >= 0, p.moe.present = ml >= 0;
    const std::string pd = "model.layers." + std::to_string(dl) + ".", pm = "model.layers." + std::to_string(ml) + ".";
    const std::string pt = "model.layers." + std::to_string(mtp_layer) + ".";
    double matmul_logical = 0;
    for (const ParamSpec& spec : t.specs) {
        const std::string& n = spec.name;
        const double logical = spec.matmul ? double(spec.rows) * spec.cols : 0;
        matmul_logical += logical;
        LayerKind* k = nullptr;
        if (dl >= 0 && n.compare(0, pd.size(), pd) == 0) k = &p.dense;
        else if (ml >= 0 && n.compare(0, pm.size(), pm) == 0) k = &p.moe;
        else if (mtp_layer >= 0 && n.compare(0, pt.size(), pt) == 0) k = &p.mtp;
        if (k) {
            k->params += floats_of(spec);
            k->active += logical;
            if (muon_takes(spec)) {
                k->muon += floats_of(spec);
                const int copies = int(std::lround(double(tp) * double(spec.numel()) / (double(spec.rows) * spec.cols)));
                k->muon_matrices.push_back({{spec.rows, spec.cols}, double(spec.numel()), std::max(copies, 1),
                                            int(spec.replicas)});
            }
            // Every matrix of a layer is a GEMM's weight (norms are vectors).
            if (spec.ndim == 2 && spec.numel() > 0) {
                const Gemm g{rows_of(n), double(spec.lrows), double(spec.lcols), 1, n};
                auto same = std::find_if(k->gemms.begin(), k->gemms.end(), [&](const Gemm& o) {
                    return o.rows == g.rows && o.out == g.out && o.in == g.in &&
                           (o.name.find("shared_experts") != std::string::npos) == (n.find("shared_experts") != std::string::npos);
                });
                if (same != k->gemms.end()) same->count += 1;
                else k->gemms.push_back(g);
            }
            continue;
        }
        if (n == "model.embed_tokens.weight") p.embed += floats_of(spec);
        else if (n == "model.norm.weight") p.final_norm += floats_of(spec);
        else if (n == "lm_head.weight") p.head += floats_of(spec), p.head_active += logical;
    }
    // What a token multiplies beyond the matrices it holds (model/moe.cpp: the router and k of
    // the E experts) went into matmul_params alone; a tied head counts there too.
    double extra = double(t.matmul_params) - matmul_logical;
    if (s.tie_embeddings) p.head_active += double(s.vocab_size) * s.d_model;
    extra -= s.tie_embeddings ? double(s.vocab_size) * s.d_model : 0;
    extra -= double(s.mtp_depth) * s.vocab_size * s.d_model;  // the MTP module's pass through the head
    // The extra active parameters are the MoE layers' (k of E experts); read with an MTP module
    // (after one layer of its kind), half of them are the module's.
    if (mtp_layer >= 0) p.mtp.active += extra / 2;
    else p.moe.active += extra;
    return p;
}

}  // namespace

ModelInventory::ModelInventory(const ModelConfig& m, int tp, int ep, bool sequence_parallel) : m_(m), tp_(tp) {
    int dl = -1, ml = -1;
    ModelConfig s = small_model(m, &dl, &ml);
    const int E = m.moe.experts;
    Parts p;
    if (ml < 0 || E <= 2 * ep) {
        p = read_parts(s, dl, ml, tp, ep, sequence_parallel);
    } else {
        // Many experts: every count of a MoE layer is affine in E (the router's E rows, the
        // aux-free biases, E/ep experts per rank), so two small expert counts give it exactly
        // without listing thousands of experts.
        s.moe.experts = ep;
        const Parts a = read_parts(s, dl, ml, tp, ep, sequence_parallel);
        s.moe.experts = 2 * ep;
        p = read_parts(s, dl, ml, tp, ep, sequence_parallel);
        const double x = double(E - 2 * ep) / ep;  // steps of ep experts beyond the second table
        for (int r = 0; r < kNumRegions; ++r)
            p.moe.params.r[size_t(r)] += x * (p.moe.params.r[size_t(r)] - a.moe.params.r[size_t(r)]);
        p.moe.active += x * (p.moe.active - a.moe.active);
        for (int r = 0; r < kNumRegions; ++r)
            p.moe.muon.r[size_t(r)] += x * (p.moe.muon.r[size_t(r)] - a.moe.muon.r[size_t(r)]);
        // The rank's experts' matrices: the first expert's three (gate, up, down), E/ep times.
        std::vector<MuonEntry> list, first;
        for (const MuonEntry& e : p.moe.muon_matrices) {
            if (e.region != int(Replicas::expert)) list.push_back(e);
            else if (first.size() < 3) first.push_back(e);
        }
        for (int e = 0; e < E / ep; ++e) list.insert(list.end(), first.begin(), first.end());
        p.moe.muon_matrices = std::move(list);
        for (Gemm& g : p.moe.gemms) {
            if (g.rows == GemmRows::expert) g.count *= double(E) / (2.0 * ep);
            else if (g.name.find(".mlp.gate.weight") != std::string::npos) g.out = E;
        }
    }
    dense_ = p.dense, moe_ = p.moe;
    if (m.mtp_depth > 0) {
        // One MTP module (model/params.cpp), read off a model of the last layer's kind and one
        // module: its norms, projection and layer (its MoE counts, like the layers', affine in E).
        ModelConfig t = m;
        t.n_layers = 1;
        t.mtp_depth = 1;
        if (moe_layer(m, m.n_layers - 1)) t.moe.layers.parse("all");
        else t.moe.experts = 0;
        const bool many = t.moe.experts > 2 * ep;
        if (many) t.moe.experts = 2 * ep;
        Parts q = read_parts(t, -1, -1, tp, ep, sequence_parallel, 1);
        if (many) {
            t.moe.experts = ep;
            const Parts a = read_parts(t, -1, -1, tp, ep, sequence_parallel, 1);
            const double x = double(E - 2 * ep) / ep;
            for (int r = 0; r < kNumRegions; ++r)
                q.mtp.params.r[size_t(r)] += x * (q.mtp.params.r[size_t(r)] - a.mtp.params.r[size_t(r)]);
            q.mtp.active += x * (q.mtp.active - a.mtp.active);
            for (Gemm& g : q.mtp.gemms) {
                if (g.rows == GemmRows::expert) g.count *= double(E) / (2.0 * ep);
                else if (g.name.find(".mlp.gate.weight") != std::string::npos) g.out = E;
            }
        }
        mtp_ = q.mtp;
    }
    embed_ = p.embed, final_norm_ = p.final_norm, head_params_ = p.head;
    head_active_ = p.head_active;
    const ModelDims d = model_dims(m, tp, 0);
    head_ = {GemmRows::gathered, double(d.Vl()), double(d.C), 1, m.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"};
}

RegionFloats ModelInventory::stage_params(const std::vector<ChunkPlan>& chunks, int pp) const {
    RegionFloats f;
    bool first = false, last = false;
    for (const auto& c : chunks) {
        first = first || c.first, last = last || c.last;
        for (int l = c.layer_begin; l < c.layer_end; ++l) f += kind(l).params;
    }
    if (first) f += embed_;
    if (last) f += final_norm_, f += head_params_;
    for (int k = 0; last && k < m_.mtp_depth; ++k) f += mtp_.params;
    // Tied embeddings (or MTP) across stages: the last stage holds a second copy of the embedding.
    if ((m_.tie_embeddings || m_.mtp_depth > 0) && pp > 1 && last && !first) f += embed_;
    return f;
}

std::vector<ModelInventory::Unit> ModelInventory::stage_units(const std::vector<ChunkPlan>& chunks, int pp) const {
    bool first = false, last = false;
    for (const auto& c : chunks) first = first || c.first, last = last || c.last;
    std::vector<Unit> u;
    auto add = [&](const RegionFloats& f, bool layer) {
        if (f.sum() > 0) u.push_back({f, layer});
    };
    if (first) add(embed_, false);
    // Layers in model order whatever the chunk order (zbv's stage holds chunks s and 2pp-1-s).
    std::vector<int> layers;
    for (const auto& c : chunks)
        for (int l = c.layer_begin; l < c.layer_end; ++l) layers.push_back(l);
    std::sort(layers.begin(), layers.end());
    for (int l : layers) add(kind(l).params, true);
    if (last) {
        for (int k = 0; k < m_.mtp_depth; ++k) add(mtp_.params, true);  // units layers.<n_layers + k>
        add(final_norm_, false);
        add(head_params_, false);
        // The embedding's second copy: the tied head (unit "head"), or what the MTP modules read
        // (unit "embed").
        if ((m_.tie_embeddings || m_.mtp_depth > 0) && pp > 1 && !first) add(embed_, false);
    }
    return u;
}

ModelInventory::MuonStage ModelInventory::stage_muon(const std::vector<ChunkPlan>& chunks) const {
    std::vector<int> layers;
    for (const auto& c : chunks)
        for (int l = c.layer_begin; l < c.layer_end; ++l) layers.push_back(l);
    std::sort(layers.begin(), layers.end());
    MuonStage st;
    for (int l : layers) {
        st.floats += kind(l).muon;
        for (const MuonEntry& e : kind(l).muon_matrices)
            (e.region == int(Replicas::expert) ? st.expert : st.dense).push_back(e);
    }
    return st;
}

ZeroLayout zero_sizes(const std::vector<ModelInventory::Unit>& units, const double group[kNumRegions], double* arena) {
    ZeroLayout z;
    double total = 0;
    for (const auto& u : units) {
        double range = 0, shard = 0;
        for (int r = 0; r < kNumRegions; ++r) {
            const double g = Replicas(r) == Replicas::none ? 1 : std::max(1.0, group[r]);
            const double part = std::ceil(u.f.r[size_t(r)] / g) * g;
            range += part;
            if (Replicas(r) == Replicas::none) z.buffers += size_t(part);
            else shard += part / g;
        }
        total += range;
        z.trainable += size_t(shard);
        z.largest_unit = std::max(z.largest_unit, size_t(range));
        z.largest_unit_shard = std::max(z.largest_unit_shard, size_t(shard));
    }
    if (arena) *arena = total;
    return z;
}

ModelCounts model_counts(const ModelConfig& m) {
    // The whole model on one rank, composed like a rank's share (exact: tests/perf/test_inventory.cpp).
    const ModelInventory inv(m, 1, 1, false);
    ModelCounts c;
    const RegionFloats whole = inv.stage_params(stage_chunks(m.n_layers, 1, 1, 0, {}), 1);
    c.total = whole.trainable();
    c.active = inv.head_active();
    for (int l = 0; l < m.n_layers; ++l) c.active += inv.kind(l).active;
    c.active += double(m.mtp_depth) * (inv.mtp().active + double(m.vocab_size) * m.d_model);
    return c;
}

std::vector<int> chunk_slots(const std::string& kind, int pp, int stage, int m, int v) {
    // 1F1B holds at most pp - stage; the interleaved schedule's warm-up is under 3 groups of pp
    // microbatches and its steady state repeats every group, so 8 groups show every peak.
    // zb_h1 and zbv hold a microbatch from its forward to its W and settle as fast.
    const int mc = kind == "1f1b" ? std::min(m, pp + 1)
                   : kind == "interleaved" || kind == "zb_h1" || kind == "zbv" ? std::min(m, 8 * pp)
                                                                             : m;
    static std::mutex mu;
    static std::map<std::tuple<std::string, int, int, int, int>, std::vector<int>> memo;
    const auto key = std::make_tuple(kind, pp, stage, mc, v);
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = memo.find(key); it != memo.end()) return it->second;
    }
    std::vector<int> now(size_t(std::max(1, v)), 0), peak(size_t(std::max(1, v)), 0);
    if (kind == "gpipe") {
        peak[0] = m;  // every forward before any backward
    } else {
        for (const Action& a : make_schedule(kind, pp, stage, mc, v)) {
            const size_t c = size_t(a.chunk) < now.size() ? size_t(a.chunk) : 0;
            if (a.op == Op::forward) peak[c] = std::max(peak[c], ++now[c]);
            else if (a.op == Op::backward || a.op == Op::backward_weight) --now[c];  // W frees what F kept
        }
    }
    std::lock_guard<std::mutex> lock(mu);
    memo.emplace(key, peak);
    return peak;
}

const ChunkBuffers& BufferCache::get(const ModelConfig& m, const ModelDims& d, const ChunkPlan& c, const BufferShape& s,
                                     bool documents) {
    int nd = 0, nm = 0;
    for (int l = c.layer_begin; l < c.layer_end; ++l) (moe_layer(m, l) ? nm : nd) += 1;
    const std::string key = std::to_string(d.tp) + "," + std::to_string(s.B) + "," + std::to_string(s.T) + "," +
                            std::to_string(s.N) + "," + std::to_string(s.Nr) + "," + std::to_string(s.bf16) + "," +
                            std::to_string(s.sp) + "," + std::to_string(int(s.recompute)) + "," + std::to_string(s.cp) +
                            "," + std::to_string(s.mla_latent) + "," + std::to_string(s.ep) + "," +
                            std::to_string(s.max_positions) + "," + std::to_string(documents) + "," + std::to_string(s.split_bw) + "," +
                            std::to_string(nd) + "," + std::to_string(nm) + "," + std::to_string(c.first) + "," +
                            std::to_string(c.last);
    auto it = cache_.find(key);
    if (it == cache_.end())
        it = cache_.emplace(key, std::make_unique<ChunkBuffers>(chunk_buffers(m, d, c, s, documents))).first;
    return *it->second;
}

}  // namespace quintet
