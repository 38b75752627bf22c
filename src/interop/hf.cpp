// Hugging Face directories (docs/interop.md): quintet's checkpoint names are Hugging Face's, so
// export and import are the configuration, the tokenizer files and, for DeepSeek (whose code
// reads the rotary rows interleaved), the RoPE row permutation.
#include "quintet/interop/hf.hpp"

#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <nlohmann/json.hpp>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/core/error.hpp"
#include "quintet/interop/gguf_vocab.hpp"
#include "quintet/interop/safetensors.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/model/params.hpp"
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

json config_json(const ExportModel& m, const std::string& dtype) {
    const ModelConfig& c = m.deck.model;
    const RopeConfig& r = m.deck.rope;
    json j;
    const bool ds = is_deepseek(c);
    const bool v3 = ds && c.moe.experts > 0 && c.moe.balance == "aux_free";
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
    if (r.scaling == "yarn") {
        json y = {{"type", "yarn"}, {"rope_type", "yarn"}, {"factor", r.factor},
                  {"original_max_position_embeddings", m.rope_original_context()},
                  {"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow}};
        if (ds) {  // softmax scale times (0.1 * mscale_all_dim * ln s + 1)^2; cos/sin unscaled
            y["mscale"] = 1.0;
            y["mscale_all_dim"] = 1.0;
        }
        j["rope_scaling"] = y;
    } else {
        j["rope_scaling"] = nullptr;
    }
    if (ds) {
        j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
        j["kv_lora_rank"] = c.kv_lora_rank;
        j["qk_nope_head_dim"] = c.qk_nope_dim;
        j["qk_rope_head_dim"] = c.qk_rope_dim;
        j["v_head_dim"] = c.v_head_dim;
        j["n_routed_experts"] = c.moe.experts > 0 ? json(c.moe.experts) : json(nullptr);
        j["num_experts_per_tok"] = c.moe.experts > 0 ? json(c.moe.top_k) : json(nullptr);
        j["n_shared_experts"] = c.moe.experts > 0 ? json(c.moe.shared_experts) : json(nullptr);
        j["moe_intermediate_size"] = c.expert_ffn_width();
        j["first_k_dense_replace"] = first_dense(c);
        j["moe_layer_freq"] = 1;
        j["norm_topk_prob"] = c.moe.norm_topk;
        j["scoring_func"] = "softmax";
        j["topk_method"] = v3 ? "noaux_tc" : "greedy";
        j["n_group"] = 1;
        j["topk_group"] = 1;
        j["routed_scaling_factor"] = 1.0;
        j["aux_loss_alpha"] = c.moe.balance == "aux_loss" ? c.moe.aux_coef : 0.0;
    }
    return j;
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
    std::vector<NamedTensor> tensors = m.tensors;
    if (is_deepseek(m.deck.model)) deepseek_rope_rows(tensors, m.deck.model, false);
    const json config = config_json(m, dtype);
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

void hf_import(const std::string& dir, const std::string& output) {
    const fs::path cfg_path = fs::path(dir) / "config.json";
    json cfg;
    try {
        cfg = json::parse(read_text(cfg_path));
    } catch (const json::parse_error& e) {
        throw ConfigError("import: '" + cfg_path.string() + "' is not JSON: " + e.what());
    }
    auto refuse = [&](const std::string& key, const std::string& value, const std::string& valid) {
        throw ConfigError("import: " + cfg_path.string() + ": " + key + " = " + value + " is not supported (" + valid + ")");
    };
    auto get_int = [&](const std::string& key) -> int {
        if (!cfg.contains(key) || !cfg[key].is_number_integer())
            throw ConfigError("import: " + cfg_path.string() + ": " + key + " is missing or not an integer");
        return cfg[key].get<int>();
    };
    const std::string type = cfg.value("model_type", "");
    const bool ds = type == "deepseek_v2" || type == "deepseek_v3";
    if (type != "llama" && !ds) refuse("model_type", "\"" + type + "\"", "llama, deepseek_v2, deepseek_v3");
    if (cfg.value("hidden_act", "silu") != "silu") refuse("hidden_act", cfg["hidden_act"].dump(), "silu");
    if (cfg.value("attention_bias", false)) refuse("attention_bias", "true", "linear layers without biases");
    if (cfg.value("mlp_bias", false)) refuse("mlp_bias", "true", "linear layers without biases");
    if (cfg.contains("sliding_window") && !cfg["sliding_window"].is_null())
        refuse("sliding_window", cfg["sliding_window"].dump(), "full causal attention: null");

    Deck deck;
    ModelConfig& c = deck.model;
    c.d_model = get_int("hidden_size");
    c.n_layers = get_int("num_hidden_layers");
    c.n_heads = get_int("num_attention_heads");
    c.ffn_dim = get_int("intermediate_size");
    c.norm_eps = cfg.value("rms_norm_eps", 1e-6);
    c.tie_embeddings = cfg.value("tie_word_embeddings", false);
    deck.rope.theta = cfg.value("rope_theta", 10000.0);
    const int max_pos = cfg.value("max_position_embeddings", 2048);
    int trained = max_pos;
    if (cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null()) {
        const json& rs = cfg["rope_scaling"];
        const std::string rt = rs.value("rope_type", rs.value("type", ""));
        if (rt != "yarn") refuse("rope_scaling.rope_type", "\"" + rt + "\"", "yarn or no rope_scaling");
        deck.rope.scaling = "yarn";
        deck.rope.factor = rs.value("factor", 1.0);
        deck.rope.original_max_position = rs.value("original_max_position_embeddings", max_pos);
        deck.rope.beta_fast = rs.value("beta_fast", 32.0);
        deck.rope.beta_slow = rs.value("beta_slow", 1.0);
        trained = deck.rope.original_max_position;
        if (ds && (rs.value("mscale", 1.0) != rs.value("mscale_all_dim", 1.0) || rs.value("mscale_all_dim", 1.0) != 1.0))
            refuse("rope_scaling.mscale / mscale_all_dim", rs.value("mscale", 1.0) == 0 ? "0" : rs.dump(),
                   "quintet's YaRN scales the softmax by (0.1 ln s + 1)^2: mscale = mscale_all_dim = 1");
    }
    if (!ds) {
        c.attention = "mha";
        c.n_kv_heads = cfg.value("num_key_value_heads", c.n_heads);
        if (cfg.contains("head_dim") && !cfg["head_dim"].is_null() && cfg["head_dim"].get<int>() * c.n_heads != c.d_model)
            refuse("head_dim", cfg["head_dim"].dump(), "hidden_size / num_attention_heads");
    } else {
        c.attention = "mla";
        c.n_kv_heads = 0;
        c.q_lora_rank = cfg.contains("q_lora_rank") && !cfg["q_lora_rank"].is_null() ? cfg["q_lora_rank"].get<int>() : 0;
        c.kv_lora_rank = get_int("kv_lora_rank");
        c.qk_nope_dim = get_int("qk_nope_head_dim");
        c.qk_rope_dim = get_int("qk_rope_head_dim");
        c.v_head_dim = get_int("v_head_dim");
        const bool moe = cfg.contains("n_routed_experts") && !cfg["n_routed_experts"].is_null();
        if (moe) {
            c.moe.experts = get_int("n_routed_experts");
            c.moe.top_k = get_int("num_experts_per_tok");
            c.moe.shared_experts = cfg.value("n_shared_experts", 0);
            c.moe.ffn_dim = get_int("moe_intermediate_size");
            c.moe.norm_topk = cfg.value("norm_topk_prob", false);
            const int k = cfg.value("first_k_dense_replace", 0);
            if (cfg.value("moe_layer_freq", 1) != 1) refuse("moe_layer_freq", cfg["moe_layer_freq"].dump(), "1");
            if (cfg.value("scoring_func", "softmax") != "softmax")
                refuse("scoring_func", cfg["scoring_func"].dump(), "quintet's router is a softmax: \"softmax\"");
            if (cfg.value("routed_scaling_factor", 1.0) != 1.0)
                refuse("routed_scaling_factor", cfg["routed_scaling_factor"].dump(), "1.0");
            if (cfg.value("topk_group", 1) != cfg.value("n_group", 1))
                refuse("topk_group", cfg["topk_group"].dump(), "no group-limited routing: topk_group = n_group");
            const std::string method = cfg.value("topk_method", "greedy");
            if (method != "greedy" && method != "noaux_tc") refuse("topk_method", "\"" + method + "\"", "greedy, noaux_tc");
            c.moe.balance = method == "noaux_tc" ? "aux_free" : "aux_loss";
            if (k >= c.n_layers) refuse("first_k_dense_replace", std::to_string(k), "fewer than num_hidden_layers");
            if (!c.moe.layers.parse(k == 0 ? "all" : std::to_string(k) + (k + 1 < c.n_layers ? "-" + std::to_string(c.n_layers - 1) : "")))
                throw ConfigError("import: cannot express the MoE layers");
        }
    }

    // The tokenizer: tokenizer.json, else a SentencePiece tokenizer.model.
    Tokenizer tok;
    const fs::path tj = fs::path(dir) / "tokenizer.json", tm = fs::path(dir) / "tokenizer.model";
    const fs::path tc = fs::path(dir) / "tokenizer_config.json";
    const std::string quintet_kind =
        fs::exists(tc) ? json::parse(read_text(tc), nullptr, false).value("quintet_tokenizer", "") : "";
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
    c.vocab_size = get_int("vocab_size");
    if (c.vocab_size != tok.vocab_size())
        refuse("vocab_size", std::to_string(c.vocab_size),
               "the tokenizer's vocabulary, " + std::to_string(tok.vocab_size()) + " (" + tok.describe() + ")");

    // Tensors: every one the model needs, of its shape, and nothing else.
    std::vector<LoadedTensor> loaded = safetensors_read_dir(dir);
    std::map<std::string, size_t> by_name;
    for (size_t i = 0; i < loaded.size(); ++i) by_name[loaded[i].t.name] = i;
    const ParamTable table = make_param_table(c);
    std::vector<NamedTensor> tensors;
    for (const LogicalTensor& lt : table.logical) {
        auto it = by_name.find(lt.name);
        if (it == by_name.end()) {
            if (lt.name.find("e_score_correction_bias") != std::string::npos) {  // greedy models have none
                tensors.push_back({lt.name, lt.rows, lt.cols, lt.ndim, std::vector<float>(lt.numel(), 0.0f)});
                continue;
            }
            throw ConfigError("import: --input '" + dir + "' has no tensor " + lt.name);
        }
        NamedTensor& t = loaded[it->second].t;
        if (t.rows != lt.rows || t.cols != lt.cols)
            throw ConfigError("import: tensor " + lt.name + " is [" + std::to_string(t.rows) + ", " +
                              std::to_string(t.cols) + "] but config.json makes it [" + std::to_string(lt.rows) + ", " +
                              std::to_string(lt.cols) + "]");
        tensors.push_back(std::move(t));
        by_name.erase(it);
    }
    if (!by_name.empty())
        throw ConfigError("import: tensor " + by_name.begin()->first + " of --input '" + dir +
                          "' is not part of the model config.json describes (" + std::to_string(by_name.size()) +
                          " such tensors)");
    if (ds) deepseek_rope_rows(tensors, c, /*inverse=*/true);

    // The checkpoint: parameters at step 0, zero moments, the deck and the tokenizer.
    std::vector<float> params(table.total, 0.0f), zeros(table.total, 0.0f);
    for (const NamedTensor& t : tensors)
        std::copy(t.data.begin(), t.data.end(), params.begin() + long(table.offset_of(t.name)));
    std::vector<ArenaRange> writes;
    for (int r = 0; r < kNumRegions; ++r) {
        const Range& reg = table.region[r];
        if (reg.size() == 0) continue;
        writes.push_back({reg, r == int(Replicas::none) ? 0 : reg.lo});
    }
    deck.data.seq_len = std::min(deck.data.seq_len, trained);
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
            checkpoint_save(self, run_dir.string(), meta, table, params.data(), zeros.data(), zeros.data(), writes, 1);
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
