// Model hyper-parameters. Field name = deck key: `model.d_model` is ModelConfig::d_model, and
// `moe.experts` is ModelConfig::moe.experts (the [moe] section belongs to the model).
// Defaults and help texts live in the option table (src/deck/deck.cpp), the single source for
// --help, docs/deck.md and inputs/reference.deck.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace quintet {

// A set of layer indices as a deck writes it: "all", or a comma list with ranges ("0,3-60").
// Parsed once, when the deck sets it; the text is kept as written (the resolved deck shows it).
class LayerSet {
public:
    // false (and unchanged) when `text` is neither "all" nor such a list.
    bool parse(const std::string& text);
    const std::string& text() const { return text_; }
    bool all() const { return all_; }
    const std::vector<int>& list() const { return list_; }  // empty when all()
    bool contains(int layer) const;

private:
    std::string text_ = "all";
    bool all_ = true;
    std::vector<int> list_;
};

struct MoeConfig {
    int experts = 0;  // E; 0 = dense FFN
    int top_k = 2, shared_experts = 0, ffn_dim = 0;
    LayerSet layers;  // the layers with MoE (moe.layers)
    bool norm_topk = true;
    // DeepSeek's router (docs/math.md §9): scores softmax | sigmoid (HF scoring_func); top-k
    // greedy | group_limited_greedy (groups ranked by their best score, DeepSeek-V2) | noaux_tc
    // (by the sum of their two best biased scores, DeepSeek-V3) over `groups` groups of experts,
    // of which group_top_k are kept (n_group, topk_group); the chosen weights times
    // routed_scaling (routed_scaling_factor).
    std::string scoring = "softmax";
    std::string topk_method = "greedy";
    int groups = 1, group_top_k = 1;
    double routed_scaling = 1.0;
    std::string balance = "aux_loss";  // aux_loss | aux_free | none
    double aux_coef = 0.01, bias_rate = 0.01;  // bias_rate, bias_update: measured, docs/math.md §9
    std::string bias_update = "proportional";  // aux_free: sign (DeepSeek-V3) | proportional (to the load gap)
    double capacity_factor = 0;  // > 0: each expert takes at most ceil(cf * k * N / E) of a rank's N rows
    int dead_after = 10;         // an expert with no tokens for this many steps counts as dead
};

struct ModelConfig {
    int d_model = 256;            // C: width of the residual stream
    int n_layers = 4;             // L: decoder layers
    int n_heads = 4;              // NH: query heads
    int n_kv_heads = 0;           // NKV: key/value heads (GQA); 0 = n_heads
    int ffn_dim = 0;              // SwiGLU hidden width; 0 = 8/3*d_model rounded up to 64
    double norm_eps = 1e-5;       // RMSNorm epsilon
    bool tie_embeddings = false;  // lm_head shares model.embed_tokens
    std::string attention = "mha";  // mha | mla
    int kv_lora_rank = 0, q_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
    MoeConfig moe;       // the [moe] section (which layers are MoE, and how)
    // DeepSeek-V3's multi-token prediction: D modules after the last decoder layer (layers
    // L..L+D-1 of the checkpoint), module k predicting the token k+1 ahead (docs/math.md §11).
    int mtp_depth = 0;
    int vocab_size = 0;  // V: model.vocab_size, or (0) the token file's
    // The forward's two µP multipliers (init.scheme = mup; model/param_groups.hpp), derived from
    // the [init] section when a deck is read, not deck keys: the output logits are multiplied by
    // logit_mult (1 / the width multiplier) and the attention score scale by attn_mult
    // (sqrt(base head dim / head dim), so the scale is sqrt(base)/d instead of 1/sqrt(d)). 1 otherwise.
    double logit_mult = 1.0, attn_mult = 1.0;
    int head_dim() const { return d_model / n_heads; }  // HD
    // F: the SwiGLU width, model.ffn_dim or by default 8/3 d_model rounded up to a multiple of 64.
    int ffn_width() const { return ffn_dim > 0 ? ffn_dim : ((8 * d_model / 3 + 63) / 64) * 64; }
    // The experts' SwiGLU width: moe.ffn_dim, or F.
    int expert_ffn_width() const { return moe.ffn_dim > 0 ? moe.ffn_dim : ffn_width(); }
};

struct RopeConfig {
    double theta = 10000.0;
    std::string scaling = "none";  // none | yarn
    double factor = 1.0;           // YaRN scale s
    int original_max_position = 0; // YaRN L (0 = data.seq_len)
    double beta_fast = 32.0, beta_slow = 1.0;
    // DeepSeek's YaRN temperature (docs/math.md §4.4): with m(c) = 0.1 c ln s + 1, cos and sin are
    // multiplied by m(mscale) / m(mscale_all_dim) and the softmax scale by m(mscale_all_dim)^2
    // (HF rope_scaling.mscale, .mscale_all_dim).
    double mscale = 1.0, mscale_all_dim = 1.0;
    bool document_positions = false;  // positions restart at each document (needs an eos id)
};


// Parameter initialisation and parametrisation (the [init] section; docs/math.md §0
// "Initialisation" and "µP").
struct InitConfig {
    std::string scheme = "scaled";  // normal | scaled | fan_in | mup
    double std = 0.02;
    // mup: the base shape the hyperparameters were tuned at. 0 = the model's own (multiplier 1).
    int base_width = 0;      // d_model of the base model
    int base_ffn = 0;        // its SwiGLU (and experts') width; 0 = scales with the width
    int base_head_dim = 0;   // its q.k head dim; 0 = this model's (the score scale unchanged)
};

// Whether layer `layer` has a MoE feed-forward block: moe.experts > 0 and moe.layers names it.
bool moe_layer(const ModelConfig& m, int layer);

}  // namespace quintet
