// tiktoken: a .tiktoken rank file (one "<base64 token> <rank>" per line; a token's id is its
// rank), a pre-tokenizer pattern, and special tokens. Encodes as OpenAI's tiktoken does: a piece
// that is itself a token is that token; otherwise the adjacent pair whose bytes form the
// lowest-ranked token merges first (bpe_merge.hpp). The standard files are cl100k_base,
// o200k_base, r50k_base/gpt2 and Llama 3's tokenizer.model (a .tiktoken file despite its name).
#pragma once
#include <string>
#include <vector>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

// The special tokens of a standard encoding by the name of its pattern preset (cl100k_base,
// o200k_base, gpt2/r50k_base, p50k_base, llama3), or of a list "TEXT=ID,TEXT=ID"; "none" = no
// special tokens. Throws ConfigError naming `what` for anything else.
std::vector<SpecialToken> tiktoken_specials(const std::string& name_or_list, const std::string& what);

// From the text of a .tiktoken file. `origin` names it in errors: a malformed line (with its
// number), a duplicate token or rank, a byte that has no token, a special token whose id is
// also a rank. pattern: a preset name or a regex.
Tokenizer tokenizer_tiktoken(const std::string& file_text, const std::string& pattern,
                             const std::vector<SpecialToken>& specials, const std::string& origin);

}  // namespace quintet
