// Making a tokenizer from what a user names (SPEC and its options) or from its stored form.
//   byte              one token per byte
//   bpe               quintet's own BPE: trained by `quintet prepare`, else read from a token file
//   tiktoken:FILE     a .tiktoken rank file; --tokenizer-pattern (a preset or a regex, default: the
//                     preset named by FILE's stem, e.g. cl100k_base.tiktoken) and
//                     --tokenizer-specials (default: the preset's special tokens)
//   hf:FILE           a tokenizer.json
//   spm:FILE          a SentencePiece .model
#pragma once
#include <string>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

struct TokenizerSpec {
    std::string spec;      // as above
    std::string pattern;   // --tokenizer-pattern; "" = the default
    std::string specials;  // --tokenizer-specials; "" = the default
};

// The valid SPECs, for usage texts and messages.
const char* tokenizer_spec_help();

// Loads the tokenizer `spec` names, checking everything before returning: ConfigError naming
// `what` (the option), the value and what would be valid. "bpe" cannot be loaded (it is trained
// by prepare or read from a token file) and is refused here with that advice.
Tokenizer tokenizer_load(const TokenizerSpec& spec, const std::string& what = "--tokenizer");

// Rebuilds a stored tokenizer; `origin` names where it was stored ("token file 'x.h5'").
Tokenizer tokenizer_from_state(const TokenizerState& state, const std::string& origin);

}  // namespace quintet
