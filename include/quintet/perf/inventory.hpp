// What one rank of a layout holds and computes, for the planner (perf/planner.cpp): its
// parameters by arena region, its GEMMs' shapes, its activation buffers as the layer modules
// declare them, and how many microbatches each of its pipeline chunks keeps in flight.
//
// Planning tens of thousands of ranks visits thousands of layouts, so nothing here is rebuilt
// per layout: decoder layers of one kind (dense or MoE) are identical, so a rank's parameters
// are composed from one layer of each kind, taken from the parameter table of a small model with
// the same shapes (model/params.cpp, the trainer's own table; tests/perf/test_inventory.cpp
// holds the composition to the full table to the float), and chunk buffers and in-flight counts
// are cached by what they depend on.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "quintet/model/buffers.hpp"
#include "quintet/model/config.hpp"
#include "quintet/model/muon_layout.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/transformer.hpp"

namespace quintet {

// Floats of a rank's arena by region (model/params.hpp: dense, expert, buffers), unpadded.
struct RegionFloats {
    std::array<double, kNumRegions> r{0, 0, 0};
    RegionFloats& operator+=(const RegionFloats& o) {
        for (int i = 0; i < kNumRegions; ++i) r[size_t(i)] += o.r[size_t(i)];
        return *this;
    }
    double sum() const { return r[0] + r[1] + r[2]; }
    double trainable() const { return r[0] + r[1]; }
};

// A matmul of this rank: its weight is [out, in] (the local shard); the rows it multiplies are
// the microbatch's gathered rows (N), this rank's own rows (Nr: the router and shared experts of
// a MoE block, which route their own rows), or one local expert's share of the routed rows.
enum class GemmRows { gathered, own, expert };
struct Gemm {
    GemmRows rows = GemmRows::gathered;
    double out = 0, in = 0;
    double count = 1;  // weights of this shape and kind (a rank's experts share one entry)
    std::string name;  // the first such weight's name in the small model
};

// A matrix Muon takes (model/param_groups.hpp muon_takes) as a layer kind holds it on this rank:
// its whole shape, this rank's shard, how many tp ranks hold each element (1: split; tp: whole on
// every tp rank; the kv group: shared kv heads) and its region.
struct MuonEntry {
    MuonMatrix whole;
    double shard = 0;
    int tp_copies = 1;
    int region = 0;
};

struct LayerKind {
    bool present = false;      // some layer of the model is of this kind
    RegionFloats params;       // one such layer's floats on this rank
    RegionFloats muon;         // of which the matrices Muon takes under train.optimizer = muon
    double active = 0;         // parameters of one such layer a token multiplies (whole model)
    std::vector<Gemm> gemms;   // its matmuls on this rank, one entry per shape and kind
    std::vector<MuonEntry> muon_matrices;  // in the parameter table's order
};

// One rank's share of the model's tensors under (tp, ep): tp rank 0 and ep rank 0, the largest
// shards (the vocabulary's first rows take the remainder).
class ModelInventory {
public:
    ModelInventory(const ModelConfig& m, int tp, int ep, bool sequence_parallel);
    const LayerKind& dense() const { return dense_; }
    const LayerKind& moe() const { return moe_; }
    const LayerKind& kind(int layer) const { return moe_layer(m_, layer) ? moe_ : dense_; }
    // One multi-token prediction module (model.mtp_depth; its pass through the shared head is
    // not in it): the last chunk holds mtp_depth of them.
    const LayerKind& mtp() const { return mtp_; }
    // This rank's floats when it holds `chunks` (a pipeline stage; pp stages in all).
    RegionFloats stage_params(const std::vector<ChunkPlan>& chunks, int pp) const;
    // The same by ZeRO-2/3 unit, in the arena's unit order (model/params.cpp: the embedding,
    // each layer, the final norm, the head or a tied embedding's second copy); units this rank
    // holds nothing of are left out.
    struct Unit {
        RegionFloats f;
        bool layer = false;
    };
    std::vector<Unit> stage_units(const std::vector<ChunkPlan>& chunks, int pp) const;
    // Muon (train.optimizer = muon): the floats of the matrices it takes on this rank, and those
    // matrices by region (dense, expert), layer by layer in the parameter table's order -- the
    // lists of the stage's Muon groups.
    struct MuonStage {
        RegionFloats floats;
        std::vector<MuonEntry> dense, expert;
    };
    MuonStage stage_muon(const std::vector<ChunkPlan>& chunks) const;
    // The LM head's matmul (last chunk): [Vl, C].
    const Gemm& head() const { return head_; }
    double head_active() const { return head_active_; }  // the LM head's matmul parameters (whole model)
    int tp() const { return tp_; }

private:
    ModelConfig m_;
    int tp_;
    LayerKind dense_, moe_, mtp_;
    RegionFloats embed_, final_norm_, head_params_;
    double head_active_ = 0;
    Gemm head_;
};

// The whole model's parameter counts (tp = pp = 1): every tensor, and those a token multiplies
// (P of 6·N·P: k of E experts), exactly as make_param_table counts them.
struct ModelCounts {
    double total = 0, active = 0;
};
ModelCounts model_counts(const ModelConfig& m);

// The most microbatches each chunk of `stage` holds at once under the schedule (the trainer
// allocates a slot per microbatch in flight): replayed from the schedule's own action list
// (parallel/pipeline_schedule). Beyond a few groups of pp microbatches the counts no longer
// grow, so m is capped there (tests/perf/test_inventory.cpp checks the cap against the full
// list). Cached.
std::vector<int> chunk_slots(const std::string& kind, int pp, int stage, int m, int v);

// ZeRO-2/3 (model/params.hpp ZeroLayout): the sizes of a rank's slices composed from its units,
// each unit's region parts padded to their group's multiple (group[r]: dense dp x cp, expert
// edp, buffers 1) -- the arena's floats in `arena`; the pieces themselves are not listed.
ZeroLayout zero_sizes(const std::vector<ModelInventory::Unit>& units, const double group[kNumRegions], double* arena);

// A chunk's activation buffers (model/slot_store.hpp chunk_buffers), cached by what they depend
// on: the buffer shape, the chunk's layer counts of each kind and whether it is first / last.
class BufferCache {
public:
    const ChunkBuffers& get(const ModelConfig& m, const ModelDims& d, const ChunkPlan& c, const BufferShape& s,
                            bool documents);

private:
    std::map<std::string, std::unique_ptr<ChunkBuffers>> cache_;
};

}  // namespace quintet
