// The parameter table: every tensor of the whole model (Hugging Face name, logical shape
// [out, in]) and, for this rank, the shard it holds -- which layers (its pipeline chunks), which
// rows or columns (its tensor-parallel slice, later its experts) -- where that shard sits in the
// flat local arena, and the replica group its gradient is summed over. Gradients and AdamW
// moments use the same layout. Each layer module adds its own tensors (model/mha.cpp,
// model/swiglu.cpp, ...) through ParamBuilder; the sharding rules are in docs/parallelism.md.
//
// The arena is cut into regions, one per replica group (docs/architecture.md, "The seams"): dense
// tensors (gradients summed over dp x cp), then expert tensors (summed over edp), then buffers
// (not trained: no gradient, no decay, checkpointed). Each region is padded to a multiple of its
// group's size, so ZeRO-1 can shard it evenly.
//
// Under parallel.zero >= 2 the arena is laid out by *unit* instead (docs/parallelism.md, "ZeRO"):
// the tensors gathered and reduced together -- the embedding, each layer, the final norm, the
// head -- one after another, each unit's dense, expert and buffer parts back to back, every part
// padded to a multiple of its group's size, so each rank owns an even slice of every part.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "quintet/model/config.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"

namespace quintet {

enum class InitRule { normal, out_proj, ones, zeros, embedding };

// Partial gradients to complete inside the model-parallel ranks before the replica-group sum.
enum class GradSync {
    none,      // a disjoint shard, or a replica whose gradient is already complete
    tp,        // replicated over tp with partial gradients (norm weights under SP, MLA's down-projections)
    kv_group,  // a KV head replicated over the tp ranks that share it (tp > n_kv_heads)
    tied,      // the embedding copy held by the first and the last pipeline stage
};

// Which ranks hold other replicas of a tensor (and sum its gradient with this one).
enum class Replicas {
    dense,   // dp x cp (Group::dp_cp)
    expert,  // the expert-data-parallel group (Group::edp)
    none,    // a buffer: not trained
};
constexpr int kNumRegions = 3;  // one arena region per Replicas value, in this order
Group replica_group(Replicas r);  // dp_cp, edp; world for none (unused)

// The axis a tensor is split over (rows or columns), beyond the pipeline.
enum class Shard { none, tp, ep };

struct LogicalTensor {
    std::string name;
    int rows = 0, cols = 1, ndim = 2;
    bool trainable = true;
    size_t numel() const { return size_t(rows) * cols; }
};

struct ParamSpec {
    std::string name;       // HF name, e.g. model.layers.0.self_attn.q_proj.weight
    int rows = 0, cols = 1; // logical shape (cols = 1 for vectors)
    int ndim = 2;
    int lrows = 0, lcols = 1;  // this rank's shard shape
    int row0 = 0, col0 = 0;    // shard offset in the logical tensor
    InitRule init = InitRule::normal;
    Shard shard = Shard::none;
    GradSync sync = GradSync::none;
    Replicas replicas = Replicas::dense;
    bool writer = true;     // this copy is the one written to checkpoints and counted in norms
    bool matmul = false;    // multiplies every token: counts in P of 6·N·P
    size_t offset = 0;      // into the local arena, in floats
    int unit = -1;          // zero >= 2: index into ParamTable::units
    size_t numel() const { return size_t(lrows) * lcols; }
    bool trainable() const { return replicas != Replicas::none; }
    bool decay() const { return ndim >= 2; }  // weight decay on rank >= 2 only (docs/math.md §6.1)
};

// Resolved model dims (defaults applied), global and this rank's tensor-parallel share.
struct ModelDims {
    int V, C, L, NH, NKV, HD, F;
    int Dqk, Dv;                 // attention head dims of q.k and of v (MHA: HD, HD; MLA: nope+rope, v)
    int mtp = 0;                 // multi-token prediction modules (layers L..L+mtp-1)
    bool tied;
    int tp = 1, tp_rank = 0;
    int NHl, NKVl, Fl;           // local query heads, kv heads, ffn width
    int v0 = 0, v1 = 0;          // local vocabulary rows [v0, v1)
    int Vl() const { return v1 - v0; }
    int qkv_local() const { return (NHl + 2 * NKVl) * HD; }
    int kv_group() const { return tp > NKV ? tp / NKV : 1; }  // ranks sharing one kv head
    int kv_head0() const { return tp <= NKV ? tp_rank * NKVl : tp_rank / kv_group(); }
};
ModelDims model_dims(const ModelConfig& m, int tp = 1, int tp_rank = 0);

// One contiguous run of layers held by a rank: pipeline virtual stage `vstage`.
struct ChunkPlan {
    int vstage = 0;
    int layer_begin = 0, layer_end = 0;
    bool first = true, last = true;  // holds the embedding / the final norm + LM head
};
// Chunks of `stage` for pp stages, v virtual stages each (chunk c = virtual stage c*pp + stage,
// or under the V of zbv (Placement::vee) stage / 2pp-1-stage); `pp_layers` (layer counts per
// stage, v = 1 only; empty = the even split) overrides it.
std::vector<ChunkPlan> stage_chunks(int n_layers, int pp, int v, int stage, const std::vector<int>& pp_layers,
                                    Placement placement = Placement::loop);

// What this rank holds of the model, and how its regions are padded.
struct ShardPlan {
    int tp = 1, tp_rank = 0;
    bool sequence_parallel = false;
    int pp = 1;
    std::vector<ChunkPlan> chunks;  // this rank's pipeline chunks
    int ep = 1, ep_rank = 0;
    int pad[kNumRegions] = {1, 1, 1};  // region r is padded to a multiple of pad[r] floats
    int zero = 0;                      // parallel.zero: >= 2 lays the arena out by unit
};

// zero >= 2: a run of tensors gathered (zero 3) and reduced together -- "embed", "layers.<l>",
// "norm", "head" -- laid out contiguously: part[r] is its region-r tensors, padded to a multiple
// of pad[r] (empty when it has none); range = all its parts.
struct ParamUnit {
    std::string name;
    Range range;
    Range part[kNumRegions];
    size_t used[kNumRegions] = {0, 0, 0};  // floats of tensors at the start of each part
};
ShardPlan whole_model_plan(const ModelConfig& m);  // one rank, tp = pp = 1

struct ParamTable {
    std::vector<LogicalTensor> logical;  // the whole model, in checkpoint order
    std::vector<ParamSpec> specs;        // this rank's shards, in arena order
    Range region[kNumRegions];           // each region's floats in the arena, padded (zero < 2)
    size_t region_used[kNumRegions] = {0, 0, 0};  // floats of region r's tensors (their sum over units, zero >= 2)
    std::vector<ParamUnit> units;        // zero >= 2: this rank's units in arena order (else empty)
    int unit_index(const std::string& name) const;  // -1 when this rank holds none of it
    size_t total = 0;                    // floats in the local arena (all regions, padded)
    size_t matmul_params = 0;            // P of 6·N·P over the whole model
    const ParamSpec* find(const std::string& name) const;  // nullptr when not held here
    size_t offset_of(const std::string& name) const;       // fails when not held here
    const ParamSpec* writer_spec(const std::string& name) const;  // the writer copy, or null
    std::unordered_map<std::string, size_t> index;         // name -> index in specs
};

// Collects the tensors of a model as its modules describe them, then lays out the arena.
class ParamBuilder {
public:
    ParamBuilder(const ModelDims& d, const ShardPlan& plan);
    const ModelDims& dims() const { return d_; }
    const ShardPlan& plan() const { return plan_; }
    bool holds_layer(int layer) const;
    // zero >= 2: the tensors added from now on belong to unit `name` (see ParamUnit).
    void begin_unit(const std::string& name) { unit_ = name; }
    // A tensor of the whole model, also held here when `held`: its shard fields (lrows, ...)
    // describe this rank's part. Tensors are laid out in the order they are added, per region.
    void add(const ParamSpec& spec, bool held, bool matmul);
    // Parameters a token multiplies beyond the matmul tensors added (MoE: k of E experts).
    void add_active(size_t n) { t_.matmul_params += n; }
    // Shorthands for the common shards: the whole tensor; rows [row0, row0+lrows); columns.
    static ParamSpec whole(const std::string& name, int rows, int cols, InitRule init);
    static ParamSpec vector(const std::string& name, int n, InitRule init);
    static ParamSpec row_shard(const std::string& name, int rows, int cols, int lrows, int row0,
                               InitRule init);
    static ParamSpec col_shard(const std::string& name, int rows, int cols, int lcols, int col0,
                               InitRule init);
    ParamTable finish();

private:
    ModelDims d_;
    ShardPlan plan_;
    ParamTable t_;
    std::unordered_set<std::string> listed_;
    std::string unit_;
    std::vector<std::string> unit_of_spec_;  // per entry of t_.specs, its unit's name
};

// A range of the local arena and where the AdamW moments of its first element sit in the
// moment arrays (moment of arena element i = state_index + (i - arena.lo)): what a rank writes
// to or reads from a checkpoint.
struct ArenaRange {
    Range arena;
    size_t state_index = 0;
};

// PaLM-convention model FLOPs per token (docs/math.md §1): 6*P + 6*L*T*NH*(d_qk + d_v), P the
// parameters a token multiplies (table.matmul_params).
double model_flops_per_token(const ParamTable& table, const ModelDims& d, int seq_len);

// This rank's shards of the model (modules from the deck's model.attention and feed-forward kinds).
ParamTable make_param_table(const ModelConfig& m, const ShardPlan& plan);
ParamTable make_param_table(const ModelConfig& m);  // the whole model on one rank

// Fill `arena` with the layout-invariant initial values of local elements [lo, hi):
// logical element i of tensor `name` = N(0,1) from Philox(seed, name, i) times the rule's std.
void init_params(float* arena, const ParamTable& table, const ModelConfig& m,
                 const InitConfig& init, uint64_t seed, size_t lo, size_t hi);
// The same values into out[0, hi - lo) (a ZeRO-3 shard holds only its slices of the arena).
void init_params_range(float* out, const ParamTable& table, const ModelConfig& m, const InitConfig& init,
                       uint64_t seed, size_t lo, size_t hi);

// ZeRO >= 2 (docs/parallelism.md, "ZeRO"): the slices of the arena this rank owns -- of every
// unit's every part, the rank-th of group-size equal slices (buffer parts are not split: owned
// whole) -- and where they sit, back to back, in the rank's shard arrays (gradient shard,
// moments; under zero 3 the parameters themselves). Pure arithmetic on the table, shared by the
// trainer and the planner.
struct ZeroPiece {
    int unit = 0, region = 0;
    Range part;        // the whole part in the arena
    Range owned;       // this rank's slice of it
    size_t at = 0;     // where the slice sits in the shard arrays
};
struct ZeroLayout {
    std::vector<ZeroPiece> pieces;     // in unit order; trainable pieces first within a unit
    size_t trainable = 0;              // shard floats of the trainable pieces: [0, trainable)
    size_t buffers = 0;                // then the buffer pieces: [trainable, trainable + buffers)
    size_t largest_unit = 0;           // floats of the largest unit (a gather / gradient window)
    size_t largest_unit_shard = 0;     // of the largest unit's trainable slices
};
// group_size[r], group_rank[r]: region r's replica group (dense: dp x cp, expert: edp).
ZeroLayout zero_layout(const ParamTable& table, const int group_size[kNumRegions], const int group_rank[kNumRegions]);
// Windows kept by ZeRO >= 2 (each the largest unit): gradients being reduced, and (zero 3) the
// parameters of the unit in use and of the one prefetched.
constexpr int kZeroGradWindows = 2, kZeroGatherWindows = 2;
// Bytes a rank holds under ZeRO >= 2 (train/zero_state allocates exactly these): the parameters
// (zero 2: the whole arena; zero 3: its slices and the gather windows, with their bf16 copies
// under bf16) and the gradients (its slices, the windows and their reduce-scatter outputs).
double zero_param_bytes(double arena_floats, const ZeroLayout& z, int zero, bool bf16);  // arena: table.total
double zero_grad_bytes(const ZeroLayout& z);

}  // namespace quintet
