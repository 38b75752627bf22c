// GGUF version 3, written from its specification: "GGUF", version, tensor count, key/value
// count; each key/value (string key, uint32 type, value); each tensor's info (name, dims with the
// fastest-varying first, ggml type, offset into the data); then the data, every tensor aligned to
// general.alignment = 32 bytes. All little-endian. What is written and why: docs/interop.md.
#include "quintet/interop/gguf.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>

#include "quintet/core/error.hpp"
#include "quintet/model/rope.hpp"
#include "quintet/interop/gguf_vocab.hpp"

namespace quintet {

namespace {

constexpr uint32_t kAlign = 32;

// GGUF value types and ggml tensor types used here.
enum : uint32_t { kU8 = 0, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9, kU32 = 4 };
enum : uint32_t { kGgmlF32 = 0, kGgmlF16 = 1, kGgmlBF16 = 30 };

// Little-endian serialisation into a byte string.
struct Bytes {
    std::string b;
    template <class T>
    void pod(T v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }
    void str(const std::string& s) {
        pod<uint64_t>(s.size());
        b += s;
    }
};

// The metadata, in the order it is added.
class Metadata {
public:
    void u32(const std::string& k, uint32_t v) { key(k, kU32).pod(v); }
    void f32(const std::string& k, double v) { key(k, kF32).pod(float(v)); }
    void boolean(const std::string& k, bool v) { key(k, kBool).pod<uint8_t>(v ? 1 : 0); }
    void str(const std::string& k, const std::string& v) { key(k, kString).str(v); }
    void strings(const std::string& k, const std::vector<std::string>& v) {
        Bytes& b = key(k, kArray);
        b.pod<uint32_t>(kString);
        b.pod<uint64_t>(v.size());
        for (const std::string& s : v) b.str(s);
    }
    void f32s(const std::string& k, const std::vector<float>& v) {
        Bytes& b = key(k, kArray);
        b.pod<uint32_t>(kF32);
        b.pod<uint64_t>(v.size());
        for (float x : v) b.pod(x);
    }
    void u8s(const std::string& k, const std::string& v) {
        Bytes& b = key(k, kArray);
        b.pod<uint32_t>(kU8);
        b.pod<uint64_t>(v.size());
        b.b += v;
    }
    void i32s(const std::string& k, const std::vector<int32_t>& v) {
        Bytes& b = key(k, kArray);
        b.pod<uint32_t>(kI32);
        b.pod<uint64_t>(v.size());
        for (int32_t x : v) b.pod(x);
    }
    uint64_t count() const { return n_; }
    const std::string& bytes() const { return out_.b; }

private:
    Bytes& key(const std::string& k, uint32_t type) {
        QUINTET_CHECK(keys_.insert(k).second, "GGUF key " + k + " written twice");
        out_.str(k);
        out_.pod(type);
        ++n_;
        return out_;
    }
    Bytes out_;
    uint64_t n_ = 0;
    std::set<std::string> keys_;
};

// One tensor of the file: its GGUF name, ggml dims (fastest first) and its values (row-major,
// which is ggml's order for those dims).
struct GgufTensor {
    std::string name;
    std::vector<uint64_t> dims;
    std::vector<float> data;
    bool keep_f32 = false;  // vectors (norms, biases) stay f32 whatever the dtype
};

GgufTensor matrix(const std::string& name, const NamedTensor& t) {
    GgufTensor g{name, {uint64_t(t.cols), uint64_t(t.rows)}, t.data, false};
    if (t.ndim == 1) {
        g.dims = {uint64_t(t.rows)};
        g.keep_f32 = true;
    }
    return g;
}

// moe.layers as llama.cpp's deepseek2 can hold it: the first k layers dense, the rest MoE.
// Returns k, or -1 when the set is not of that form.
int leading_dense_layers(const ModelConfig& m) {
    if (m.moe.experts == 0) return m.n_layers;
    int k = 0;
    while (k < m.n_layers && !moe_layer(m, k)) ++k;
    for (int l = k; l < m.n_layers; ++l)
        if (!moe_layer(m, l)) return -1;
    return k;
}

std::string layer(int l) { return "model.layers." + std::to_string(l) + "."; }
std::string blk(int l) { return "blk." + std::to_string(l) + "."; }

void write_rope_metadata(Metadata& md, const std::string& a, const ExportModel& m, int rope_dims) {
    const RopeConfig& r = m.deck.rope;
    md.u32(a + ".rope.dimension_count", uint32_t(rope_dims));
    md.f32(a + ".rope.freq_base", r.theta);
    if (r.scaling == "yarn") {
        md.str(a + ".rope.scaling.type", "yarn");
        md.f32(a + ".rope.scaling.factor", r.factor);
        md.u32(a + ".rope.scaling.original_context_length", uint32_t(m.rope_original_context()));
        md.f32(a + ".rope.scaling.yarn_beta_fast", r.beta_fast);
        md.f32(a + ".rope.scaling.yarn_beta_slow", r.beta_slow);
    }
}

// YaRN's temperature in llama.cpp's terms (docs/interop.md): with yarn_log_multiplier = 0.1 L and
// rope.scaling.attn_factor = f, llama.cpp's deepseek2 multiplies cos and sin by f and the softmax
// scale by (f m(L))^2, where m(c) = 0.1 c ln s + 1 (it takes mscale = mscale_all_dim); its llama
// multiplies cos and sin by f m(1). quintet's MLA: cos and sin times m(a) / m(b), the softmax times
// m(b)^2 (a = rope.mscale, b = rope.mscale_all_dim), so f = m(a) / m(b) and m(L) = m(b)^2 / m(a).
struct LlamaCppYarn {
    double log_mul = 0, attn_factor = 1;
    std::string why_not;
};
LlamaCppYarn llama_cpp_yarn(const ModelConfig& c, const RopeConfig& r) {
    LlamaCppYarn y;
    if (r.scaling != "yarn") return y;
    const double ma = yarn_mscale(r.factor, r.mscale), mb = yarn_mscale(r.factor, r.mscale_all_dim);
    if (c.attention != "mla") {
        y.attn_factor = ma / yarn_mscale(r.factor, 1.0);
        return y;
    }
    y.attn_factor = ma / mb;
    const double L = (mb * mb / ma - 1.0) / (0.1 * std::log(r.factor));
    if (!(std::fabs(L) > 1e-6))
        y.why_not = "rope.mscale = " + std::to_string(r.mscale) + " with rope.mscale_all_dim = " +
                    std::to_string(r.mscale_all_dim) +
                    ": llama.cpp reads a zero yarn_log_multiplier as none and scales the softmax by m(1)^2";
    y.log_mul = 0.1 * L;
    return y;
}

int context_length(const ExportModel& m) {
    const RopeConfig& r = m.deck.rope;
    if (r.scaling == "yarn") return std::max(m.trained_context, int(std::lround(r.factor * m.rope_original_context())));
    return m.trained_context;
}

void add_swiglu(std::vector<GgufTensor>& out, const ExportModel& m, const std::string& from, const std::string& to) {
    out.push_back(matrix(to + "gate.weight", m.at(from + "gate_proj.weight")));
    out.push_back(matrix(to + "up.weight", m.at(from + "up_proj.weight")));
    out.push_back(matrix(to + "down.weight", m.at(from + "down_proj.weight")));
}

// The tensors and metadata of architecture `llama` (MHA/GQA, dense SwiGLU).
void llama_arch(const ExportModel& m, Metadata& md, std::vector<GgufTensor>& out) {
    const ModelConfig& c = m.deck.model;
    const int NKV = c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads, HD = c.head_dim();
    md.u32("llama.context_length", uint32_t(context_length(m)));
    md.u32("llama.embedding_length", uint32_t(c.d_model));
    md.u32("llama.block_count", uint32_t(c.n_layers));
    md.u32("llama.feed_forward_length", uint32_t(c.ffn_width()));
    md.u32("llama.attention.head_count", uint32_t(c.n_heads));
    md.u32("llama.attention.head_count_kv", uint32_t(NKV));
    md.f32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
    md.u32("llama.vocab_size", uint32_t(c.vocab_size));
    write_rope_metadata(md, "llama", m, HD);
    if (const LlamaCppYarn y = llama_cpp_yarn(c, m.deck.rope); y.attn_factor != 1.0)
        md.f32("llama.rope.scaling.attn_factor", y.attn_factor);
    for (int l = 0; l < c.n_layers; ++l) {
        const std::string p = layer(l), b = blk(l);
        out.push_back(matrix(b + "attn_norm.weight", m.at(p + "input_layernorm.weight")));
        // llama.cpp rotates adjacent pairs: every head's rows go to the interleaved order.
        NamedTensor q = m.at(p + "self_attn.q_proj.weight"), k = m.at(p + "self_attn.k_proj.weight");
        for (int h = 0; h < c.n_heads; ++h) rope_rows_interleave(q, h * HD, HD);
        for (int h = 0; h < NKV; ++h) rope_rows_interleave(k, h * HD, HD);
        out.push_back(matrix(b + "attn_q.weight", q));
        out.push_back(matrix(b + "attn_k.weight", k));
        out.push_back(matrix(b + "attn_v.weight", m.at(p + "self_attn.v_proj.weight")));
        out.push_back(matrix(b + "attn_output.weight", m.at(p + "self_attn.o_proj.weight")));
        out.push_back(matrix(b + "ffn_norm.weight", m.at(p + "post_attention_layernorm.weight")));
        add_swiglu(out, m, p + "mlp.", b + "ffn_");
    }
}

// Experts e = 0..E-1 of one projection stacked into a 3-D tensor [E, rows, cols].
GgufTensor stacked(const std::string& name, const ExportModel& m, const std::string& p, const std::string& proj, int E) {
    GgufTensor g;
    g.name = name;
    for (int e = 0; e < E; ++e) {
        const NamedTensor& t = m.at(p + "mlp.experts." + std::to_string(e) + "." + proj + ".weight");
        if (e == 0) g.dims = {uint64_t(t.cols), uint64_t(t.rows), uint64_t(E)};
        g.data.insert(g.data.end(), t.data.begin(), t.data.end());
    }
    return g;
}

// The tensors and metadata of architecture `deepseek2` (MLA, dense or MoE SwiGLU). The attention
// is written in llama.cpp's per-head form (attn_kv_b whole, no key_length_mla): it multiplies
// kv_b out as training does, rather than absorbing it.
void deepseek2_arch(const ExportModel& m, Metadata& md, std::vector<GgufTensor>& out) {
    const ModelConfig& c = m.deck.model;
    const int dense = leading_dense_layers(c);
    const int Dqk = c.qk_nope_dim + c.qk_rope_dim, dr = c.qk_rope_dim;
    const int E = c.moe.experts;
    // llama.cpp's MoE layers always have a shared expert: without one, a shared expert whose
    // down_proj is zero stands in (it adds exactly 0).
    const int shared = c.moe.shared_experts > 0 ? c.moe.shared_experts : 1;
    const std::string a = "deepseek2";
    md.u32(a + ".context_length", uint32_t(context_length(m)));
    md.u32(a + ".embedding_length", uint32_t(c.d_model));
    md.u32(a + ".block_count", uint32_t(c.n_layers));
    md.u32(a + ".feed_forward_length", uint32_t(c.ffn_width()));
    md.u32(a + ".attention.head_count", uint32_t(c.n_heads));
    md.u32(a + ".attention.head_count_kv", uint32_t(c.n_heads));
    md.f32(a + ".attention.layer_norm_rms_epsilon", c.norm_eps);
    md.u32(a + ".vocab_size", uint32_t(c.vocab_size));
    md.u32(a + ".attention.q_lora_rank", uint32_t(c.q_lora_rank));
    md.u32(a + ".attention.kv_lora_rank", uint32_t(c.kv_lora_rank));
    md.u32(a + ".attention.key_length", uint32_t(Dqk));
    md.u32(a + ".attention.value_length", uint32_t(c.v_head_dim));
    md.u32(a + ".leading_dense_block_count", uint32_t(dense));
    md.u32(a + ".expert_count", uint32_t(E));
    md.u32(a + ".expert_used_count", uint32_t(E > 0 ? c.moe.top_k : 0));
    md.u32(a + ".expert_shared_count", uint32_t(E > 0 ? shared : 0));
    md.u32(a + ".expert_feed_forward_length", uint32_t(E > 0 ? c.expert_ffn_width() : 0));
    // The router (docs/math.md §9) as llama.cpp's build_moe_ffn reads it: the gating function
    // (1 softmax, 2 sigmoid), the weights' scale and renormalisation, and its group rule (the
    // sum of each group's two best biased scores: noaux_tc), written only when it limits.
    md.f32(a + ".expert_weights_scale", c.moe.routed_scaling);
    md.boolean(a + ".expert_weights_norm", c.moe.norm_topk);
    md.u32(a + ".expert_gating_func", c.moe.scoring == "sigmoid" ? 2 : 1);
    if (E > 0 && c.moe.groups > 1 && c.moe.group_top_k < c.moe.groups) {
        md.u32(a + ".expert_group_count", uint32_t(c.moe.groups));
        md.u32(a + ".expert_group_used_count", uint32_t(c.moe.group_top_k));
    }
    write_rope_metadata(md, a, m, dr);
    if (m.deck.rope.scaling == "yarn") {
        const LlamaCppYarn y = llama_cpp_yarn(c, m.deck.rope);
        md.f32(a + ".rope.scaling.yarn_log_multiplier", y.log_mul);
        if (y.attn_factor != 1.0) md.f32(a + ".rope.scaling.attn_factor", y.attn_factor);
    }
    for (int l = 0; l < c.n_layers; ++l) {
        const std::string p = layer(l), b = blk(l), sa = p + "self_attn.";
        out.push_back(matrix(b + "attn_norm.weight", m.at(p + "input_layernorm.weight")));
        // The rotary rows of every query head and of k_rope go to the interleaved order.
        NamedTensor q = m.at(sa + (c.q_lora_rank > 0 ? "q_b_proj.weight" : "q_proj.weight"));
        for (int h = 0; h < c.n_heads; ++h) rope_rows_interleave(q, h * Dqk + c.qk_nope_dim, dr);
        if (c.q_lora_rank > 0) {
            out.push_back(matrix(b + "attn_q_a.weight", m.at(sa + "q_a_proj.weight")));
            out.push_back(matrix(b + "attn_q_a_norm.weight", m.at(sa + "q_a_layernorm.weight")));
            out.push_back(matrix(b + "attn_q_b.weight", q));
        } else {
            out.push_back(matrix(b + "attn_q.weight", q));
        }
        NamedTensor kva = m.at(sa + "kv_a_proj_with_mqa.weight");
        rope_rows_interleave(kva, c.kv_lora_rank, dr);
        out.push_back(matrix(b + "attn_kv_a_mqa.weight", kva));
        out.push_back(matrix(b + "attn_kv_a_norm.weight", m.at(sa + "kv_a_layernorm.weight")));
        out.push_back(matrix(b + "attn_kv_b.weight", m.at(sa + "kv_b_proj.weight")));
        out.push_back(matrix(b + "attn_output.weight", m.at(sa + "o_proj.weight")));
        out.push_back(matrix(b + "ffn_norm.weight", m.at(p + "post_attention_layernorm.weight")));
        if (l < dense) {
            add_swiglu(out, m, p + "mlp.", b + "ffn_");
            continue;
        }
        // The router stays f32 whatever --dtype (as llama.cpp's converter keeps it): a rounded
        // router flips choices (docs/interop.md).
        out.push_back(matrix(b + "ffn_gate_inp.weight", m.at(p + "mlp.gate.weight")));
        out.back().keep_f32 = true;
        if (const NamedTensor* bias = m.find(p + "mlp.gate.e_score_correction_bias"))
            out.push_back(matrix(b + "exp_probs_b.bias", *bias));
        out.push_back(stacked(b + "ffn_gate_exps.weight", m, p, "gate_proj", E));
        out.push_back(stacked(b + "ffn_up_exps.weight", m, p, "up_proj", E));
        out.push_back(stacked(b + "ffn_down_exps.weight", m, p, "down_proj", E));
        if (c.moe.shared_experts > 0) {
            add_swiglu(out, m, p + "mlp.shared_experts.", b + "ffn_");
            for (int i = int(out.size()) - 3; i < int(out.size()); ++i) {
                std::string& n = out[i].name;  // ffn_gate.weight -> ffn_gate_shexp.weight
                n.insert(n.size() - std::string(".weight").size(), "_shexp");
            }
        } else {
            const uint64_t F = uint64_t(c.expert_ffn_width()), C = uint64_t(c.d_model);
            const NamedTensor& g0 = m.at(p + "mlp.experts.0.gate_proj.weight");
            const NamedTensor& u0 = m.at(p + "mlp.experts.0.up_proj.weight");
            out.push_back({b + "ffn_gate_shexp.weight", {C, F}, g0.data, false});
            out.push_back({b + "ffn_up_shexp.weight", {C, F}, u0.data, false});
            out.push_back({b + "ffn_down_shexp.weight", {F, C}, std::vector<float>(F * C, 0.0f), false});
        }
    }
}

}  // namespace

std::string gguf_unsupported(const ExportModel& m) {
    const ModelConfig& c = m.deck.model;
    if (std::string why = gguf_vocab_unsupported(m.tokenizer); !why.empty()) return why;
    if (m.deck.rope.document_positions)
        return "rope.document_positions = true: llama.cpp numbers positions through the whole sequence";
    if (c.attention == "mha" && c.moe.experts > 0)
        return "model.attention = mha with moe.experts = " + std::to_string(c.moe.experts) +
               ": GGUF export writes MoE models as deepseek2, which needs model.attention = mla";
    if (c.attention == "mla") {
        if (leading_dense_layers(c) < 0)
            return "moe.layers = " + c.moe.layers.text() +
                   ": llama.cpp's deepseek2 needs the dense layers first and MoE in all the rest (e.g. 1-" +
                   std::to_string(c.n_layers - 1) + ")";
        if (c.moe.experts > 0 && c.moe.balance == "aux_free" && c.moe.bias_update != "sign" &&
            c.moe.bias_update != "proportional")
            return "moe.bias_update = " + c.moe.bias_update + " is unknown";
        if (c.moe.experts > 0 && c.moe.groups > 1 && c.moe.group_top_k < c.moe.groups &&
            c.moe.topk_method == "group_limited_greedy")
            return "moe.topk_method = group_limited_greedy with moe.groups = " + std::to_string(c.moe.groups) +
                   ": llama.cpp ranks expert groups by the sum of their two best scores (noaux_tc), not by the best";
        if (std::string why = llama_cpp_yarn(c, m.deck.rope).why_not; !why.empty()) return why;
    }
    if (c.attention != "mha" && c.attention != "mla") return "model.attention = " + c.attention + " is not exported";
    return "";
}

void gguf_export(const ExportModel& m, const std::string& path, const std::string& dtype) {
    if (std::string why = gguf_unsupported(m); !why.empty()) throw ConfigError("export --format gguf: " + why);
    const uint32_t ggml_type = dtype == "f32" ? uint32_t(kGgmlF32) : dtype == "f16" ? uint32_t(kGgmlF16) : dtype == "bf16" ? uint32_t(kGgmlBF16) : 99u;
    if (ggml_type == 99) throw ConfigError("export: --dtype = '" + dtype + "': valid for gguf: f32 | f16 | bf16");
    const ModelConfig& c = m.deck.model;
    const GgufVocab vocab = gguf_vocab(m.tokenizer);
    for (const std::string& w : vocab.warnings)
        std::fprintf(stderr, "export: warning: llama.cpp may tokenize some texts otherwise than quintet: %s\n", w.c_str());

    Metadata md;
    const std::string arch = c.attention == "mla" ? "deepseek2" : "llama";
    md.str("general.architecture", arch);
    md.str("general.name", "quintet");
    md.u32("general.alignment", kAlign);
    md.u32("general.file_type", dtype == "f32" ? 0 : dtype == "f16" ? 1 : 32);
    std::vector<GgufTensor> tensors;
    tensors.push_back(matrix("token_embd.weight", m.at("model.embed_tokens.weight")));
    if (arch == "llama")
        llama_arch(m, md, tensors);
    else
        deepseek2_arch(m, md, tensors);
    tensors.push_back(matrix("output_norm.weight", m.at("model.norm.weight")));
    if (!c.tie_embeddings) tensors.push_back(matrix("output.weight", m.at("lm_head.weight")));
    md.str("tokenizer.ggml.model", vocab.model);
    if (!vocab.pre.empty()) md.str("tokenizer.ggml.pre", vocab.pre);
    md.strings("tokenizer.ggml.tokens", vocab.tokens);
    if (!vocab.scores.empty()) md.f32s("tokenizer.ggml.scores", vocab.scores);
    md.i32s("tokenizer.ggml.token_type", vocab.types);
    if (vocab.model == "gpt2") md.strings("tokenizer.ggml.merges", vocab.merges);
    if (vocab.bos >= 0) md.u32("tokenizer.ggml.bos_token_id", uint32_t(vocab.bos));
    if (vocab.eos >= 0) md.u32("tokenizer.ggml.eos_token_id", uint32_t(vocab.eos));
    if (vocab.unk >= 0) md.u32("tokenizer.ggml.unknown_token_id", uint32_t(vocab.unk));
    if (vocab.pad >= 0) md.u32("tokenizer.ggml.padding_token_id", uint32_t(vocab.pad));
    if (vocab.add_space_prefix >= 0) md.boolean("tokenizer.ggml.add_space_prefix", vocab.add_space_prefix == 1);
    if (vocab.remove_extra_whitespaces >= 0)
        md.boolean("tokenizer.ggml.remove_extra_whitespaces", vocab.remove_extra_whitespaces == 1);
    if (!vocab.precompiled_charsmap.empty()) md.u8s("tokenizer.ggml.precompiled_charsmap", vocab.precompiled_charsmap);
    md.boolean("tokenizer.ggml.add_bos_token", false);
    md.boolean("tokenizer.ggml.add_eos_token", false);

    // Header and tensor infos, then the data at aligned offsets.
    Bytes head;
    head.b = "GGUF";
    head.pod<uint32_t>(3);
    head.pod<uint64_t>(tensors.size());
    head.pod<uint64_t>(md.count());
    head.b += md.bytes();
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const GgufTensor& t : tensors) {
        const uint32_t type = t.keep_f32 ? kGgmlF32 : ggml_type;
        head.str(t.name);
        head.pod<uint32_t>(uint32_t(t.dims.size()));
        uint64_t n = 1;
        for (uint64_t d : t.dims) {
            head.pod<uint64_t>(d);
            n *= d;
        }
        QUINTET_CHECK(n == t.data.size(), "tensor " + t.name + ": dims do not match its values");
        head.pod<uint32_t>(type);
        head.pod<uint64_t>(offset);
        offsets.push_back(offset);
        offset += n * (type == kGgmlF32 ? 4 : 2);
        offset = (offset + kAlign - 1) / kAlign * kAlign;
    }
    head.b.resize((head.b.size() + kAlign - 1) / kAlign * kAlign, '\0');

    write_atomically(path, [&](const std::string& tmp) {
        std::FILE* f = std::fopen(tmp.c_str(), "wb");
        if (!f) throw ConfigError("export: cannot create '" + tmp + "': " + std::strerror(errno));
        bool ok = std::fwrite(head.b.data(), 1, head.b.size(), f) == head.b.size();
        std::string buf;
        uint64_t at = 0;
        for (size_t i = 0; i < tensors.size() && ok; ++i) {
            const size_t pad = size_t(offsets[i] - at);  // zeros up to this tensor's offset
            buf.assign(pad, '\0');
            dtype_append(buf, tensors[i].data.data(), tensors[i].data.size(), tensors[i].keep_f32 ? "f32" : dtype);
            ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
            at = offsets[i] + (buf.size() - pad);
        }
        if (ok && at < offset) {
            buf.assign(offset - at, '\0');
            ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
        }
        ok = std::fflush(f) == 0 && ok;
        ok = std::fclose(f) == 0 && ok;
        if (!ok) throw RankError("export: writing '" + tmp + "' failed: " + std::strerror(errno));
    });
}

std::string gguf_export_recognise(const std::filesystem::path& file) {
    // The header's first key/values: general.architecture, then general.name = "quintet".
    std::FILE* f = std::fopen(file.c_str(), "rb");
    if (!f) return std::string("it cannot be read: ") + std::strerror(errno);
    auto read = [&](void* p, size_t n) { return std::fread(p, 1, n, f) == n; };
    auto string = [&](std::string* out) {
        uint64_t n = 0;
        if (!read(&n, 8) || n > 4096) return false;
        out->resize(size_t(n));
        return read(out->data(), size_t(n));
    };
    char magic[4] = {0};
    uint32_t version = 0, type = 0;
    uint64_t tensors = 0, kvs = 0;
    std::string why = "it is not a GGUF file";
    if (read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0 && read(&version, 4) && read(&tensors, 8) && read(&kvs, 8)) {
        why = "it is a GGUF file that quintet did not write (no general.name = quintet)";
        std::string key, value;
        for (uint64_t i = 0; i < std::min<uint64_t>(kvs, 4); ++i) {
            if (!string(&key) || !read(&type, 4) || type != kString || !string(&value)) break;
            if (key == "general.name") {
                if (value == "quintet") why = "";
                break;
            }
        }
    }
    std::fclose(f);
    return why;
}

}  // namespace quintet
