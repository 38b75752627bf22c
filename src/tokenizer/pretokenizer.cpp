// PCRE2 pre-tokenizer (pretokenizer.hpp). The compiled pattern is shared by all threads; each
// thread keeps its own match data and JIT stack (thread_local), so splitting allocates nothing
// per piece.
#include "quintet/tokenizer/pretokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>
#include <utility>

#include "quintet/core/error.hpp"

namespace quintet {
namespace {

struct Preset {
    const char* name;
    const char* regex;
};

// The patterns as the reference implementations ship them (tiktoken's registry, the Llama 3
// tokenizer.json). llama3's is cl100k_base's.
constexpr Preset kPresets[] = {
    {"gpt2", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
    {"cl100k_base",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
    {"o200k_base",
     R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
};
// Other names for the same patterns.
constexpr Preset kAliases[] = {{"r50k_base", "gpt2"}, {"p50k_base", "gpt2"}, {"llama3", "cl100k_base"}};

// `\s` as Unicode White_Space, as Rust's regex and Oniguruma have it: PCRE2 (UCP) leaves out
// U+0085 (NEL). `\S` inside a class is left as PCRE2 has it (no class subtraction in PCRE2).
std::string widen_space(const std::string& re) {
    std::string out;
    out.reserve(re.size() + 16);
    bool in_class = false;
    for (size_t i = 0; i < re.size(); ++i) {
        const char c = re[i];
        if (c == '\\' && i + 1 < re.size()) {
            const char d = re[++i];
            if (d == 's') {
                out += in_class ? R"(\s\x{85})" : R"([\s\x{85}])";
            } else if (d == 'S' && !in_class) {
                out += R"([^\s\x{85}])";
            } else if (d == 'Q') {  // \Q...\E: literal text, copied as is
                const size_t e = re.find("\\E", i + 1);
                const size_t stop = e == std::string::npos ? re.size() : e + 2;
                out += re.substr(i - 1, stop - (i - 1));
                i = stop - 1;
            } else {
                out += c;
                out += d;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out += c;
            if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
            if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];  // a leading ']' is literal
            continue;
        }
        if (in_class && c == '[' && i + 1 < re.size() && re[i + 1] == ':') {  // [:alpha:]
            const size_t e = re.find(":]", i + 2);
            if (e != std::string::npos) {
                out += re.substr(i, e + 2 - i);
                i = e + 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        out += c;
    }
    return out;
}

// One thread's match state; the JIT stack grows to 8 MiB for patterns that backtrack deeply
// over long runs (\s+(?!\S) over a megabyte of spaces).
struct ThreadMatch {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    ThreadMatch() { pcre2_jit_stack_assign(context, nullptr, stack); }
    ~ThreadMatch() {
        pcre2_match_context_free(context);
        pcre2_jit_stack_free(stack);
        pcre2_match_data_free(data);
    }
};

ThreadMatch& thread_match() {
    thread_local ThreadMatch m;
    return m;
}

std::string pcre2_message(int code) {
    PCRE2_UCHAR buf[256];
    if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "error " + std::to_string(code);
    return reinterpret_cast<const char*>(buf);
}

}  // namespace

const char* pretokenizer_preset(std::string_view name) {
    for (const auto& a : kAliases)
        if (name == a.name) name = a.regex;
    for (const auto& p : kPresets)
        if (name == p.name) return p.regex;
    return nullptr;
}

const char* pretokenizer_preset_names() { return "cl100k_base, o200k_base, gpt2 (= r50k_base, p50k_base), llama3"; }

std::string pretokenizer_preset_of(std::string_view regex) {
    for (const auto& p : kPresets)
        if (regex == p.regex) return p.name;
    return "";
}

struct Pretokenizer::Code {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Code() { pcre2_code_free(code); }
};

Pretokenizer::Pretokenizer(const std::string& pattern, const std::string& what) : code_(std::make_unique<Code>()) {
    if (const char* preset = pretokenizer_preset(pattern)) {
        regex_ = preset;
        name_ = pretokenizer_preset_of(regex_);
    } else {
        regex_ = pattern;
        name_ = pretokenizer_preset_of(regex_);
    }
    if (regex_.empty())
        throw ConfigError(what + " = '': an empty pattern; valid: " + pretokenizer_preset_names() +
                          ", or a regular expression");
    const std::string compiled = widen_space(regex_);
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_MATCH_INVALID_UTF |
                                    PCRE2_NEVER_BACKSLASH_C,
                                &err, &offset, nullptr);
    if (!code_->code) {
        // PCRE2's offset is into the pattern as compiled; map it back to the one given.
        size_t at = regex_.size();
        for (size_t k = 0; k <= regex_.size(); ++k)
            if (widen_space(regex_.substr(0, k)).size() >= offset) {
                at = k;
                break;
            }
        throw ConfigError(what + " = '" + regex_ + "': the regular expression does not compile: " +
                          pcre2_message(err) + " at offset " + std::to_string(at) + " (PCRE2; valid presets: " +
                          pretokenizer_preset_names() + ")");
    }
    code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() = default;

size_t Pretokenizer::split(std::string_view text, size_t begin, size_t end, std::vector<size_t>& ends,
                           size_t max_pieces, std::vector<char>* matched) const {
    ThreadMatch& m = thread_match();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    size_t piece_start = begin, pos = begin, count = 0;
    uint32_t options = 0;
    while (piece_start < end && count < max_pieces) {
        const int rc = code_->jit
                           ? pcre2_jit_match(code_->code, subject, text.size(), pos, options, m.data, m.context)
                           : pcre2_match(code_->code, subject, text.size(), pos, options, m.data, m.context);
        if (rc == PCRE2_ERROR_NOMATCH) {  // the rest of the range is unmatched text: one piece
            ends.push_back(end);
            if (matched) matched->push_back(0);
            return end;
        }
        if (rc < 0)
            throw ConfigError("pre-tokenizer pattern '" + regex_ + "': matching failed at byte " +
                              std::to_string(pos) + ": " + pcre2_message(rc));
        const size_t s = ov[0], e = ov[1];
        if (s >= end) {  // unmatched text up to the end of the range
            ends.push_back(end);
            if (matched) matched->push_back(0);
            return end;
        }
        if (s == e) {  // an empty match is no piece: look on for one that is not empty here
            pos = s;
            options = PCRE2_NOTEMPTY_ATSTART;
            continue;
        }
        options = 0;
        if (s > piece_start) {  // unmatched text before the match (invalid UTF-8, say)
            ends.push_back(s);
            if (matched) matched->push_back(0);
            ++count;
        }
        if (e > end) throw std::logic_error("pre-tokenizer: a piece crosses the end of the range it was asked for");
        ends.push_back(e);
        if (matched) matched->push_back(1);
        ++count;
        piece_start = pos = e;
    }
    return piece_start;
}

}  // namespace quintet
