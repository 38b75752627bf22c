// tokenizer.json reader (hf_json.hpp) with nlohmann-json. Two kinds of BPE model:
//  - byte-level (GPT-2, Llama 3, Qwen, DeepSeek-V3): the vocabulary and merges are mapped from
//    the byte-to-unicode alphabet back to bytes, so a piece starts as the tokens of its bytes;
//  - character-level with byte fallback (Llama 2, Mistral, Gemma: SentencePiece models converted
//    to tokenizer.json): a piece starts as the tokens of its characters, a character without one
//    as its bytes' <0xNN> tokens (or the unknown token).
// Both then merge through the shared merger (bpe_merge.hpp) exactly as bpe and tiktoken do.
// Every part that is not understood is refused with its JSON path rather than read approximately.
#include "quintet/tokenizer/hf_json.hpp"

#include <nlohmann/json.hpp>
#if QUINTET_WITH_NFC
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#endif

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "bpe_merge.hpp"
#include "quintet/core/error.hpp"
#include "quintet/tokenizer/byte_alphabet.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"

namespace quintet {
namespace {

using json = nlohmann::json;

// Unicode NFC or NFKC through ICU, on the UTF-8 directly. Text that is all ASCII is both as it is.
void icu_normalize(bool nfkc, std::string_view text, std::string& out) {
    out.clear();
    if (std::all_of(text.begin(), text.end(), [](char c) { return uint8_t(c) < 0x80; })) {
        out.assign(text);
        return;
    }
#if QUINTET_WITH_NFC
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* n = nfkc ? icu::Normalizer2::getNFKCInstance(err) : icu::Normalizer2::getNFCInstance(err);
    icu::StringByteSink<std::string> sink(&out, int32_t(text.size()));
    if (U_SUCCESS(err)) n->normalizeUTF8(0, icu::StringPiece(text.data(), int32_t(text.size())), sink, nullptr, err);
    if (U_FAILURE(err)) throw ConfigError(std::string("Unicode normalization failed: ") + u_errorName(err));
#else
    (void)nfkc;
    throw ConfigError("Unicode normalization: this build has no ICU (-DQUINTET_NFC=OFF)");  // refused at load
#endif
}

// One normalizer of the chain: NFC, NFKC, Prepend (a string before the text), Replace (every
// occurrence of a string).
struct Normalizer {
    enum Kind { nfc, nfkc, prepend, replace } kind;
    std::string a, b;
};

void normalize(const std::vector<Normalizer>& chain, std::string_view text, std::string& out) {
    std::string cur(text), next;
    for (const Normalizer& n : chain) {
        switch (n.kind) {
        case Normalizer::nfc:
        case Normalizer::nfkc:
            icu_normalize(n.kind == Normalizer::nfkc, cur, next);
            cur.swap(next);
            break;
        case Normalizer::prepend:
            if (!cur.empty()) cur.insert(0, n.a);
            break;
        case Normalizer::replace: {
            next.clear();
            for (size_t at = 0;;) {
                const size_t hit = cur.find(n.a, at);
                if (hit == std::string::npos) {
                    next.append(cur, at, std::string::npos);
                    break;
                }
                next.append(cur, at, hit - at);
                next += n.b;
                at = hit + n.a.size();
            }
            cur.swap(next);
            break;
        }
        }
    }
    out.swap(cur);
}

// How a Split stage hands on its pieces (the tokenizers library's SplitDelimiterBehavior).
enum class Behavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

struct Stage {
    std::unique_ptr<Pretokenizer> regex;   // Split / ByteLevel: null = the piece passes whole
    Behavior behavior = Behavior::isolated;
    bool invert = false;                   // Split: the matches are the text between them
    bool add_prefix_space = false;         // ByteLevel's: a piece not starting with ' ' gets one
    bool metaspace = false;                // Metaspace: ' ' -> replacement, maybe prepended and split
    std::string replacement;
    std::string prepend_scheme = "always";  // always | first | never
    bool metaspace_split = true;
};

// Well-formed UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF.
bool valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const auto c = uint8_t(s[i]);
        const size_t n = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
        const auto c1 = n > 1 ? uint8_t(s[i + 1]) : 0;
        if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90))
            return false;
        i += n;
    }
    return true;
}

bool is_byte_fallback_name(const std::string& s, int& byte) {
    if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return false;
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 3, "%2X", &v) != 1) return false;
    byte = int(v);
    return true;
}

class HfModel final : public TokenizerModel {
public:
    BpeMerger merger;
    std::vector<Normalizer> normalizers;  // each segment between added tokens
    std::vector<Stage> stages;
    std::vector<SpecialToken> always;     // added tokens that are not special: cut out first
    std::array<std::vector<const SpecialToken*>, 256> always_by_first;  // longest first
    std::unordered_map<uint32_t, std::string> added_text;
    // Character-level models (byte_fallback, or a vocabulary outside the byte alphabet).
    bool char_level = false;
    std::array<uint32_t, 256> byte_fallback{};  // <0xNN> tokens; kNone when absent or not enabled
    uint32_t unk = BpeMerger::kNone;
    bool fuse_unk = false;
    // Decoding of a character-level model: the replacement that stands for ' ', and the leading
    // spaces the decoder strips (Strip, or Metaspace's prepended one).
    std::string decode_space;
    size_t strip_start = 0;

    void finish_added() {
        for (const auto& a : always) always_by_first[uint8_t(a.text[0])].push_back(&a);
        for (auto& v : always_by_first)
            std::stable_sort(v.begin(), v.end(), [](auto* x, auto* y) { return x->text.size() > y->text.size(); });
    }

    void encode_ordinary(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const override {
        if (always.empty()) {
            encode_segment(text, begin, end, begin == 0, out);
            return;
        }
        // Added tokens first (leftmost, then longest); the text between them as one segment each.
        size_t seg = begin;
        bool first = begin == 0;
        for (size_t i = begin; i < end;) {
            const SpecialToken* hit = nullptr;
            for (const SpecialToken* a : always_by_first[uint8_t(text[i])])
                if (a->text.size() <= end - i && text.compare(i, a->text.size(), a->text) == 0) {
                    hit = a;
                    break;
                }
            if (!hit) {
                ++i;
                continue;
            }
            encode_segment(text.substr(seg, i - seg), 0, i - seg, first, out);
            first = false;
            out.push_back(hit->id);
            i += hit->text.size();
            seg = i;
        }
        encode_segment(text.substr(seg, end - seg), 0, end - seg, first, out);
    }
    bool token_bytes(uint32_t id, std::string& out) const override {
        const auto added = added_text.find(id);
        if (added != added_text.end() && !char_level) {
            out += added->second;
            return true;
        }
        if (added == added_text.end() && !merger.has(id)) return false;
        if (!char_level) {
            out += merger.bytes(id);
            return true;
        }
        for (int b = 0; b < 256; ++b)
            if (byte_fallback[size_t(b)] == id) {
                out += char(b);
                return true;
            }
        // The decoder's Replace applies to every token's text, added ones too (Gemma's "▁▁").
        const std::string_view t = added != added_text.end() ? std::string_view(added->second) : merger.bytes(id);
        if (decode_space.empty()) {
            out += t;
            return true;
        }
        for (size_t at = 0;;) {
            const size_t hit = t.find(decode_space, at);
            if (hit == std::string_view::npos) {
                out += t.substr(at);
                break;
            }
            out += t.substr(at, hit - at);
            out += ' ';
            at = hit + decode_space.size();
        }
        return true;
    }
    void decode(const uint32_t* ids, size_t n, std::string& out) const override {
        const size_t at = out.size();
        for (size_t i = 0; i < n; ++i) token_bytes(ids[i], out);
        size_t strip = 0;
        while (strip < strip_start && at + strip < out.size() && out[at + strip] == ' ') ++strip;
        out.erase(at, strip);
    }
    bool cuts_at_line_starts() const override {
        return !char_level && always.empty() && normalizers.empty() && !stages.empty() && stages[0].regex &&
               !stages[0].regex->name().empty() && !stages[0].add_prefix_space && !stages[0].metaspace &&
               stages[0].behavior == Behavior::isolated && !stages[0].invert;
    }

private:
    void encode_segment(std::string_view text, size_t begin, size_t end, bool first, std::vector<uint32_t>& out) const {
        if (normalizers.empty()) {
            encode_stage(0, text, begin, end, first, out);
            return;
        }
        std::string normalized;  // one per segment (the text between added tokens)
        normalize(normalizers, text.substr(begin, end - begin), normalized);
        encode_stage(0, normalized, 0, normalized.size(), first, out);
    }
    void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
        if (!char_level) {
            merger.encode_piece(piece, out);
            return;
        }
        // Characters (an invalid UTF-8 byte is one on its own), each its token, else its bytes'
        // fallback tokens, else the unknown token (consecutive ones fused when asked).
        thread_local std::vector<uint32_t> symbols;
        symbols.clear();
        bool last_unk = false;
        for (size_t i = 0; i < piece.size();) {
            const auto c = uint8_t(piece[i]);
            size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
            if (i + len > piece.size()) len = 1;
            for (size_t k = 1; k < len; ++k)
                if ((uint8_t(piece[i + k]) & 0xC0) != 0x80) len = 1;
            const uint32_t id = merger.find(piece.substr(i, len));
            if (id != BpeMerger::kNone) {
                symbols.push_back(id);
                last_unk = false;
            } else {
                bool all = true;
                for (size_t k = 0; k < len; ++k) all = all && byte_fallback[uint8_t(piece[i + k])] != BpeMerger::kNone;
                if (all) {
                    for (size_t k = 0; k < len; ++k) symbols.push_back(byte_fallback[uint8_t(piece[i + k])]);
                    last_unk = false;
                } else if (unk != BpeMerger::kNone) {
                    if (!(fuse_unk && last_unk)) symbols.push_back(unk);
                    last_unk = true;
                } else {
                    throw ConfigError("tokenizer.json: a character (bytes at " + std::to_string(i) +
                                      ") has no token, no byte-fallback token and there is no unk_token");
                }
            }
            i += len;
        }
        merger.merge_symbols(symbols, out);
    }
    // Stage k splits text[begin, end) (its regex sees all of `text`); the next stage gets each
    // piece on its own, as the tokenizers library hands each split on.
    void encode_stage(size_t k, std::string_view text, size_t begin, size_t end, bool first,
                      std::vector<uint32_t>& out) const {
        if (begin == end) return;
        if (k == stages.size()) {
            encode_piece(text.substr(begin, end - begin), out);
            return;
        }
        const Stage& st = stages[k];
        if (st.metaspace) {
            std::string m;
            if (st.prepend_scheme == "always" || (st.prepend_scheme == "first" && first)) {
                // The replacement is prepended unless the text, its spaces replaced, starts with it.
                if (text[begin] != ' ' && text.substr(begin, st.replacement.size()) != st.replacement) m = st.replacement;
            }
            for (size_t i = begin; i < end; ++i) {
                if (text[i] == ' ') m += st.replacement;
                else m += text[i];
            }
            if (!st.metaspace_split) {
                encode_stage(k + 1, m, 0, m.size(), first, out);
                return;
            }
            size_t s = 0;  // a piece begins at each replacement
            for (size_t at = m.find(st.replacement, 1); at != std::string::npos; at = m.find(st.replacement, at + 1)) {
                encode_stage(k + 1, std::string_view(m).substr(s, at - s), 0, at - s, first, out);
                s = at;
            }
            encode_stage(k + 1, std::string_view(m).substr(s), 0, m.size() - s, first, out);
            return;
        }
        if (st.add_prefix_space && text[begin] != ' ') {
            std::string spaced(1, ' ');
            spaced.append(text.substr(begin, end - begin));
            encode_stage_split(k, spaced, 0, spaced.size(), first, out);
            return;
        }
        encode_stage_split(k, text, begin, end, first, out);
    }
    void encode_stage_split(size_t k, std::string_view text, size_t begin, size_t end, bool first,
                            std::vector<uint32_t>& out) const {
        const Stage& st = stages[k];
        if (!st.regex) {
            encode_stage(k + 1, text.substr(begin, end - begin), 0, end - begin, first, out);
            return;
        }
        const bool plain = st.behavior == Behavior::isolated && !st.invert;
        if (k + 1 == stages.size() && plain && !char_level) {  // the common case: one regex, then the merges
            bpe_encode_text(*st.regex, merger, text, begin, end, out);
            return;
        }
        std::vector<size_t> ends;
        std::vector<char> matched;
        for (size_t pos = begin; pos < end;) {
            ends.clear();
            matched.clear();
            const size_t stop = st.regex->split(text, pos, end, ends, 4096, &matched);
            // The pieces as this behavior hands them on: [s, e) with whether each is a delimiter.
            struct Piece {
                size_t s, e;
                bool delim;
            };
            std::vector<Piece> pieces;
            size_t s = pos;
            for (size_t i = 0; i < ends.size(); ++i) {
                const bool delim = (matched[i] != 0) != st.invert;
                const size_t e = ends[i];
                switch (st.behavior) {
                case Behavior::isolated: pieces.push_back({s, e, delim}); break;
                case Behavior::removed:
                    // Text that is not UTF-8 matches no pattern; it is kept, never dropped, so that
                    // every byte decodes back (the library itself only ever sees valid text).
                    if (!delim || (!matched[i] && !valid_utf8(text.substr(s, e - s)))) pieces.push_back({s, e, delim});
                    break;
                case Behavior::merged_with_previous:
                    if (delim && !pieces.empty() && pieces.back().e == s) pieces.back().e = e;
                    else pieces.push_back({s, e, delim});
                    break;
                case Behavior::merged_with_next:
                    if (!pieces.empty() && pieces.back().delim && pieces.back().e == s) pieces.back().e = e, pieces.back().delim = delim;
                    else pieces.push_back({s, e, delim});
                    break;
                case Behavior::contiguous:
                    if (delim && !pieces.empty() && pieces.back().delim && pieces.back().e == s) pieces.back().e = e;
                    else pieces.push_back({s, e, delim});
                    break;
                }
                s = e;
            }
            for (const Piece& p : pieces) encode_stage(k + 1, text.substr(p.s, p.e - p.s), 0, p.e - p.s, first, out);
            pos = stop;
        }
    }
};

[[noreturn]] void refuse(const std::string& origin, const std::string& path, const std::string& why) {
    throw ConfigError(origin + ": " + path + ": " + why);
}

void read_normalizer(const json& n, const std::string& path, const std::string& origin, std::vector<Normalizer>& chain) {
    if (n.is_null()) return;
    if (!n.is_object() || !n.contains("type") || !n["type"].is_string())
        refuse(origin, path, "expected an object with a \"type\"");
    const std::string type = n["type"];
    if (type == "Sequence") {
        if (!n.contains("normalizers") || !n["normalizers"].is_array())
            refuse(origin, path + "/normalizers", "expected an array");
        for (size_t i = 0; i < n["normalizers"].size(); ++i)
            read_normalizer(n["normalizers"][i], path + "/normalizers/" + std::to_string(i), origin, chain);
        return;
    }
    if (type == "NFC" || type == "NFKC") {
        if (!QUINTET_WITH_NFC)
            refuse(origin, path, type + ": this quintet was built without ICU (-DQUINTET_NFC=OFF, as the GPU bundle "
                                        "builds it); rebuild with libicu-dev installed");
        chain.push_back({type == "NFC" ? Normalizer::nfc : Normalizer::nfkc, "", ""});
        return;
    }
    if (type == "Prepend") {
        if (!n.contains("prepend") || !n["prepend"].is_string()) refuse(origin, path + "/prepend", "expected a string");
        chain.push_back({Normalizer::prepend, n["prepend"], ""});
        return;
    }
    if (type == "Replace") {
        const json& p = n.value("pattern", json());
        if (!p.is_object() || !p.contains("String") || !p["String"].is_string() || p["String"].get<std::string>().empty())
            refuse(origin, path + "/pattern", p.dump().substr(0, 80) + ": quintet reads Replace of a String only (not a Regex)");
        if (!n.contains("content") || !n["content"].is_string()) refuse(origin, path + "/content", "expected a string");
        chain.push_back({Normalizer::replace, p["String"], n["content"]});
        return;
    }
    refuse(origin, path + "/type", "'" + type + "' is not a normalizer quintet reads; valid: NFC, NFKC, Prepend, "
                                   "Replace (of a String), a Sequence of them, or none");
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
    if (type == "Metaspace") {
        Stage st;
        st.metaspace = true;
        st.replacement = p.value("replacement", std::string("\xE2\x96\x81"));
        if (st.replacement.empty()) refuse(origin, path + "/replacement", "must not be empty");
        st.prepend_scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
        if (st.prepend_scheme != "always" && st.prepend_scheme != "first" && st.prepend_scheme != "never")
            refuse(origin, path + "/prepend_scheme", "'" + st.prepend_scheme + "'; valid: always, first, never");
        st.metaspace_split = p.value("split", true);
        stages.push_back(std::move(st));
        return;
    }
    if (type == "Split") {
        const std::string behavior = p.value("behavior", "");
        Stage st;
        if (behavior == "Isolated") st.behavior = Behavior::isolated;
        else if (behavior == "Removed") st.behavior = Behavior::removed;
        else if (behavior == "MergedWithPrevious") st.behavior = Behavior::merged_with_previous;
        else if (behavior == "MergedWithNext") st.behavior = Behavior::merged_with_next;
        else if (behavior == "Contiguous") st.behavior = Behavior::contiguous;
        else
            refuse(origin, path + "/behavior", "'" + behavior + "'; valid: Isolated, Removed, MergedWithPrevious, "
                                                "MergedWithNext, Contiguous");
        st.invert = p.value("invert", false);
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
        st.regex = std::make_unique<Pretokenizer>(regex, origin + " " + path + "/pattern");
        stages.push_back(std::move(st));
        return;
    }
    refuse(origin, path + "/type", "'" + type + "' is not a pre-tokenizer quintet reads; valid: ByteLevel, Split, "
                                   "Metaspace, a Sequence of them");
}

// A character-level model's decoder: the string that stands for ' ' and the leading spaces it
// strips. Anything else is refused.
void read_decoder(const json& d, const std::string& path, const std::string& origin, HfModel& m) {
    if (d.is_null()) return;
    if (!d.is_object() || !d.contains("type") || !d["type"].is_string())
        refuse(origin, path, "expected an object with a \"type\"");
    const std::string type = d["type"];
    if (type == "Sequence") {
        if (!d.contains("decoders") || !d["decoders"].is_array()) refuse(origin, path + "/decoders", "expected an array");
        for (size_t i = 0; i < d["decoders"].size(); ++i)
            read_decoder(d["decoders"][i], path + "/decoders/" + std::to_string(i), origin, m);
        return;
    }
    if (type == "ByteFallback" || type == "Fuse") return;  // what token_bytes / decode do anyway
    if (type == "Replace") {
        const json& p = d.value("pattern", json());
        if (!p.is_object() || !p.contains("String") || d.value("content", "") != " ")
            refuse(origin, path, d.dump().substr(0, 80) + ": quintet reads a Replace decoder of a String by \" \" only");
        m.decode_space = p["String"];
        return;
    }
    if (type == "Strip") {
        if (d.value("content", "") != " " || d.value("stop", 0) != 0)
            refuse(origin, path, d.dump().substr(0, 80) + ": quintet reads a Strip decoder of \" \" at the start only");
        m.strip_start = d.value("start", size_t(0));
        return;
    }
    if (type == "Metaspace") {
        m.decode_space = d.value("replacement", std::string("\xE2\x96\x81"));
        const std::string scheme = d.value("prepend_scheme", d.value("add_prefix_space", true) ? "always" : "never");
        m.strip_start = scheme == "never" ? 0 : 1;
        return;
    }
    refuse(origin, path + "/type", "'" + type + "' is not a decoder quintet reads for a character-level BPE; valid: "
                                   "Replace, ByteFallback, Fuse, Strip, Metaspace, a Sequence of them");
}

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
        refuse(origin, "/model/type", "'" + type + "': quintet reads BPE models only (byte-level, or with byte "
                                      "fallback); for a SentencePiece Unigram model (a tokenizer.model beside it) "
                                      "use spm:tokenizer.model");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty()))
            refuse(origin, std::string("/model/") + key, m[key].dump() + ": only null or \"\" is read");
    if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
        refuse(origin, "/model/dropout", m["dropout"].dump() + ": BPE dropout is for training; expected null");

    auto model = std::make_shared<HfModel>();
    read_normalizer(j.contains("normalizer") ? j["normalizer"] : json(), "/normalizer", origin, model->normalizers);
    read_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), "/pre_tokenizer", origin, model->stages);

    // Added tokens first: their contents may sit in the vocabulary outside the byte alphabet.
    std::vector<SpecialToken> specials;
    std::unordered_set<std::string> added_contents;
    uint32_t max_id = 0;
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
            if (a.value("special", false)) specials.push_back(t);
            else model->always.push_back(t);
            model->added_text[t.id] = t.text;
            added_contents.insert(t.text);
            max_id = std::max(max_id, t.id);
        }
    }

    // Vocabulary: byte-level when every token (but added ones) is in the byte alphabet and there is
    // no byte fallback; else character-level.
    if (!m.contains("vocab") || !m["vocab"].is_object()) refuse(origin, "/model/vocab", "expected an object token -> id");
    const bool byte_fallback = m.value("byte_fallback", false);
    std::string bytes;
    bool alphabet = !byte_fallback;
    std::string outside;
    for (const auto& [tok, idv] : m["vocab"].items())
        if (alphabet && !added_contents.count(tok) && !byte_level_bytes(tok, bytes)) alphabet = false, outside = tok;
    // A ByteLevel decoder says the file means to be byte-level: a stray character is refused.
    const json dec = j.contains("decoder") ? j["decoder"] : json();
    const bool byte_level_decoder = dec.is_object() && dec.value("type", "") == "ByteLevel";
    if (!alphabet && !byte_fallback && byte_level_decoder)
        refuse(origin, "/model/vocab/" + outside, "a character outside the byte-level alphabet, with a ByteLevel "
                                                  "decoder: not a byte-level BPE (a SentencePiece model's "
                                                  "tokenizer.model reads as spm:tokenizer.model)");
    model->char_level = !alphabet;
    std::unordered_map<std::string, uint32_t> id_of;  // vocabulary string -> id
    id_of.reserve(m["vocab"].size());
    model->byte_fallback.fill(BpeMerger::kNone);
    for (const auto& [tok, idv] : m["vocab"].items()) {
        if (!idv.is_number_unsigned() || idv.get<uint64_t>() >= kMaxTokenId)
            refuse(origin, "/model/vocab/" + tok, idv.dump() + ": expected a token id, 0 .. " + std::to_string(kMaxTokenId - 1));
        const uint32_t id = idv.get<uint32_t>();
        id_of.emplace(tok, id);
        max_id = std::max(max_id, id);
        if (model->char_level) {
            model->merger.add_token(id, tok);
            int b = 0;
            if (byte_fallback && is_byte_fallback_name(tok, b)) model->byte_fallback[size_t(b)] = id;
        } else if (byte_level_bytes(tok, bytes)) {
            model->merger.add_token(id, bytes);
        }  // else an added token's content, matched as such
    }
    if (model->char_level) {
        if (m.contains("unk_token") && m["unk_token"].is_string()) {
            const auto it = id_of.find(m["unk_token"].get<std::string>());
            if (it == id_of.end()) refuse(origin, "/model/unk_token", m["unk_token"].dump() + " is not in /model/vocab");
            model->unk = it->second;
        }
        model->fuse_unk = m.value("fuse_unk", false);
        // Bytes without a <0xNN> token (Gemini's tab is a token of its own) leave their character to the unk_token.
        read_decoder(j.contains("decoder") ? j["decoder"] : json(), "/decoder", origin, *model);
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
    if (!model->char_level)
        if (const int b = model->merger.missing_byte(); b >= 0)
            refuse(origin, "/model/vocab", "byte " + std::to_string(b) + " has no token: not a byte-level BPE (each of "
                                           "the 256 bytes needs one)");
    model->finish_added();

    TokenizerState state;
    state.kind = "hf";
    state.file = json_text;
    std::string split, norm;
    for (const auto& st : model->stages) {
        if (st.metaspace) split += std::string(split.empty() ? "" : " + ") + "Metaspace";
        else if (st.regex) split += (split.empty() ? "" : " + ") + (st.regex->name().empty() ? "custom" : st.regex->name());
    }
    for (const auto& n : model->normalizers)
        norm += std::string(norm.empty() ? "" : "+") +
                (n.kind == Normalizer::nfc ? "NFC" : n.kind == Normalizer::nfkc ? "NFKC" :
                 n.kind == Normalizer::prepend ? "Prepend" : "Replace");
    const std::string description =
        std::string("hf (") + (model->char_level ? (byte_fallback ? "BPE with byte fallback, " : "character-level BPE, ")
                                                 : "byte-level BPE, ") +
        std::to_string(model->merger.n_tokens()) + " tokens, " + std::to_string(merges.size()) + " merges, " +
        (split.empty() ? "no" : split) + " pre-tokenizer" + (m.value("ignore_merges", false) ? ", ignore_merges" : "") +
        (norm.empty() ? "" : ", " + norm) + ", " + std::to_string(specials.size() + model->always.size()) +
        " added tokens, vocab " + std::to_string(max_id + 1) + ")";
    return Tokenizer(model, state, int(max_id + 1), specials, description);
}

}  // namespace

Tokenizer tokenizer_hf_json(const std::string& json_text, const std::string& origin) {
    try {
        return read_tokenizer_json(json_text, origin);
    } catch (const json::exception& e) {  // a value of the wrong JSON type somewhere
        throw ConfigError(origin + ": not a tokenizer.json quintet can read: " + e.what());
    }
}

}  // namespace quintet
