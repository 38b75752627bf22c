// The tokenizer in GGUF's terms (gguf_vocab.hpp). Which pre-tokenizer name llama.cpp has for which
// pattern, and how it then tokenizes, is llama.cpp's: docs/interop.md lists the names used here and
// what is known to differ.
#include "quintet/interop/gguf_vocab.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "quintet/core/error.hpp"
#include "quintet/interop/weights.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"
#include "quintet/tokenizer/sentencepiece.hpp"

namespace quintet {

namespace {

using json = nlohmann::json;

// Qwen 2's pattern (tokenizer.json): cl100k_base's with single digits.
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// llama.cpp's pre-tokenizer for a pattern: its name, whether llama.cpp then takes a piece that is
// itself a token whole (its `ignore_merges`), and what it does otherwise than the pattern.
struct LlamaPre {
    std::string name;
    bool ignore_merges = false;
    std::string differs;
};

bool llama_pre_of(const std::string& regex, LlamaPre& out) {
    const std::string preset = pretokenizer_preset_of(regex);
    if (preset == "gpt2") {
        out = {"gpt-2", false, ""};
    } else if (preset == "cl100k_base") {  // = Llama 3's tokenizer.json pattern
        out = {"llama-bpe", true, ""};
    } else if (preset == "o200k_base") {
        out = {"gpt-4o", false,
               "llama.cpp's gpt-4o pre-tokenizer approximates o200k_base's letter classes: a word's letters "
               "leave out combining marks (\\p{M}), so words with vowel signs or other marks (Devanagari, "
               "Thai, ...) are cut otherwise, and an upper-case letter is any letter but a-z, a lower-case one "
               "any letter but A-Z, so mixed-case words of other cased scripts may be too"};
    } else if (regex == kQwen2Pattern) {
        out = {"qwen2", false, ""};
    } else {
        return false;
    }
    return true;
}

const char* kKnownPatterns = "gpt2, cl100k_base (= Llama 3), o200k_base, Qwen 2's";

std::string pattern_text(const std::string& p) {
    if (const char* preset = pretokenizer_preset(p)) return preset;
    return p;
}

// The one regex of a tokenizer.json pre-tokenizer ("" when it has none or several), and whether a
// ByteLevel stage adds a prefix space.
void hf_pattern(const json& p, std::vector<std::string>& regexes, bool& prefix_space) {
    if (!p.is_object()) return;
    const std::string type = p.value("type", "");
    if (type == "Sequence" && p.contains("pretokenizers")) {
        for (const json& q : p["pretokenizers"]) hf_pattern(q, regexes, prefix_space);
    } else if (type == "ByteLevel") {
        prefix_space = prefix_space || p.value("add_prefix_space", false);
        if (p.value("use_regex", true)) regexes.push_back(pretokenizer_preset("gpt2"));
    } else if (type == "Split" && p.contains("pattern") && p["pattern"].contains("Regex")) {
        regexes.push_back(p["pattern"]["Regex"].get<std::string>());
    } else {
        regexes.push_back("(" + type + ")");
    }
}

struct HfFacts {
    std::string regex;  // "" when not exactly one
    bool prefix_space = false, nfc = false, ignore_merges = false;
    std::vector<std::string> merges;
    std::unordered_map<uint32_t, bool> added;  // id -> special
};

HfFacts hf_facts(const Tokenizer& tok) {
    const json j = json::parse(tok.state().file);  // already read once: valid
    HfFacts f;
    std::vector<std::string> regexes;
    if (j.contains("pre_tokenizer")) hf_pattern(j["pre_tokenizer"], regexes, f.prefix_space);
    if (regexes.size() == 1) f.regex = regexes[0];
    f.nfc = j.contains("normalizer") && j["normalizer"].is_object();
    const json& m = j["model"];
    f.ignore_merges = m.value("ignore_merges", false);
    for (const json& x : m["merges"])
        f.merges.push_back(x.is_string() ? x.get<std::string>() : x[0].get<std::string>() + " " + x[1].get<std::string>());
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
        for (const json& a : j["added_tokens"]) f.added[a["id"].get<uint32_t>()] = a.value("special", false);
    return f;
}

// The pattern of a byte-level tokenizer, "" for byte (no merges: any pattern gives the same ids).
std::string byte_level_pattern(const Tokenizer& tok) {
    if (tok.kind() == "byte") return pretokenizer_preset("gpt2");
    if (tok.kind() == "hf") return hf_facts(tok).regex;
    return pattern_text(tok.state().pattern);
}

// Token `id`'s bytes, or false for a gap in the ids (a rank no token has).
bool bytes_of(const Tokenizer& tok, uint32_t id, std::string& out) {
    try {
        out = tok.token_bytes(id);
        return true;
    } catch (const ConfigError&) {
        return false;
    }
}

std::string unused_text(int id) { return "<|quintet_unused_" + std::to_string(id) + "|>"; }

void set_ends(GgufVocab& v) {
    for (int id = 0; id < int(v.tokens.size()); ++id) {
        if (v.types[id] != 3 && v.types[id] != 4) continue;
        const std::string& t = v.tokens[id];
        if (v.eos < 0 && (t == "<|endoftext|>" || t == "<|end_of_text|>" || t == "</s>" || t == "<eos>")) v.eos = id;
        if (v.bos < 0 && (t == "<|begin_of_text|>" || t == "<s>" || t == "<bos>")) v.bos = id;
    }
    if (v.bos < 0) v.bos = v.eos;  // GPT-2's convention: <|endoftext|> both
}

void check_unique(const Tokenizer& tok, const GgufVocab& v) {
    std::unordered_map<std::string, int> seen;
    for (int id = 0; id < int(v.tokens.size()); ++id)
        if (auto [it, fresh] = seen.emplace(v.tokens[id], id); !fresh)
            throw ConfigError("tokenizer " + tok.describe() + ": tokens " + std::to_string(it->second) + " and " +
                              std::to_string(id) + " are the same text ('" + v.tokens[id] +
                              "'); llama.cpp needs every token to be unique");
}

}  // namespace

// Every split of each token into two tokens, in the order of the merged token's rank (= id), then
// the parts' ranks: tiktoken merges the adjacent pair whose concatenation ranks lowest, which a
// merge list in that order reproduces.
std::vector<std::string> merges_from_ranks(const std::vector<std::string>& bytes, const std::vector<bool>& ordinary,
                                           const std::vector<std::string>& text) {
    std::unordered_map<std::string, uint32_t> id_of;
    id_of.reserve(bytes.size());
    for (uint32_t id = 0; id < bytes.size(); ++id)
        if (ordinary[id]) id_of.emplace(bytes[id], id);
    std::vector<std::string> merges;
    std::vector<std::pair<uint32_t, uint32_t>> splits;
    for (uint32_t id = 0; id < bytes.size(); ++id) {
        if (!ordinary[id] || bytes[id].size() < 2) continue;
        splits.clear();
        const std::string& b = bytes[id];
        for (size_t i = 1; i < b.size(); ++i) {
            const auto l = id_of.find(b.substr(0, i)), r = id_of.find(b.substr(i));
            if (l != id_of.end() && r != id_of.end()) splits.emplace_back(l->second, r->second);
        }
        std::sort(splits.begin(), splits.end());
        for (const auto& [l, r] : splits) merges.push_back(text[l] + " " + text[r]);
    }
    return merges;
}

namespace {

GgufVocab byte_level_vocab(const Tokenizer& tok) {
    GgufVocab v;
    v.model = "gpt2";
    LlamaPre pre;
    llama_pre_of(byte_level_pattern(tok), pre);  // checked by gguf_vocab_unsupported
    v.pre = pre.name;
    if (!pre.differs.empty()) v.warnings.push_back(pre.differs);
    const int V = tok.vocab_size();
    v.tokens.resize(V);
    v.types.assign(V, 1);
    std::vector<std::string> bytes(V);
    std::vector<bool> ordinary(V, false);
    HfFacts hf;
    if (tok.kind() == "hf") hf = hf_facts(tok);
    for (const SpecialToken& s : tok.specials()) {
        v.tokens[s.id] = s.text;
        v.types[s.id] = 3;
    }
    for (int id = 0; id < V; ++id) {
        if (v.types[id] == 3) continue;
        if (const auto it = hf.added.find(uint32_t(id)); it != hf.added.end()) {
            // An added token that is not special: llama.cpp matches a user-defined token in any
            // text before pre-tokenizing, as the tokenizers library does.
            v.tokens[id] = tok.token_bytes(uint32_t(id));
            v.types[id] = it->second ? 3 : 4;
            continue;
        }
        if (!bytes_of(tok, uint32_t(id), bytes[id])) {
            v.tokens[id] = unused_text(id);
            v.types[id] = 5;
            continue;
        }
        ordinary[id] = true;
        v.tokens[id] = byte_level_text(bytes[id]);
    }
    if (tok.kind() == "hf") {
        v.merges = hf.merges;
        if (hf.nfc)
            v.warnings.push_back("the tokenizer.json normalizes to NFC and llama.cpp does not normalize, so text "
                                 "that is not in NFC (decomposed accents) is tokenized otherwise");
        if (hf.prefix_space)
            v.warnings.push_back("the tokenizer.json's ByteLevel adds a prefix space and llama.cpp's gpt2 model "
                                 "does not, so the first word of a text is tokenized otherwise");
        if (hf.ignore_merges && !pre.ignore_merges)
            v.warnings.push_back("the tokenizer.json takes a piece that is a token whole (ignore_merges) and "
                                 "llama.cpp's " + pre.name + " pre-tokenizer merges it from its bytes");
    } else if (tok.kind() == "tiktoken") {
        v.merges = merges_from_ranks(bytes, ordinary, v.tokens);
    } else {
        for (const auto& [a, b] : tok.state().merges) v.merges.push_back(v.tokens[a] + " " + v.tokens[b]);
    }
    set_ends(v);
    return v;
}

GgufVocab spm_vocab(const Tokenizer& tok) {
    const SentencePieceModelInfo info = sentencepiece_model_info(tok.state().file, tok.describe());
    GgufVocab v;
    // llama.cpp's `llama` tokenizer merges adjacent pieces by score, as SentencePiece's BPE does;
    // its `t5` is SentencePiece's unigram (the most probable segmentation, after the normalizer).
    const bool unigram = info.model_type == 1;
    v.model = unigram ? "t5" : "llama";
    for (const auto& p : info.pieces) {
        v.tokens.push_back(p.text);
        v.scores.push_back(p.score);
        v.types.push_back(p.type);
    }
    const int n = int(v.tokens.size());
    auto id = [n](int x) { return x >= 0 && x < n ? x : -1; };
    v.bos = id(info.bos_id);
    v.eos = id(info.eos_id);
    v.unk = id(info.unk_id);
    v.pad = id(info.pad_id);
    v.add_space_prefix = info.add_dummy_prefix ? 1 : 0;
    if (unigram) {
        v.remove_extra_whitespaces = info.remove_extra_whitespaces ? 1 : 0;
        v.precompiled_charsmap = info.precompiled_charsmap;
        v.warnings.push_back("where two segmentations of a text score the same (a long run of one repeated piece), "
                             "llama.cpp's unigram may choose the other one");
        if (info.byte_fallback)
            v.warnings.push_back("the SentencePiece unigram model has byte fallback, which llama.cpp's unigram does "
                                 "not have: a character that no piece holds becomes the unknown token");
        if (!info.escape_whitespaces)
            v.warnings.push_back("the SentencePiece model does not escape spaces and llama.cpp does");
    } else {
        if (info.normalizer != "identity" || info.remove_extra_whitespaces)
            v.warnings.push_back("the SentencePiece model normalizes text (normalizer '" + info.normalizer + "'" +
                                 (info.remove_extra_whitespaces ? ", runs of spaces removed" : "") +
                                 ") and llama.cpp's SentencePiece BPE only turns spaces into U+2581, so text that "
                                 "the normalizer changes is tokenized otherwise (as Llama 2's is made, the "
                                 "normalizer identity and remove_extra_whitespaces false, nothing differs)");
        if (info.model_type != 2)
            v.warnings.push_back("the SentencePiece model is neither BPE nor unigram: llama.cpp merges adjacent "
                                 "pieces by score, so words may be split otherwise");
        if (!info.byte_fallback)
            v.warnings.push_back("the SentencePiece BPE model has no byte fallback: llama.cpp fails on a character "
                                 "that no piece holds");
    }
    return v;
}

}  // namespace

std::string gguf_vocab_unsupported(const Tokenizer& tok) {
    const std::string& k = tok.kind();
    if (k == "spm") return "";
    if (k != "byte" && k != "bpe" && k != "tiktoken" && k != "hf")
        return "tokenizer " + tok.describe() + ": kind '" + k + "' is not written to GGUF";
    if (k == "bpe" && tok.state().pattern.empty())
        return "the tokenizer is a format-1 bpe (pre-split by hand, no pattern), which llama.cpp cannot "
               "reproduce; re-prepare the data with `quintet prepare --tokenizer bpe`";
    LlamaPre pre;
    const std::string regex = byte_level_pattern(tok);
    if (!llama_pre_of(regex, pre))
        return "tokenizer " + tok.describe() + ": its pre-tokenizer pattern " +
               (regex.empty() ? std::string("(not one regex)") : "'" + regex + "'") +
               " is none that llama.cpp has; the patterns written to GGUF: " + kKnownPatterns;
    return "";
}

GgufVocab gguf_vocab(const Tokenizer& tok) {
    if (std::string why = gguf_vocab_unsupported(tok); !why.empty()) throw ConfigError(why);
    GgufVocab v = tok.kind() == "spm" ? spm_vocab(tok) : byte_level_vocab(tok);
    check_unique(tok, v);
    return v;
}

}  // namespace quintet
