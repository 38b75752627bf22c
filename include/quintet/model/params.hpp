// The parameter table: every tensor of the whole model (Hugging Face name, logical shape
// [out, in]) and, for this rank, the shard it holds -- which layers (its pipeline chunks), which
// rows or columns (its tensor-parallel slice) -- and where that shard sits in the flat local
// arena. Gradients and AdamW moments use the same layout. q/k/v are adjacent (one fused GEMM),
// as are gate/up. Sharding rules: docs/parallelism.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/model/config.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/train/train_config.hpp"

namespace quintet {

enum class InitRule { normal, out_proj, ones, embedding };

// How this rank's copy of a tensor relates to the other ranks' copies, beyond DP.
enum class GradSync {
    none,      // a disjoint shard, or a replica whose gradient is already complete
    tp,        // replicated over tp with partial gradients (norm weights under sequence parallel)
    kv_group,  // a KV head replicated over the tp ranks that share it (tp > n_kv_heads)
    tied,      // the embedding copy held by the first and the last pipeline stage
};

struct LogicalTensor {
    std::string name;
    int rows = 0, cols = 1, ndim = 2;
    size_t numel() const { return size_t(rows) * cols; }
};

struct ParamSpec {
    std::string name;       // HF name, e.g. model.layers.0.self_attn.q_proj.weight
    int rows = 0, cols = 1; // logical shape (cols = 1 for vectors)
    int ndim = 2;
    int lrows = 0, lcols = 1;  // this rank's shard shape
    int row0 = 0, col0 = 0;    // shard offset in the logical tensor
    InitRule init = InitRule::normal;
    GradSync sync = GradSync::none;
    bool writer = true;     // this copy is the one written to checkpoints and counted in norms
    size_t offset = 0;      // into the local arena, in floats
    size_t numel() const { return size_t(lrows) * lcols; }
    bool decay() const { return ndim >= 2; }  // weight decay on rank >= 2 only (DESIGN §3)
};

// Resolved model dims (defaults applied), global and this rank's tensor-parallel share.
struct ModelDims {
    int V, C, L, NH, NKV, HD, F;
    bool tied;
    int tp = 1, tp_rank = 0;
    int NHl, NKVl, Fl;           // local query heads, kv heads, ffn width
    int v0 = 0, v1 = 0;          // local vocabulary rows [v0, v1)
    int Vl() const { return v1 - v0; }
    int qkv_local() const { return (NHl + 2 * NKVl) * HD; }
    int kv_group() const { return tp > NKV ? tp / NKV : 1; }  // ranks sharing one kv head
};
ModelDims model_dims(const ModelConfig& m, int tp = 1, int tp_rank = 0);

// One contiguous run of layers held by a rank: pipeline virtual stage `vstage`.
struct ChunkPlan {
    int vstage = 0;
    int layer_begin = 0, layer_end = 0;
    bool first = true, last = true;  // holds the embedding / the final norm + LM head
};
// Chunks of `stage` for pp stages, v virtual stages each (chunk c = virtual stage c*pp + stage);
// `pp_layers` (comma list, v = 1 only) overrides the even split.
std::vector<ChunkPlan> stage_chunks(int n_layers, int pp, int v, int stage, const std::string& pp_layers);

struct ParamTable {
    std::vector<LogicalTensor> logical;  // the whole model, in checkpoint order
    std::vector<ParamSpec> specs;        // this rank's shards
    size_t total = 0;                    // floats in the local arena
    size_t matmul_params = 0;            // P of 6·N·P over the whole model
    const ParamSpec* find(const std::string& name) const;  // nullptr when not held here
};

// The whole model on one rank (tp = pp = 1).
ParamTable make_param_table(const ModelConfig& m);
// This rank's shards: tensor-parallel slice `tp_rank` of `tp`, the given pipeline chunks.
ParamTable make_param_table(const ModelConfig& m, int tp, int tp_rank,
                            const std::vector<ChunkPlan>& chunks, bool sequence_parallel, int pp);

// Fill `arena` with the layout-invariant initial values of local elements [lo, hi):
// logical element i of tensor `name` = N(0,1) from Philox(seed, name, i) times the rule's std.
void init_params(float* arena, const ParamTable& table, const ModelConfig& m,
                 const InitConfig& init, uint64_t seed, size_t lo, size_t hi);

// Views of one layer's local tensors in an arena with this table's layout.
struct LayerView {
    float* ln1;     // [C]                       input_layernorm
    float* wqkv;    // [(NHl+2NKVl)*HD, C]      q_proj ; k_proj ; v_proj (local rows)
    float* wo;      // [C, NHl*HD]               (local columns)
    float* ln2;     // [C]                       post_attention_layernorm
    float* wgu;     // [2Fl, C]                  gate_proj ; up_proj (local rows)
    float* wdown;   // [C, Fl]                   (local columns)
};
struct ChunkView {
    float* wte = nullptr;        // [Vl, C] (first chunk)
    std::vector<LayerView> layers;
    float* norm = nullptr;       // [C] (last chunk)
    float* head = nullptr;       // [Vl, C] (last chunk; the embedding copy when tied)
};
ChunkView chunk_view(const ParamTable& table, const ChunkPlan& chunk, float* arena);

}  // namespace quintet
