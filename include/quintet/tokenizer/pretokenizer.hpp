// The pre-tokenizer: a tokenizer's regular expression cuts text into pieces, and BPE merges
// never cross a piece. Compiled by PCRE2 (UTF mode, Unicode properties, JIT) with the
// semantics of the regex engines the reference tokenizers use (Rust's regex for tiktoken,
// Oniguruma for Hugging Face): `$` is the end of the text only, and `\s` is Unicode White_Space
// (PCRE2's `\s` lacks U+0085, so it is widened). Invalid UTF-8 never matches: such bytes, and
// any other text the pattern leaves unmatched, become pieces of their own, so no byte is lost.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace quintet {

// The patterns of the standard tokenizers, by name: gpt2 (= r50k_base, p50k_base), cl100k_base,
// o200k_base, llama3. nullptr for another name.
const char* pretokenizer_preset(std::string_view name);
// The preset names, comma-separated, for messages.
const char* pretokenizer_preset_names();
// The preset whose pattern is exactly `regex`, or "".
std::string pretokenizer_preset_of(std::string_view regex);

class Pretokenizer {
public:
    // `pattern`: a preset name or a regular expression. `what` names where it came from for the
    // ConfigError a pattern that does not compile raises (with PCRE2's message and offset).
    Pretokenizer(const std::string& pattern, const std::string& what);
    ~Pretokenizer();
    Pretokenizer(const Pretokenizer&) = delete;
    Pretokenizer& operator=(const Pretokenizer&) = delete;

    const std::string& regex() const { return regex_; }  // as given (a preset's text for a name)
    const std::string& name() const { return name_; }    // the preset's name, or ""

    // Appends to `ends` the end offset of every piece of text[begin, end) in order, stopping
    // after max_pieces of them; returns where it stopped (== end when done). The pieces
    // partition the range: the matches, and the unmatched text between them. Matching sees all
    // of `text` (lookbehind before `begin`, lookahead and `$` past `end`), so a text can be
    // split in several calls, or in parts cut where no piece crosses (tokenizer_cut).
    // Throws std::logic_error if a match crosses `end` (a cut where a piece crosses).
    // `matched` (when given) gets, for each piece, whether it is a match (else unmatched text).
    size_t split(std::string_view text, size_t begin, size_t end, std::vector<size_t>& ends,
                 size_t max_pieces, std::vector<char>* matched = nullptr) const;

private:
    struct Code;
    std::string regex_, name_;
    std::unique_ptr<Code> code_;
};

}  // namespace quintet
