// tiktoken rank files (tiktoken.hpp): parsed strictly (every malformed line is named), encoded
// through the shared merger with tiktoken's rule (whole-piece lookup, rank-ordered merges).
#include "quintet/tokenizer/tiktoken.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <memory>
#include <set>
#include <unordered_map>

#include "bpe_merge.hpp"
#include "quintet/core/error.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"

namespace quintet {
namespace {

// Standard base64 (RFC 4648, '=' padding). False on anything else.
bool base64_decode(std::string_view in, std::string& out) {
    out.clear();
    if (in.empty() || in.size() % 4 != 0) return false;
    auto value = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+') return 62;
        if (c == '/') return 63;
        return -1;
    };
    for (size_t i = 0; i < in.size(); i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; ++k) {
            const char c = in[i + k];
            if (c == '=' && i + 4 == in.size() && k >= 2) {
                v[k] = 0;
                ++pad;
            } else if (pad > 0 || (v[k] = value(c)) < 0) {
                return false;
            }
        }
        const uint32_t w = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | uint32_t(v[3]);
        out += char(w >> 16);
        if (pad < 2) out += char((w >> 8) & 0xFF);
        if (pad < 1) out += char(w & 0xFF);
    }
    return true;
}

struct NamedSpecials {
    const char* name;
    std::vector<SpecialToken> (*make)();
};

std::vector<SpecialToken> llama3_specials() {
    // Llama 3: 256 special tokens after the 128000 ranks, most of them reserved.
    std::vector<SpecialToken> s = {{"<|begin_of_text|>", 128000}, {"<|end_of_text|>", 128001},
                                   {"<|start_header_id|>", 128006}, {"<|end_header_id|>", 128007},
                                   {"<|eot_id|>", 128009}};
    const uint32_t reserved_ids[] = {128002, 128003, 128004, 128005, 128008};
    int r = 0;
    for (uint32_t id : reserved_ids) s.push_back({"<|reserved_special_token_" + std::to_string(r++) + "|>", id});
    for (uint32_t id = 128010; id <= 128255; ++id) s.push_back({"<|reserved_special_token_" + std::to_string(r++) + "|>", id});
    std::sort(s.begin(), s.end(), [](const SpecialToken& a, const SpecialToken& b) { return a.id < b.id; });
    return s;
}

const NamedSpecials kNamedSpecials[] = {
    {"gpt2", [] { return std::vector<SpecialToken>{{"<|endoftext|>", 50256}}; }},
    {"r50k_base", [] { return std::vector<SpecialToken>{{"<|endoftext|>", 50256}}; }},
    {"p50k_base", [] { return std::vector<SpecialToken>{{"<|endoftext|>", 50256}}; }},
    {"cl100k_base",
     [] {
         return std::vector<SpecialToken>{{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258},
                                          {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
                                          {"<|endofprompt|>", 100276}};
     }},
    {"o200k_base", [] { return std::vector<SpecialToken>{{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}; }},
    {"llama3", llama3_specials},
    {"none", [] { return std::vector<SpecialToken>{}; }},
};

class TiktokenModel final : public TokenizerModel {
public:
    TiktokenModel(const std::string& pattern, const std::string& what) : pre_(pattern, what) {}
    BpeMerger merger;
    std::unordered_map<uint32_t, std::string> special_text;

    void encode_ordinary(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const override {
        bpe_encode_text(pre_, merger, text, begin, end, out);
    }
    bool token_bytes(uint32_t id, std::string& out) const override {
        if (merger.has(id)) {
            out += merger.bytes(id);
            return true;
        }
        const auto it = special_text.find(id);
        if (it == special_text.end()) return false;
        out += it->second;
        return true;
    }
    bool cuts_at_line_starts() const override { return !pre_.name().empty(); }
    const Pretokenizer& pre() const { return pre_; }

private:
    Pretokenizer pre_;
};

}  // namespace

std::vector<SpecialToken> tiktoken_specials(const std::string& name_or_list, const std::string& what) {
    for (const auto& n : kNamedSpecials)
        if (name_or_list == n.name) return n.make();
    // TEXT=ID,TEXT=ID (the text may not hold ',' or '=' here; a tokenizer.json can).
    std::vector<SpecialToken> out;
    size_t at = 0;
    while (at <= name_or_list.size()) {
        size_t comma = name_or_list.find(',', at);
        if (comma == std::string::npos) comma = name_or_list.size();
        const std::string item = name_or_list.substr(at, comma - at);
        const size_t eq = item.rfind('=');
        uint32_t id = 0;
        const char* end = item.data() + item.size();
        const bool ok = eq != std::string::npos && eq > 0 && eq + 1 < item.size() &&
                        std::from_chars(item.data() + eq + 1, end, id).ptr == end;
        if (!ok)
            throw ConfigError(what + " = '" + name_or_list + "': '" + item +
                              "' is not TEXT=ID; valid: cl100k_base, o200k_base, gpt2, r50k_base, p50k_base, "
                              "llama3, none, or a list TEXT=ID,TEXT=ID");
        out.push_back({item.substr(0, eq), id});
        at = comma + 1;
    }
    return out;
}

Tokenizer tokenizer_tiktoken(const std::string& file_text, const std::string& pattern,
                             const std::vector<SpecialToken>& specials, const std::string& origin) {
    auto model = std::make_shared<TiktokenModel>(pattern, origin + " pattern");
    std::string token;
    std::set<uint32_t> ranks;
    std::unordered_map<std::string, size_t> token_line;  // each token's bytes -> the line that gave them
    size_t line_no = 0, n_ranks = 0;
    uint32_t max_rank = 0;
    for (size_t at = 0; at < file_text.size();) {
        size_t nl = file_text.find('\n', at);
        if (nl == std::string::npos) nl = file_text.size();
        std::string_view line(file_text.data() + at, nl - at);
        at = nl + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty()) continue;
        const size_t sp = line.find(' ');
        auto bad = [&](const std::string& why) {
            // The line as printable text (a binary file's bytes as \xNN: a NUL would end the
            // message, a control byte garble the terminal), its first 60 bytes.
            std::string shown;
            for (unsigned char c : line.substr(0, 60)) {
                if (c >= 0x20 && c < 0x7f && c != '\\') {
                    shown += char(c);
                } else {
                    char b[8];
                    std::snprintf(b, sizeof b, "\\x%02x", c);
                    shown += b;
                }
            }
            throw ConfigError(origin + ": line " + std::to_string(line_no) + " ('" + shown +
                              (line.size() > 60 ? "...'" : "'") + "): " + why +
                              "; a .tiktoken file has one \"<base64 token> <rank>\" per line");
        };
        if (sp == std::string_view::npos) bad("no space between token and rank");
        uint32_t rank = 0;
        const char* rb = line.data() + sp + 1;
        const char* re = line.data() + line.size();
        if (rb == re || std::from_chars(rb, re, rank).ptr != re) bad("the rank is not a number");
        if (rank >= kMaxTokenId) bad("rank " + std::to_string(rank) + " is too large (at most " + std::to_string(kMaxTokenId - 1) + ")");
        if (!base64_decode(line.substr(0, sp), token)) bad("the token is not base64");
        if (!ranks.insert(rank).second) bad("rank " + std::to_string(rank) + " appears twice");
        if (const auto [it, fresh] = token_line.emplace(token, line_no); !fresh)
            bad("its token is the token of line " + std::to_string(it->second) +
                "; every token must appear once (two ranks for the same bytes)");
        model->merger.add_token(rank, token);
        max_rank = std::max(max_rank, rank);
        ++n_ranks;
    }
    if (n_ranks == 0) throw ConfigError(origin + ": holds no ranks; expected \"<base64 token> <rank>\" lines");
    model->merger.set_whole_piece_lookup(true);
    model->merger.finish(true);
    if (model->merger.n_tokens() != n_ranks)
        throw ConfigError(origin + ": two ranks stand for the same bytes; every token must appear once");
    if (const int b = model->merger.missing_byte(); b >= 0)
        throw ConfigError(origin + ": byte " + std::to_string(b) +
                          " has no token of its own; a byte-level rank file has one for each of the 256 bytes");
    uint32_t vocab = max_rank + 1;
    std::set<std::string> texts;
    for (const auto& s : specials) {
        if (s.text.empty()) throw ConfigError(origin + ": a special token with empty text (id " + std::to_string(s.id) + ")");
        if (s.id >= kMaxTokenId)
            throw ConfigError(origin + ": special token " + s.text + " = " + std::to_string(s.id) + " is too large (at most " +
                              std::to_string(kMaxTokenId - 1) + ")");
        if (ranks.count(s.id))
            throw ConfigError(origin + ": special token " + s.text + " = " + std::to_string(s.id) +
                              " is also a rank of the file; give special tokens whose ids the file leaves free "
                              "(--tokenizer-specials none, or TEXT=ID,...)");
        if (!texts.insert(s.text).second || model->special_text.count(s.id))
            throw ConfigError(origin + ": special token " + s.text + " = " + std::to_string(s.id) + " is given twice");
        model->special_text[s.id] = s.text;
        vocab = std::max(vocab, s.id + 1);
    }
    TokenizerState state;
    state.kind = "tiktoken";
    state.pattern = model->pre().regex();
    state.file = file_text;
    state.specials = specials;
    const std::string pname = model->pre().name().empty() ? "custom" : model->pre().name();
    const std::string description = "tiktoken (" + std::to_string(n_ranks) + " ranks, " + pname + " pattern, " +
                                    std::to_string(specials.size()) + " special tokens, vocab " +
                                    std::to_string(vocab) + ")";
    return Tokenizer(model, state, int(vocab), specials, description);
}

}  // namespace quintet
