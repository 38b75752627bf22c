// The parameter table: every tensor's Hugging Face name, logical shape [out, in], place in
// the flat parameter arena, and init rule. Gradients and AdamW moments use the same layout.
// q/k/v are adjacent (one fused GEMM), as are gate/up.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/model/config.hpp"
#include "quintet/train/train_config.hpp"

namespace quintet {

enum class InitRule { normal, out_proj, ones };

struct ParamSpec {
    std::string name;   // HF name, e.g. model.layers.0.self_attn.q_proj.weight
    int rows = 0;       // out (or the length of a vector)
    int cols = 1;       // in (1 for vectors)
    int ndim = 2;       // 1 for norm weights
    InitRule init = InitRule::normal;
    size_t offset = 0;  // into the arena, in floats
    size_t numel() const { return size_t(rows) * cols; }
    bool decay() const { return ndim >= 2; }  // weight decay on rank >= 2 only (DESIGN §3)
};

struct ParamTable {
    std::vector<ParamSpec> specs;
    size_t total = 0;           // floats in the arena
    size_t matmul_params = 0;   // P of 6·N·P: every matmul weight incl. LM head, not the lookup
    const ParamSpec& find(const std::string& name) const;
};

// Resolved dims derived from the deck (defaults applied).
struct ModelDims {
    int V, C, L, NH, NKV, HD, F;
    int qkv() const { return (NH + 2 * NKV) * HD; }
    bool tied;
};
ModelDims model_dims(const ModelConfig& m);

ParamTable make_param_table(const ModelConfig& m);

// Fill `arena` (host, `table.total` floats) with the layout-invariant initial values:
// element i of tensor `name` = N(0,1) from Philox(seed, name, i) times the rule's std.
// Only elements in [lo, hi) of the flat arena are written (a rank makes only what it holds).
void init_params(float* arena, const ParamTable& table, const ModelConfig& m,
                 const InitConfig& init, uint64_t seed, size_t lo, size_t hi);

// Views of one layer's tensors in an arena with this table's layout.
struct LayerView {
    float* ln1;     // [C]        input_layernorm
    float* wqkv;    // [(NH+2NKV)*HD, C]  q_proj ; k_proj ; v_proj
    float* wo;      // [C, NH*HD]
    float* ln2;     // [C]        post_attention_layernorm
    float* wgu;     // [2F, C]    gate_proj ; up_proj
    float* wdown;   // [C, F]
};
struct ModelView {
    float* wte;     // [V, C]
    std::vector<LayerView> layers;
    float* norm;    // [C]
    float* head;    // [V, C] (== wte when tied)
};
ModelView model_view(const ParamTable& table, const ModelDims& d, float* arena);

}  // namespace quintet
