// Hugging Face directories (docs/interop.md): quintet's checkpoint names are Hugging Face's, so
// export and import are the configuration, the tokenizer files and, for DeepSeek (whose code
// reads the rotary rows interleaved), the RoPE row permutation.
#include "quintet/interop/hf.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <nlohmann/json.hpp>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/core/error.hpp"
#include "quintet/interop/gguf_vocab.hpp"
#include "quintet/interop/safetensors.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/rope.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace quintet {

namespace {

bool is_deepseek(const ModelConfig& c) { return c.attention == "mla"; }

// First dense layers before the MoE ones: Hugging Face DeepSeek's first_k_dense_replace; -1 when
// moe.layers is not of that form.
int first_dense(const ModelConfig& c) {
    if (c.moe.experts == 0) return c.n_layers;
    int k = 0;
    while (k < c.n_layers && !moe_layer(c, k)) ++k;
    for (int l = k; l < c.n_layers; ++l)
        if (!moe_layer(c, l)) return -1;
    return k;
}

// Permutes (or un-permutes) every rotary row block of an MLA model's tensors.
void deepseek_rope_rows(std::vector<NamedTensor>& ts, const ModelConfig& c, bool inverse) {
    const int Dqk = c.qk_nope_dim + c.qk_rope_dim;
    for (NamedTensor& t : ts) {
        auto ends = [&](const std::string& s) { return t.name.size() >= s.size() && t.name.compare(t.name.size() - s.size(), s.size(), s) == 0; };
        if (ends("self_attn.q_proj.weight") || ends("self_attn.q_b_proj.weight"))
            for (int h = 0; h < c.n_heads; ++h) rope_rows_interleave(t, h * Dqk + c.qk_nope_dim, c.qk_rope_dim, inverse);
        else if (ends("self_attn.kv_a_proj_with_mqa.weight"))
            rope_rows_interleave(t, c.kv_lora_rank, c.qk_rope_dim, inverse);
    }
}

// The Transformers class an MLA model is written as, chosen by what each class computes
// (docs/interop.md, "What each export computes"): DeepseekV3ForCausalLM -- sigmoid scores, the
// noaux_tc group rule, the correction bias, norm_topk_prob, the scaling, YaRN's softmax factor
// m(mscale_all_dim)^2; DeepseekV2ForCausalLM -- softmax scores, greedy or group_limited_greedy,
// the scaling, never renormalised, no bias, no softmax factor (folded into the query instead).
struct HfTarget {
    bool v3 = false;
    bool fold_softmax = false;  // V2: m(mscale_all_dim)^2 into the query projections
    std::string why_not;        // no class computes the model
};

double yarn_m(const RopeConfig& r, double c) { return r.scaling == "yarn" ? yarn_mscale(r.factor, c) : 1.0; }

HfTarget hf_target(const ModelConfig& c, const RopeConfig& r) {
    HfTarget t;
    const MoeConfig& e = c.moe;
    const bool moe = e.experts > 0, sig = e.scoring == "sigmoid", groups = e.groups > 1 && e.group_top_k < e.groups;
    const bool yarn_softmax = yarn_m(r, r.mscale_all_dim) != 1.0;
    if (!moe) {
        t.v3 = yarn_softmax;  // V3 scales the softmax as quintet does; V2 would need the fold
        return t;
    }
    if (sig) {
        if (groups && e.topk_method == "group_limited_greedy")
            t.why_not = "moe.scoring = sigmoid with moe.topk_method = group_limited_greedy: DeepseekV3ForCausalLM "
                        "ranks groups by the sum of their two best scores (noaux_tc), DeepseekV2ForCausalLM's scores "
                        "are a softmax; no Transformers class computes this router (use noaux_tc, or export to gguf "
                        "only if llama.cpp computes it)";
        t.v3 = true;
        return t;
    }
    // softmax scores: DeepseekV2ForCausalLM only.
    if (e.balance == "aux_free")
        t.why_not = "moe.scoring = softmax with moe.balance = aux_free: DeepseekV2ForCausalLM has no correction "
                    "bias and DeepseekV3ForCausalLM's scores are sigmoids; no Transformers class computes this "
                    "router (train with moe.scoring = sigmoid, or export to gguf: llama.cpp computes it)";
    else if (e.norm_topk && e.top_k > 0)
        t.why_not = "moe.scoring = softmax with moe.norm_topk = true: DeepseekV2ForCausalLM never renormalises the "
                    "chosen weights and DeepseekV3ForCausalLM's scores are sigmoids; no Transformers class computes "
                    "this router (train with moe.norm_topk = false or moe.scoring = sigmoid, or export to gguf: "
                    "llama.cpp computes it)";
    else if (groups && e.topk_method == "noaux_tc")
        t.why_not = "moe.scoring = softmax with moe.topk_method = noaux_tc: DeepseekV2ForCausalLM ranks groups by "
                    "their best score (group_limited_greedy), DeepseekV3ForCausalLM's scores are sigmoids; no "
                    "Transformers class computes this router";
    t.fold_softmax = yarn_softmax;
    return t;
}

json rope_scaling_json(const ExportModel& m, const HfTarget& t) {
    const RopeConfig& r = m.deck.rope;
    const bool mla = m.deck.model.attention == "mla";
    json y = {{"type", "yarn"}, {"rope_type", "yarn"}, {"factor", r.factor},
              {"original_max_position_embeddings", m.rope_original_context()},
              {"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow}};
    // Transformers multiplies cos and sin by attention_factor when given, else by
    // m(mscale) / m(mscale_all_dim) when both are non-zero, else by m(1) (its yarn rope init).
    const double ln = 0.1 * std::log(r.factor);
    auto transformers_default = [&](double a, double b) {
        return a != 0.0 && b != 0.0 ? yarn_m(r, a) / yarn_m(r, b) : yarn_m(r, 1.0);
    };
    if (!mla) {  // Llama: the logits times m(mscale)^2, all of it on cos and sin
        if (r.mscale != 1.0) y["attention_factor"] = yarn_m(r, r.mscale);
        return y;
    }
    double a = r.mscale, b = r.mscale_all_dim;
    const double table = yarn_m(r, a) / yarn_m(r, b);  // quintet's cos/sin factor
    if (t.fold_softmax || (!t.v3 && b != 0.0)) {
        // DeepseekV2ForCausalLM has no softmax factor: m(b)^2 went into the queries, so the file
        // says mscale_all_dim = 0 and an mscale with the same cos/sin factor.
        a = (table - 1.0) / ln;
        b = 0.0;
    }
    y["mscale"] = a;
    y["mscale_all_dim"] = b;
    if (transformers_default(a, b) != table) y["attention_factor"] = table;
    return y;
}

json config_json(const ExportModel& m, const std::string& dtype, const HfTarget& t) {
    const ModelConfig& c = m.deck.model;
    const RopeConfig& r = m.deck.rope;
    json j;
    const bool ds = is_deepseek(c);
    const bool v3 = ds && t.v3;
    j["architectures"] = {ds ? (v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM") : "LlamaForCausalLM"};
    j["model_type"] = ds ? (v3 ? "deepseek_v3" : "deepseek_v2") : "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.ffn_width();
    j["num_hidden_layers"] = c.n_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = ds ? c.n_heads : (c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads);
    if (!ds) j["head_dim"] = c.head_dim();
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = r.theta;
    j["max_position_embeddings"] = r.scaling == "yarn" ? int(std::lround(r.factor * m.rope_original_context()))
                                                       : m.trained_context;
    j["tie_word_embeddings"] = c.tie_embeddings;
    j["attention_bias"] = false;
    if (!ds) j["mlp_bias"] = false;
    j["torch_dtype"] = dtype == "f32" ? "float32" : "bfloat16";
    j["rope_scaling"] = r.scaling == "yarn" ? rope_scaling_json(m, t) : json(nullptr);
    if (ds) {
        const MoeConfig& e = c.moe;
        j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
        j["kv_lora_rank"] = c.kv_lora_rank;
        j["qk_nope_head_dim"] = c.qk_nope_dim;
        j["qk_rope_head_dim"] = c.qk_rope_dim;
        j["v_head_dim"] = c.v_head_dim;
        j["n_routed_experts"] = e.experts > 0 ? json(e.experts) : json(nullptr);
        j["num_experts_per_tok"] = e.experts > 0 ? json(e.top_k) : json(nullptr);
        j["n_shared_experts"] = e.experts > 0 ? json(e.shared_experts) : json(nullptr);
        j["moe_intermediate_size"] = c.expert_ffn_width();
        j["first_k_dense_replace"] = first_dense(c);
        j["moe_layer_freq"] = 1;
        j["norm_topk_prob"] = e.norm_topk;
        j["scoring_func"] = v3 ? "sigmoid" : "softmax";
        const bool groups = e.groups > 1 && e.group_top_k < e.groups;
        j["topk_method"] = v3 ? "noaux_tc" : groups ? "group_limited_greedy" : "greedy";
        j["n_group"] = groups ? e.groups : 1;
        j["topk_group"] = groups ? e.group_top_k : 1;
        j["routed_scaling_factor"] = e.routed_scaling;
        j["aux_loss_alpha"] = e.balance == "aux_loss" ? e.aux_coef : 0.0;
        j["num_nextn_predict_layers"] = c.mtp_depth;
        if (v3) j["rope_interleave"] = true;  // the rotary rows are written interleaved
    }
    return j;
}

// DeepSeek-V3's checkpoint layout for the MTP modules: each module's layer also holds copies of
// the shared embedding and output head (model.layers.<L+k>.embed_tokens, .shared_head.head).
void add_mtp_copies(std::vector<NamedTensor>& ts, const ModelConfig& c) {
    if (c.mtp_depth == 0) return;
    const NamedTensor* emb = nullptr;
    const NamedTensor* head = nullptr;
    for (const NamedTensor& t : ts) {
        if (t.name == "model.embed_tokens.weight") emb = &t;
        if (t.name == "lm_head.weight") head = &t;
    }
    QUINTET_CHECK(emb != nullptr, "no embedding to copy into the MTP layers");
    std::vector<NamedTensor> extra;
    for (int k = 0; k < c.mtp_depth; ++k) {
        const std::string p = "model.layers." + std::to_string(c.n_layers + k) + ".";
        NamedTensor e = *emb, h = head ? *head : *emb;
        e.name = p + "embed_tokens.weight";
        h.name = p + "shared_head.head.weight";
        extra.push_back(std::move(e));
        extra.push_back(std::move(h));
    }
    for (NamedTensor& t : extra) ts.push_back(std::move(t));
}

// A tokenizer.json for quintet's byte-level tokenizers: BPE over GPT-2's byte alphabet, special
// tokens as added tokens. byte and bpe: their merges, the GPT-2 pattern (ByteLevel with use_regex).
// tiktoken, the form of Hugging Face's own conversions of tiktoken files (Llama 3's): merges
// derived from the ranks, the pattern as a Split before a ByteLevel without its own regex, and
// ignore_merges (a piece that is a token is that token: tiktoken's rule); ids no token has (gaps
// in the ranks) stay out.
json tokenizer_json(const Tokenizer& tok) {
    const bool tiktoken = tok.kind() == "tiktoken";
    const int V = tok.vocab_size();
    std::vector<std::string> bytes(static_cast<size_t>(V)), text(static_cast<size_t>(V));
    std::vector<bool> ordinary(size_t(V), false), special(size_t(V), false);
    json added = json::array(), vocab = json::object();
    for (const SpecialToken& s : tok.specials()) {
        special[s.id] = true;
        added.push_back({{"id", s.id}, {"content", s.text}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", false}, {"special", true}});
    }
    for (int id = 0; id < V; ++id) {
        if (special[size_t(id)]) continue;
        try {
            bytes[size_t(id)] = tok.token_bytes(uint32_t(id));
        } catch (const ConfigError&) {
            continue;  // a rank no token has
        }
        ordinary[size_t(id)] = true;
        text[size_t(id)] = byte_level_text(bytes[size_t(id)]);
        if (vocab.contains(text[size_t(id)]))
            throw ConfigError("tokenizer " + tok.describe() + ": two tokens have the bytes of token " +
                              std::to_string(id) + "; a tokenizer.json vocabulary needs them unique");
        vocab[text[size_t(id)]] = id;
    }
    json merges = json::array();
    if (tiktoken) {
        for (const std::string& mg : merges_from_ranks(bytes, ordinary, text)) {
            const size_t sp = mg.find(' ');  // byte-level text has no ' ' (it is U+0120)
            merges.push_back({mg.substr(0, sp), mg.substr(sp + 1)});
        }
    } else {
        for (const auto& [a, b] : tok.state().merges) merges.push_back({text[a], text[b]});
    }
    const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                             {"use_regex", !tiktoken}};
    json pre = byte_level;
    if (tiktoken) {
        const std::string& p = tok.state().pattern;
        const char* preset = pretokenizer_preset(p);
        const json split = {{"type", "Split"}, {"pattern", {{"Regex", preset ? std::string(preset) : p}}},
                            {"behavior", "Isolated"}, {"invert", false}};
        pre = {{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level})}};
    }
    return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
            {"normalizer", nullptr}, {"pre_tokenizer", pre}, {"post_processor", nullptr}, {"decoder", byte_level},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                       {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                       {"byte_fallback", false}, {"ignore_merges", tiktoken}, {"vocab", vocab}, {"merges", merges}}}};
}

void write_text(const fs::path& p, const std::string& text) {
    write_atomically(p.string(), [&](const std::string& tmp) {
        std::ofstream out(tmp, std::ios::binary);
        out << text;
        if (!out.flush()) throw RankError("export: writing '" + tmp + "' failed");
    });
}

std::string read_text_or_empty(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return in ? std::string(std::istreambuf_iterator<char>(in), {}) : std::string();
}

std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw ConfigError("import: '" + p.string() + "' is missing or unreadable");
    return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

std::string hf_unsupported(const ExportModel& m) {
    const ModelConfig& c = m.deck.model;
    const std::string& k = m.tokenizer.kind();
    if (k == "bpe" && m.tokenizer.state().pattern.empty())
        return "the tokenizer is a format-1 bpe (pre-split by hand), which tokenizer.json cannot express";
    if (c.attention == "mha" && c.moe.experts > 0)
        return "model.attention = mha with moe.experts > 0: Hugging Face's Llama has no MoE (export MoE with mla)";
    if (c.attention == "mla" && first_dense(c) < 0)
        return "moe.layers = " + c.moe.layers.text() + ": DeepSeek needs the dense layers first (first_k_dense_replace)";
    if (c.attention == "mla") return hf_target(c, m.deck.rope).why_not;
    return "";
}

std::string hf_export_recognise(const fs::path& dir) {
    // Exactly the files an export writes, and quintet's own: tokenizer_config.json names the
    // quintet tokenizer kind, or (written before it did for every kind) generation_config.json is
    // the one quintet writes, with no key of Transformers' own (transformers_version, ...).
    static const std::set<std::string> kFiles = {"config.json", "generation_config.json", "tokenizer.json",
                                                 "tokenizer_config.json", "tokenizer.model", "model.safetensors",
                                                 "model.safetensors.index.json"};
    std::error_code ec;
    bool config = false, weights = false;
    std::map<std::string, bool> entries;  // name -> a regular file; sorted, so the message is stable
    for (const auto& e : fs::directory_iterator(dir, ec)) entries[e.path().filename().string()] = e.is_regular_file(ec);
    for (const auto& [name, regular] : entries) {
        static const std::regex kShard("model-[0-9]{5}-of-[0-9]{5}\\.safetensors");
        const bool shard = std::regex_match(name, kShard);
        if ((!kFiles.count(name) && !shard) || !regular) return "it holds '" + name + "', which no export writes";
        config = config || name == "config.json";
        weights = weights || shard || name == "model.safetensors";
    }
    if (ec) return "it cannot be listed: " + ec.message();
    if (!config || !weights) return "it has no config.json and safetensors";
    const json tc = json::parse(read_text_or_empty(dir / "tokenizer_config.json"), nullptr, false);
    if (tc.is_object() && tc.contains("quintet_tokenizer")) return "";
    const json gen = json::parse(read_text_or_empty(dir / "generation_config.json"), nullptr, false);
    if (gen.is_object() && gen.value("do_sample", true) == false) {
        bool own = true;
        for (auto& [k, v] : gen.items()) own = own && (k == "do_sample" || k == "bos_token_id" || k == "eos_token_id");
        if (own) return "";
    }
    return "its tokenizer_config.json and generation_config.json are not the ones quintet writes";
}

void hf_export(const ExportModel& m, const OutputTarget& out, const std::string& dtype, uint64_t max_shard_bytes) {
    if (std::string why = hf_unsupported(m); !why.empty()) throw ConfigError("export --format hf: " + why);
    const ModelConfig& c = m.deck.model;
    std::vector<NamedTensor> tensors = m.tensors;
    const HfTarget target = is_deepseek(c) ? hf_target(c, m.deck.rope) : HfTarget{};
    if (target.fold_softmax) {  // q . k x m(b)^2 = (m(b)^2 q) . k: every query projection scaled
        const double f = yarn_m(m.deck.rope, m.deck.rope.mscale_all_dim);
        for (NamedTensor& t : tensors)
            if (t.name.find(".self_attn.q_proj.weight") != std::string::npos ||
                t.name.find(".self_attn.q_b_proj.weight") != std::string::npos)
                for (float& x : t.data) x = float(double(x) * f * f);
    }
    if (target.v3 && c.moe.experts > 0 && c.moe.balance != "aux_free")  // its router always adds the bias
        for (int l = 0; l < c.n_layers + c.mtp_depth; ++l)
            if (moe_layer(c, l)) {
                NamedTensor b;
                b.name = "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias";
                b.rows = c.moe.experts, b.cols = 1, b.ndim = 1;
                b.data.assign(size_t(c.moe.experts), 0.0f);
                tensors.push_back(std::move(b));
            }
    add_mtp_copies(tensors, c);
    if (is_deepseek(c)) deepseek_rope_rows(tensors, c, false);
    const json config = config_json(m, dtype, target);
    json tok_json;
    const std::string& kind = m.tokenizer.kind();
    if (kind == "byte" || kind == "bpe" || kind == "tiktoken") tok_json = tokenizer_json(m.tokenizer);
    // Built in a temporary sibling directory, then put in the place of the output in one step.
    output_write_directory(out, hf_export_recognise, [&](const fs::path& tmp) {
        safetensors_write(tmp.string(), tensors, dtype, max_shard_bytes);
        write_text(tmp / "config.json", config.dump(2) + "\n");
        json gen = {{"do_sample", false}};
        for (const SpecialToken& s : m.tokenizer.specials())
            if (s.text == "<|endoftext|>" || s.text == "<|end_of_text|>" || s.text == "</s>") {
                gen["bos_token_id"] = s.id;
                gen["eos_token_id"] = s.id;
            }
        write_text(tmp / "generation_config.json", gen.dump(2) + "\n");
        // tokenizer_config.json names the quintet kind (an import gives back the same tokenizer,
        // and a later export with --force recognises the directory as quintet's).
        if (!tok_json.is_null()) {
            write_text(tmp / "tokenizer.json", tok_json.dump() + "\n");
            write_text(tmp / "tokenizer_config.json",
                       json({{"tokenizer_class", "PreTrainedTokenizerFast"}, {"add_bos_token", false},
                             {"add_eos_token", false}, {"clean_up_tokenization_spaces", false},
                             {"quintet_tokenizer", kind}})
                               .dump(2) + "\n");
        } else if (kind == "hf") {
            write_text(tmp / "tokenizer.json", m.tokenizer.state().file);
            write_text(tmp / "tokenizer_config.json",
                       json({{"tokenizer_class", "PreTrainedTokenizerFast"}, {"quintet_tokenizer", kind}}).dump(2) +
                           "\n");
        } else if (kind == "spm") {
            write_text(tmp / "tokenizer.model", m.tokenizer.state().file);
            write_text(tmp / "tokenizer_config.json",
                       json({{"tokenizer_class", "LlamaTokenizer"}, {"quintet_tokenizer", kind}}).dump(2) + "\n");
        }
    });
}

namespace {

// config.json's values, each read as its JSON type says and range-checked before use: a ConfigError
// names the key, the value as written and what is valid (an integer is read in 64 bits, so 2^32 +
// 1024 is not taken for 1024).
class ConfigReader {
public:
    ConfigReader(const json& cfg, std::string path) : cfg_(cfg), path_(std::move(path)) {}
    bool has(const std::string& key) const { return cfg_.contains(key) && !cfg_[key].is_null(); }
    [[noreturn]] void refuse(const std::string& key, const std::string& value, const std::string& valid) const {
        throw ConfigError("import: " + path_ + ": " + key + " = " + value + " is not supported (" + valid + ")");
    }
    [[noreturn]] void invalid(const std::string& key, const std::string& valid) const {
        throw ConfigError("import: " + path_ + ": " + key + " = " + cfg_[key].dump() + ": expected " + valid);
    }
    // An integer in [lo, hi]; `dflt` when absent (required when there is none).
    int integer(const std::string& key, int64_t lo, int64_t hi, std::optional<int64_t> dflt = std::nullopt) const {
        const std::string valid = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        if (!has(key)) {
            if (!dflt) throw ConfigError("import: " + path_ + ": " + key + " is missing (" + valid + ")");
            return int(*dflt);
        }
        const json& v = cfg_[key];
        if (!v.is_number_integer()) invalid(key, valid);
        if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(hi) : (v.get<int64_t>() < lo || v.get<int64_t>() > hi))
            invalid(key, valid);
        return int(v.get<int64_t>());
    }
    double number(const std::string& key, double dflt) const {
        if (!has(key)) return dflt;
        if (!cfg_[key].is_number() || !std::isfinite(cfg_[key].get<double>())) invalid(key, "a finite number");
        return cfg_[key].get<double>();
    }
    bool boolean(const std::string& key, bool dflt) const {
        if (!has(key)) return dflt;
        if (!cfg_[key].is_boolean()) invalid(key, "true or false");
        return cfg_[key].get<bool>();
    }
    std::string text(const std::string& key, const std::string& dflt) const {
        if (!has(key)) return dflt;
        if (!cfg_[key].is_string()) invalid(key, "a string");
        return cfg_[key].get<std::string>();
    }
    const json& at(const std::string& key) const { return cfg_[key]; }

private:
    const json& cfg_;
    std::string path_;
};

constexpr int64_t kMaxInt = 2147483647;

// The config.json key each deck key was read from, for messages.
const std::map<std::string, std::string> kConfigKeyOf = {
    {"model.d_model", "hidden_size"}, {"model.n_layers", "num_hidden_layers"},
    {"model.n_heads", "num_attention_heads"}, {"model.n_kv_heads", "num_key_value_heads"},
    {"model.ffn_dim", "intermediate_size"}, {"model.norm_eps", "rms_norm_eps"},
    {"model.vocab_size", "vocab_size"}, {"model.q_lora_rank", "q_lora_rank"},
    {"model.kv_lora_rank", "kv_lora_rank"}, {"model.qk_nope_dim", "qk_nope_head_dim"},
    {"model.qk_rope_dim", "qk_rope_head_dim"}, {"model.v_head_dim", "v_head_dim"},
    {"rope.theta", "rope_theta"}, {"rope.factor", "rope_scaling.factor"},
    {"rope.original_max_position", "rope_scaling.original_max_position_embeddings"},
    {"rope.beta_fast", "rope_scaling.beta_fast"}, {"rope.beta_slow", "rope_scaling.beta_slow"},
    {"moe.experts", "n_routed_experts"}, {"moe.top_k", "num_experts_per_tok"},
    {"moe.shared_experts", "n_shared_experts"}, {"moe.ffn_dim", "moe_intermediate_size"},
    {"moe.layers", "first_k_dense_replace"}, {"data.seq_len", "max_position_embeddings"},
    {"moe.groups", "n_group"}, {"moe.group_top_k", "topk_group"}, {"moe.routed_scaling", "routed_scaling_factor"},
    {"moe.aux_coef", "aux_loss_alpha"}, {"rope.mscale", "rope_scaling.mscale"},
    {"rope.mscale_all_dim", "rope_scaling.mscale_all_dim"}, {"model.mtp_depth", "num_nextn_predict_layers"}};

// The deck import makes must be one quintet accepts: each key's own range (the deck's option
// table, as a deck file is read) and the checks across keys (deck_validate, one rank). A
// refusal names the config.json key it came from.
void validate_imported_deck(const Deck& deck, const std::string& cfg_path) {
    try {
        deck_parse_text(deck_to_text(deck));
        deck_validate(deck, 1, /*check_host_memory=*/false);
    } catch (const ConfigError& e) {
        // config_fail's form: deck key 'model.norm_eps' = '0': ...
        const std::string msg = e.what();
        std::string from;
        for (const auto& [key, hf] : kConfigKeyOf)
            if (msg.rfind("deck key '" + key + "'", 0) == 0) from = hf;
        throw ConfigError("import: " + cfg_path + (from.empty() ? "" : " (" + from + ")") +
                          " makes a model quintet refuses: " + msg);
    }
}

// The layer index of a tensor name "model.layers.<i>.<...>", or -1.
int64_t layer_of(const std::string& name) {
    static const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) != 0) return -1;
    const size_t dot = name.find('.', prefix.size());
    const std::string digits = name.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(digits);
}

}  // namespace

void hf_import(const std::string& dir, const std::string& output) {
    const fs::path cfg_path = fs::path(dir) / "config.json";
    json cfg_json;
    try {
        cfg_json = json::parse(read_text(cfg_path));
    } catch (const json::parse_error& e) {
        throw ConfigError("import: '" + cfg_path.string() + "' is not JSON: " + e.what());
    }
    if (!cfg_json.is_object()) throw ConfigError("import: '" + cfg_path.string() + "' is not a JSON object");
    const ConfigReader cfg(cfg_json, cfg_path.string());
    const std::string type = cfg.text("model_type", "");
    const bool ds = type == "deepseek_v2" || type == "deepseek_v3";
    if (type != "llama" && !ds) cfg.refuse("model_type", "\"" + type + "\"", "llama, deepseek_v2, deepseek_v3");
    if (cfg.text("hidden_act", "silu") != "silu") cfg.refuse("hidden_act", cfg.at("hidden_act").dump(), "silu");
    if (cfg.boolean("attention_bias", false)) cfg.refuse("attention_bias", "true", "linear layers without biases");
    if (cfg.boolean("mlp_bias", false)) cfg.refuse("mlp_bias", "true", "linear layers without biases");
    if (cfg.has("sliding_window"))
        cfg.refuse("sliding_window", cfg.at("sliding_window").dump(), "full causal attention: null");

    Deck deck;
    ModelConfig& c = deck.model;
    c.d_model = cfg.integer("hidden_size", 1, kMaxInt);
    c.n_layers = cfg.integer("num_hidden_layers", 1, kMaxInt);
    c.n_heads = cfg.integer("num_attention_heads", 1, kMaxInt);
    c.ffn_dim = cfg.integer("intermediate_size", 1, kMaxInt);
    c.vocab_size = cfg.integer("vocab_size", 1, kMaxInt);
    c.norm_eps = cfg.number("rms_norm_eps", 1e-6);
    c.tie_embeddings = cfg.boolean("tie_word_embeddings", false);
    deck.rope.theta = cfg.number("rope_theta", 10000.0);
    const int max_pos = cfg.integer("max_position_embeddings", 2, kMaxInt, 2048);
    int trained = max_pos;
    if (cfg.has("rope_scaling")) {
        if (!cfg.at("rope_scaling").is_object()) cfg.invalid("rope_scaling", "an object or null");
        const ConfigReader rs(cfg.at("rope_scaling"), cfg_path.string() + ": rope_scaling");
        const std::string rt = rs.text("rope_type", rs.text("type", ""));
        if (rt != "yarn") cfg.refuse("rope_scaling.rope_type", "\"" + rt + "\"", "yarn or no rope_scaling");
        deck.rope.scaling = "yarn";
        deck.rope.factor = rs.number("factor", 1.0);
        deck.rope.original_max_position = rs.integer("original_max_position_embeddings", 2, kMaxInt, max_pos);
        deck.rope.beta_fast = rs.number("beta_fast", 32.0);
        deck.rope.beta_slow = rs.number("beta_slow", 1.0);
        trained = deck.rope.original_max_position;
        if (deck.rope.factor <= 1.0) cfg.refuse("rope_scaling.factor", rs.at("factor").dump(), "YaRN needs a factor > 1");
        // The temperature (docs/math.md §4.4). DeepSeek's code reads mscale (default 1) and
        // mscale_all_dim (default 0: no softmax factor); Transformers' attention_factor, when
        // given, replaces the cos/sin factor m(mscale) / m(mscale_all_dim).
        const double ln = 0.1 * std::log(deck.rope.factor);
        auto solve = [&](double table, double b, const std::string& key) {  // m(a) / m(b) = table
            const double a = (table * yarn_mscale(deck.rope.factor, b) - 1.0) / ln;
            if (!(a >= 0.0 && a <= 1e3))
                cfg.refuse(key, rs.at(key).dump(), "a cos/sin factor quintet's rope.mscale in [0, 1000] gives");
            return a;
        };
        if (ds) {
            deck.rope.mscale_all_dim = rs.number("mscale_all_dim", 0.0);
            deck.rope.mscale = rs.has("attention_factor")
                                   ? solve(rs.number("attention_factor", 1.0), deck.rope.mscale_all_dim, "attention_factor")
                                   : rs.number("mscale", 1.0);
        } else {  // Llama: the logits times the square of Transformers' cos/sin factor
            const double a = rs.number("mscale", 0.0), b = rs.number("mscale_all_dim", 0.0);
            const double table = rs.has("attention_factor") ? rs.number("attention_factor", 1.0)
                                 : a != 0.0 && b != 0.0 ? yarn_mscale(deck.rope.factor, a) / yarn_mscale(deck.rope.factor, b)
                                                         : yarn_mscale(deck.rope.factor, 1.0);
            deck.rope.mscale = solve(table, 0.0, rs.has("attention_factor") ? "attention_factor" : "mscale");
        }
        if (deck.rope.mscale < 0 || deck.rope.mscale > 1e3 || deck.rope.mscale_all_dim < 0 || deck.rope.mscale_all_dim > 1e3)
            cfg.refuse("rope_scaling.mscale / mscale_all_dim", cfg.at("rope_scaling").dump(), "numbers in [0, 1000]");
    }
    if (!ds) {
        c.attention = "mha";
        c.n_kv_heads = cfg.integer("num_key_value_heads", 1, kMaxInt, c.n_heads);
        if (cfg.has("head_dim") && int64_t(cfg.integer("head_dim", 1, kMaxInt)) * c.n_heads != c.d_model)
            cfg.refuse("head_dim", cfg.at("head_dim").dump(), "hidden_size / num_attention_heads");
    } else {
        c.attention = "mla";
        c.n_kv_heads = 0;
        c.q_lora_rank = cfg.integer("q_lora_rank", 1, kMaxInt, 0);
        c.kv_lora_rank = cfg.integer("kv_lora_rank", 1, kMaxInt);
        c.qk_nope_dim = cfg.integer("qk_nope_head_dim", 1, kMaxInt);
        c.qk_rope_dim = cfg.integer("qk_rope_head_dim", 1, kMaxInt);
        c.v_head_dim = cfg.integer("v_head_dim", 1, kMaxInt);
        if (cfg.has("n_routed_experts")) {
            c.moe.experts = cfg.integer("n_routed_experts", 1, kMaxInt);
            c.moe.top_k = cfg.integer("num_experts_per_tok", 1, kMaxInt);
            c.moe.shared_experts = cfg.integer("n_shared_experts", 0, kMaxInt, 0);
            c.moe.ffn_dim = cfg.integer("moe_intermediate_size", 1, kMaxInt);
            c.moe.norm_topk = cfg.boolean("norm_topk_prob", false);
            const int k = cfg.integer("first_k_dense_replace", 0, kMaxInt, 0);
            if (cfg.integer("moe_layer_freq", 1, kMaxInt, 1) != 1) cfg.refuse("moe_layer_freq", cfg.at("moe_layer_freq").dump(), "1");
            // The router (docs/math.md §9) as DeepSeek's released code computes it for each model
            // type; the defaults are each type's.
            const bool v3 = type == "deepseek_v3";
            c.moe.scoring = cfg.text("scoring_func", v3 ? "sigmoid" : "softmax");
            if (c.moe.scoring != "softmax" && c.moe.scoring != "sigmoid")
                cfg.refuse("scoring_func", cfg.at("scoring_func").dump(), "\"softmax\" or \"sigmoid\"");
            const std::string method = cfg.text("topk_method", v3 ? "noaux_tc" : "greedy");
            if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc")
                cfg.refuse("topk_method", "\"" + method + "\"", "greedy, group_limited_greedy, noaux_tc");
            c.moe.topk_method = method;
            c.moe.groups = cfg.integer("n_group", 1, 64, 1);
            c.moe.group_top_k = cfg.integer("topk_group", 1, 64, c.moe.groups);
            if (method == "greedy" && (c.moe.groups != 1 || c.moe.group_top_k != 1)) {
                // greedy ignores the groups: they limit nothing
                c.moe.groups = c.moe.group_top_k = 1;
            }
            c.moe.routed_scaling = cfg.number("routed_scaling_factor", 1.0);
            // DeepSeek-V2's code either renormalises (top_k > 1) or scales, never both.
            if (!v3 && c.moe.norm_topk && c.moe.top_k > 1) c.moe.routed_scaling = 1.0;
            if (cfg.has("aux_loss_alpha")) c.moe.aux_coef = cfg.number("aux_loss_alpha", c.moe.aux_coef);
            // noaux_tc is trained aux-loss-free: the correction bias, moved by DeepSeek-V3's sign rule.
            c.moe.balance = method == "noaux_tc" ? "aux_free" : "aux_loss";
            if (method == "noaux_tc") c.moe.bias_update = "sign", c.moe.bias_rate = 0.001;
            if (k >= c.n_layers) cfg.refuse("first_k_dense_replace", std::to_string(k), "fewer than num_hidden_layers");
            if (!c.moe.layers.parse(k == 0 ? "all" : std::to_string(k) + (k + 1 < c.n_layers ? "-" + std::to_string(c.n_layers - 1) : "")))
                throw ConfigError("import: cannot express the MoE layers");
        }
    }
    // DeepSeek-V3's multi-token prediction modules (num_nextn_predict_layers: the layers after
    // the last decoder layer): model.mtp_depth when the files hold them, else none.
    const int nextn = ds ? cfg.integer("num_nextn_predict_layers", 0, 64, 0) : 0;
    deck.data.seq_len = std::min(deck.data.seq_len, trained);

    // The tensors the files hold, from their headers alone (nothing large is read or allocated
    // before the configuration agrees with them): a num_hidden_layers of 10^9 fails here at once.
    const std::vector<SafetensorsEntry> entries = safetensors_index(dir);
    std::map<std::string, const SafetensorsEntry*> by_name;
    int64_t last_layer = -1;
    for (const SafetensorsEntry& e : entries) {
        by_name[e.name] = &e;
        last_layer = std::max(last_layer, layer_of(e.name));
    }
    if (c.n_layers != last_layer + 1 && !(nextn > 0 && c.n_layers + nextn == last_layer + 1))
        cfg.refuse("num_hidden_layers", std::to_string(c.n_layers),
                   "the safetensors hold " + std::to_string(last_layer + 1) + " layers (model.layers.0 to " +
                       std::to_string(last_layer) + ")" +
                       (nextn ? ", num_nextn_predict_layers = " + std::to_string(nextn) : std::string()));
    if (nextn > 0 && c.n_layers + nextn == last_layer + 1) {
        c.mtp_depth = nextn;
    } else if (nextn > 0) {
        std::printf("import: config.json names %d multi-token prediction layer(s), the files hold none: the model "
                    "is imported without them (model.mtp_depth = 0)\n", nextn);
    }
    // The MTP layers' copies of the shared embedding and output head (DeepSeek-V3's layout) are
    // not tensors of their own in quintet, which shares the model's: their shapes are checked,
    // their values not read.
    for (int k = 0; k < c.mtp_depth; ++k)
        for (const char* copy : {"embed_tokens.weight", "shared_head.head.weight"}) {
            const std::string name = "model.layers." + std::to_string(c.n_layers + k) + "." + copy;
            auto it = by_name.find(name);
            if (it == by_name.end()) continue;
            if (it->second->rows != c.vocab_size || it->second->cols != c.d_model)
                throw ConfigError("import: tensor " + name + " is [" + std::to_string(it->second->rows) + ", " +
                                  std::to_string(it->second->cols) + "], not the shared [vocab_size, hidden_size]");
            by_name.erase(it);
        }
    const std::string embed = "model.embed_tokens.weight";
    if (!by_name.count(embed)) throw ConfigError("import: --input '" + dir + "' has no tensor " + embed);
    if (by_name[embed]->rows != c.vocab_size || by_name[embed]->cols != c.d_model)
        throw ConfigError("import: tensor " + embed + " is [" + std::to_string(by_name[embed]->rows) + ", " +
                          std::to_string(by_name[embed]->cols) + "] but config.json makes it [" +
                          std::to_string(c.vocab_size) + ", " + std::to_string(c.d_model) + "] (vocab_size, hidden_size)");

    // The tokenizer: tokenizer.json, else a SentencePiece tokenizer.model.
    Tokenizer tok;
    const fs::path tj = fs::path(dir) / "tokenizer.json", tm = fs::path(dir) / "tokenizer.model";
    const fs::path tc = fs::path(dir) / "tokenizer_config.json";
    const json tc_json = fs::exists(tc) ? json::parse(read_text(tc), nullptr, false) : json();
    const std::string quintet_kind =
        tc_json.is_object() && tc_json.contains("quintet_tokenizer") && tc_json["quintet_tokenizer"].is_string()
            ? tc_json["quintet_tokenizer"].get<std::string>()
            : "";
    if (fs::exists(tj))
        tok = tokenizer_load({"hf:" + tj.string(), "", ""}, "import: " + tj.string());
    else if (fs::exists(tm))
        tok = tokenizer_load({"spm:" + tm.string(), "", ""}, "import: " + tm.string());
    else
        throw ConfigError("import: --input '" + dir + "' has no tokenizer.json or tokenizer.model");
    // quintet's own byte and bpe tokenizers, exported as tokenizer.json, come back as themselves
    // (the same encoding either way), so the imported checkpoint trains on quintet's token files.
    if (quintet_kind == "byte" && tok.vocab_size() == 256 && tok.state().merges.empty()) {
        tok = Tokenizer();
    } else if (quintet_kind == "bpe") {
        TokenizerState s;
        s.kind = "bpe";
        s.pattern = pretokenizer_preset("gpt2");
        const json tj_json = json::parse(read_text(tj));
        const json& vocab = tj_json.at("model").at("vocab");
        for (const json& m : tj_json.at("model").at("merges")) {
            const std::string a = m.is_array() ? m[0].get<std::string>() : m.get<std::string>().substr(0, m.get<std::string>().find(' '));
            const std::string b = m.is_array() ? m[1].get<std::string>() : m.get<std::string>().substr(m.get<std::string>().find(' ') + 1);
            s.merges.push_back({vocab.at(a).get<uint32_t>(), vocab.at(b).get<uint32_t>()});
        }
        for (const json& t : tj_json.value("added_tokens", json::array()))
            s.specials.push_back({t.at("content").get<std::string>(), t.at("id").get<uint32_t>()});
        Tokenizer bpe = tokenizer_from_state(s, "import: " + tj.string());
        if (bpe.vocab_size() == tok.vocab_size()) tok = bpe;
    }
    if (c.vocab_size != tok.vocab_size())
        cfg.refuse("vocab_size", std::to_string(c.vocab_size),
                   "the tokenizer's vocabulary, " + std::to_string(tok.vocab_size()) + " (" + tok.describe() + ")");
    // The model the configuration makes must be one quintet trains (the deck's own checks).
    validate_imported_deck(deck, cfg_path.string());

    // Tensors: every one the model needs, of its shape, and nothing else -- checked on the
    // headers before any value is read.
    const ParamTable table = make_param_table(c);
    std::vector<const SafetensorsEntry*> sources;
    for (const LogicalTensor& lt : table.logical) {
        auto it = by_name.find(lt.name);
        if (it == by_name.end()) {
            if (lt.name.find("e_score_correction_bias") != std::string::npos) {  // greedy models have none
                sources.push_back(nullptr);
                continue;
            }
            throw ConfigError("import: --input '" + dir + "' has no tensor " + lt.name);
        }
        const SafetensorsEntry& e = *it->second;
        if (e.rows != lt.rows || e.cols != lt.cols)
            throw ConfigError("import: tensor " + lt.name + " is [" + std::to_string(e.rows) + ", " +
                              std::to_string(e.cols) + "] but config.json makes it [" + std::to_string(lt.rows) + ", " +
                              std::to_string(lt.cols) + "]");
        sources.push_back(&e);
        by_name.erase(it);
    }
    if (!by_name.empty())
        throw ConfigError("import: tensor " + by_name.begin()->first + " of --input '" + dir +
                          "' is not part of the model config.json describes (" + std::to_string(by_name.size()) +
                          " such tensors)");

    // The checkpoint: parameters at step 0, zero moments, the deck and the tokenizer. Each
    // tensor is read (non-finite values refused, naming it), its DeepSeek rotary rows put back,
    // and copied into place.
    std::vector<float> params(table.total, 0.0f), zeros(table.total, 0.0f);
    for (size_t i = 0; i < table.logical.size(); ++i) {
        if (!sources[i]) continue;  // zeros
        std::vector<NamedTensor> one;
        one.push_back(safetensors_load(*sources[i]));
        if (ds) deepseek_rope_rows(one, c, /*inverse=*/true);
        std::copy(one[0].data.begin(), one[0].data.end(), params.begin() + long(table.offset_of(one[0].name)));
    }
    std::vector<ArenaRange> writes;
    for (int r = 0; r < kNumRegions; ++r) {
        const Range& reg = table.region[r];
        if (reg.size() == 0) continue;
        writes.push_back({reg, r == int(Replicas::none) ? 0 : reg.lo});
    }
    // Fresh AdamW moments (zeros), indexed like the arena.
    OptimizerStateIo state;
    state.exp_avg = state.exp_avg_sq = zeros.data();
    state.ranges = writes;
    CheckpointMeta meta;
    meta.deck = deck_to_text(deck);
    meta.layout = "tp=1 cp=1 dp=1 pp=1 zero=0";
    meta.trained_context = trained;
    meta.tokenizer = tok.state();
    // Written into a temporary sibling folder as a one-rank run's checkpoint, then renamed into
    // place (replacing an earlier import only: import_output_recognise).
    const fs::path run_dir = output_temp_dir(output);
    std::error_code ec;
    try {
        MpiCommunicator self(MPI_COMM_SELF, "self");
        const std::string written =
            checkpoint_save(self, run_dir.string(), meta, table, params.data(), writes, state, 1);
        fs::rename(written, output);
    } catch (...) {
        fs::remove_all(run_dir, ec);
        throw;
    }
    fs::remove_all(run_dir, ec);
}

std::string import_output_recognise(const fs::path& file) {
    CheckpointMeta meta;
    try {
        meta = checkpoint_read_meta(file.string());
    } catch (const ConfigError&) {
        return "it is not a quintet checkpoint";
    }
    if (meta.step != 0) return "it is a checkpoint of step " + std::to_string(meta.step) + ", not an import";
    if (fs::exists(file.parent_path() / "latest")) return "it is in a run's checkpoints folder";
    return "";
}

}  // namespace quintet
