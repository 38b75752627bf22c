// tokenizer.json reader (hf_json.hpp) with nlohmann-json. Vocabulary and merges are mapped from
// the byte-to-unicode alphabet back to bytes, so encoding runs on bytes through the shared merger
// (bpe_merge.hpp) exactly as bpe and tiktoken do; every part that is not understood is refused
// with its JSON path rather than read approximately.
#include "quintet/tokenizer/hf_json.hpp"

#include <nlohmann/json.hpp>
#if QUINTET_WITH_NFC
#include <unicode/normalizer2.h>
#include <unicode/bytestream.h>
#endif

#include <algorithm>
#include <array>
#include <memory>
#include <unordered_map>

#include "bpe_merge.hpp"
#include "quintet/core/error.hpp"
#include "quintet/tokenizer/byte_alphabet.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"

namespace quintet {
namespace {

using json = nlohmann::json;

// Unicode NFC (the "NFC" normalizer, Qwen 2's) through ICU, on the UTF-8 directly. Text that is
// all ASCII is NFC as it is.
void nfc(std::string_view text, std::string& out) {
    out.clear();
    if (std::all_of(text.begin(), text.end(), [](char c) { return uint8_t(c) < 0x80; })) {
        out.assign(text);
        return;
    }
#if QUINTET_WITH_NFC
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
    icu::StringByteSink<std::string> sink(&out, int32_t(text.size()));
    if (U_SUCCESS(err)) n->normalizeUTF8(0, icu::StringPiece(text.data(), int32_t(text.size())), sink, nullptr, err);
    if (U_FAILURE(err)) throw ConfigError(std::string("NFC normalization failed: ") + u_errorName(err));
#else
    throw ConfigError("NFC normalization: this build has no ICU (-DQUINTET_NFC=OFF)");  // refused at load
#endif
}

struct Stage {
    std::unique_ptr<Pretokenizer> regex;  // null: the piece passes whole
    bool add_prefix_space = false;        // ByteLevel's: a piece not starting with ' ' gets one
};

class HfModel final : public TokenizerModel {
public:
    BpeMerger merger;
    std::vector<Stage> stages;
    std::vector<SpecialToken> always;  // added tokens that are not special: cut out first
    std::unordered_map<uint32_t, std::string> added_text;
    bool normalize_nfc = false;        // normalizer "NFC": each segment between added tokens

    void encode_ordinary(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const override {
        if (always.empty()) {
            encode_segment(text, begin, end, out);
            return;
        }
        // Added tokens first (leftmost, then longest); the text between them as one segment each.
        size_t seg = begin;
        for (size_t i = begin; i < end;) {
            const SpecialToken* hit = nullptr;
            for (const auto& a : always)
                if (a.text.size() <= end - i && text.compare(i, a.text.size(), a.text) == 0 &&
                    (!hit || a.text.size() > hit->text.size()))
                    hit = &a;
            if (!hit) {
                ++i;
                continue;
            }
            encode_segment(text.substr(seg, i - seg), 0, i - seg, out);
            out.push_back(hit->id);
            i += hit->text.size();
            seg = i;
        }
        encode_segment(text.substr(seg, end - seg), 0, end - seg, out);
    }
    bool token_bytes(uint32_t id, std::string& out) const override {
        if (const auto it = added_text.find(id); it != added_text.end()) {
            out += it->second;
            return true;
        }
        if (!merger.has(id)) return false;
        out += merger.bytes(id);
        return true;
    }
    bool cuts_at_line_starts() const override {
        return always.empty() && !normalize_nfc && !stages.empty() && stages[0].regex && !stages[0].regex->name().empty() &&
               !stages[0].add_prefix_space;
    }

private:
    void encode_segment(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const {
        if (!normalize_nfc) {
            encode_stage(0, text, begin, end, out);
            return;
        }
        std::string normalized;  // one per segment (the text between added tokens)
        nfc(text.substr(begin, end - begin), normalized);
        encode_stage(0, normalized, 0, normalized.size(), out);
    }
    // Stage k splits text[begin, end) (its regex sees all of `text`); the next stage gets each
    // piece on its own, as the tokenizers library hands each split on.
    void encode_stage(size_t k, std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const {
        if (begin == end) return;
        if (k == stages.size()) {
            merger.encode_piece(text.substr(begin, end - begin), out);
            return;
        }
        const Stage& st = stages[k];
        if (st.add_prefix_space && text[begin] != ' ') {
            std::string spaced(1, ' ');
            spaced.append(text.substr(begin, end - begin));
            encode_stage_split(k, spaced, 0, spaced.size(), out);
            return;
        }
        encode_stage_split(k, text, begin, end, out);
    }
    void encode_stage_split(size_t k, std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const {
        const Stage& st = stages[k];
        if (!st.regex) {
            encode_stage(k + 1, text.substr(begin, end - begin), 0, end - begin, out);
            return;
        }
        if (k + 1 == stages.size()) {  // the common case: one regex, then the merges
            bpe_encode_text(*st.regex, merger, text, begin, end, out);
            return;
        }
        std::vector<size_t> ends;
        for (size_t pos = begin; pos < end;) {
            ends.clear();
            const size_t stop = st.regex->split(text, pos, end, ends, 4096);
            size_t s = pos;
            for (const size_t e : ends) {
                encode_stage(k + 1, text.substr(s, e - s), 0, e - s, out);
                s = e;
            }
            pos = stop;
        }
    }
};

[[noreturn]] void refuse(const std::string& origin, const std::string& path, const std::string& why) {
    throw ConfigError(origin + ": " + path + ": " + why);
}

// The pre-tokenizer at `path` as stages; recursion through Sequence.
void read_pre_tokenizer(const json& p, const std::string& path, const std::string& origin, std::vector<Stage>& stages) {
    if (p.is_null()) return;
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
        refuse(origin, path, "expected an object with a \"type\"");
    const std::string type = p["type"];
    if (type == "Sequence") {
        if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
            refuse(origin, path + "/pretokenizers", "expected an array");
        for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
            read_pre_tokenizer(p["pretokenizers"][i], path + "/pretokenizers/" + std::to_string(i), origin, stages);
        return;
    }
    if (type == "ByteLevel") {
        Stage st;
        st.add_prefix_space = p.value("add_prefix_space", false);
        if (p.value("use_regex", true)) st.regex = std::make_unique<Pretokenizer>("gpt2", origin + " " + path);
        if (st.regex || st.add_prefix_space) stages.push_back(std::move(st));
        return;
    }
    if (type == "Split") {
        const std::string behavior = p.value("behavior", "");
        if (behavior != "Isolated")
            refuse(origin, path + "/behavior", "'" + behavior + "': quintet reads Split with behavior Isolated only");
        if (p.value("invert", false)) refuse(origin, path + "/invert", "true: quintet reads Split with invert false only");
        if (!p.contains("pattern") || !p["pattern"].is_object())
            refuse(origin, path + "/pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
        const json& pat = p["pattern"];
        std::string regex;
        if (pat.contains("Regex") && pat["Regex"].is_string()) {
            regex = pat["Regex"];
        } else if (pat.contains("String") && pat["String"].is_string()) {
            regex = "\\Q" + pat["String"].get<std::string>() + "\\E";
        } else {
            refuse(origin, path + "/pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
        }
        Stage st;
        st.regex = std::make_unique<Pretokenizer>(regex, origin + " " + path + "/pattern");
        stages.push_back(std::move(st));
        return;
    }
    refuse(origin, path + "/type", "'" + type + "' is not a pre-tokenizer quintet reads; valid: ByteLevel, Split "
                                   "(Isolated), Sequence of them");
}

}  // namespace

namespace {
Tokenizer read_tokenizer_json(const std::string& json_text, const std::string& origin);
}  // namespace

Tokenizer tokenizer_hf_json(const std::string& json_text, const std::string& origin) {
    try {
        return read_tokenizer_json(json_text, origin);
    } catch (const json::exception& e) {  // a value of the wrong JSON type somewhere
        throw ConfigError(origin + ": not a tokenizer.json quintet can read: " + e.what());
    }
}

namespace {

Tokenizer read_tokenizer_json(const std::string& json_text, const std::string& origin) {
    json j;
    try {
        j = json::parse(json_text);
    } catch (const json::parse_error& e) {
        throw ConfigError(origin + ": not valid JSON (syntax error at byte " + std::to_string(e.byte) + "): " + e.what());
    }
    if (!j.is_object()) refuse(origin, "/", "expected a JSON object (a tokenizer.json)");
    if (!j.contains("model") || !j["model"].is_object()) refuse(origin, "/model", "missing; not a tokenizer.json");
    const json& m = j["model"];
    const std::string type = m.value("type", m.contains("merges") ? "BPE" : "");
    if (type != "BPE")
        refuse(origin, "/model/type", "'" + type + "': quintet reads byte-level BPE models only (SentencePiece "
                                      "models: spm:FILE.model)");
    bool normalize_nfc = false;
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
        if (j["normalizer"].is_object() && j["normalizer"].value("type", "") == "NFC") {
            normalize_nfc = true;
            if (!QUINTET_WITH_NFC)
                refuse(origin, "/normalizer", "NFC: this quintet was built without ICU (-DQUINTET_NFC=OFF, as "
                                              "the GPU bundle builds it); rebuild with libicu-dev installed");
        } else
            refuse(origin, "/normalizer", j["normalizer"].dump().substr(0, 80) +
                                              ": the normalizers quintet reads are none and NFC");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty()))
            refuse(origin, std::string("/model/") + key, m[key].dump() + ": only null is read (byte-level BPE)");
    if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
        refuse(origin, "/model/dropout", m["dropout"].dump() + ": BPE dropout is for training; expected null");

    auto model = std::make_shared<HfModel>();
    model->normalize_nfc = normalize_nfc;
    read_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), "/pre_tokenizer", origin, model->stages);

    // Vocabulary: alphabet string -> id, as bytes.
    if (!m.contains("vocab") || !m["vocab"].is_object()) refuse(origin, "/model/vocab", "expected an object token -> id");
    std::unordered_map<std::string, uint32_t> id_of;  // alphabet string -> id
    id_of.reserve(m["vocab"].size());
    uint32_t max_id = 0;
    std::string bytes;
    for (const auto& [tok, idv] : m["vocab"].items()) {
        if (!idv.is_number_unsigned() || idv.get<uint64_t>() >= kMaxTokenId)
            refuse(origin, "/model/vocab/" + tok, idv.dump() + ": expected a token id, 0 .. " + std::to_string(kMaxTokenId - 1));
        const uint32_t id = idv.get<uint32_t>();
        if (!byte_level_bytes(tok, bytes))
            refuse(origin, "/model/vocab/" + tok, "a character outside the byte-level alphabet: not a byte-level BPE "
                                                  "(for SentencePiece models use spm:FILE.model)");
        model->merger.add_token(id, bytes);
        id_of.emplace(tok, id);
        max_id = std::max(max_id, id);
    }
    // Merges: "a b" or ["a", "b"]; priority = position in the list.
    if (!m.contains("merges") || !m["merges"].is_array()) refuse(origin, "/model/merges", "expected an array");
    const json& merges = m["merges"];
    for (size_t i = 0; i < merges.size(); ++i) {
        const std::string path = "/model/merges/" + std::to_string(i);
        std::string a, b;
        if (merges[i].is_string()) {
            const std::string s = merges[i];
            const size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                refuse(origin, path, "'" + s + "': expected two tokens separated by one space");
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else if (merges[i].is_array() && merges[i].size() == 2 && merges[i][0].is_string() && merges[i][1].is_string()) {
            a = merges[i][0];
            b = merges[i][1];
        } else {
            refuse(origin, path, merges[i].dump() + ": expected \"a b\" or [\"a\", \"b\"]");
        }
        const auto ia = id_of.find(a), ib = id_of.find(b), im = id_of.find(a + b);
        if (ia == id_of.end()) refuse(origin, path, "'" + a + "' is not in /model/vocab");
        if (ib == id_of.end()) refuse(origin, path, "'" + b + "' is not in /model/vocab");
        if (im == id_of.end()) refuse(origin, path, "the merged token '" + a + b + "' is not in /model/vocab");
        model->merger.add_merge(ia->second, ib->second, im->second, uint32_t(i));
    }
    model->merger.set_whole_piece_lookup(m.value("ignore_merges", false));
    model->merger.finish(false);
    if (const int b = model->merger.missing_byte(); b >= 0)
        refuse(origin, "/model/vocab", "byte " + std::to_string(b) +
                                           " has no token: not a byte-level BPE (each of the 256 bytes needs one)");

    // Added tokens: special ones are matched only when asked (encode_with_specials), the others
    // always, as the tokenizers library does.
    std::vector<SpecialToken> specials;
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
        if (!j["added_tokens"].is_array()) refuse(origin, "/added_tokens", "expected an array");
        const json& added = j["added_tokens"];
        for (size_t i = 0; i < added.size(); ++i) {
            const std::string path = "/added_tokens/" + std::to_string(i);
            const json& a = added[i];
            if (!a.is_object() || !a.contains("id") || !a["id"].is_number_unsigned() ||
                a["id"].get<uint64_t>() >= kMaxTokenId || !a.contains("content") || !a["content"].is_string() ||
                a["content"].get<std::string>().empty())
                refuse(origin, path, "expected {\"id\": N, \"content\": \"...\", \"special\": true|false}");
            const SpecialToken t{a["content"], a["id"].get<uint32_t>()};
            if (a.value("special", false)) {
                specials.push_back(t);
            } else {
                model->always.push_back(t);
            }
            model->added_text[t.id] = t.text;
            max_id = std::max(max_id, t.id);
        }
    }
    TokenizerState state;
    state.kind = "hf";
    state.file = json_text;
    std::string split;
    for (const auto& st : model->stages)
        if (st.regex) split += (split.empty() ? "" : " + ") + (st.regex->name().empty() ? "custom" : st.regex->name());
    const std::string description =
        "hf (byte-level BPE, " + std::to_string(model->merger.n_tokens()) + " tokens, " + std::to_string(merges.size()) +
        " merges, " + (split.empty() ? "no" : split) + " pattern" +
        (m.value("ignore_merges", false) ? ", ignore_merges" : "") + (normalize_nfc ? ", NFC" : "") + ", " +
        std::to_string(specials.size() + model->always.size()) + " added tokens, vocab " + std::to_string(max_id + 1) + ")";
    return Tokenizer(model, state, int(max_id + 1), specials, description);
}

}  // namespace
}  // namespace quintet
