// A quintet tokenizer as GGUF's tokenizer.ggml.* metadata, in the form llama.cpp tokenizes with:
//   byte, bpe, tiktoken, hf  model `gpt2` (byte-level BPE): tokens in GPT-2's byte-to-unicode
//                            alphabet, merges "A B" in priority order, and `pre`, the name of
//                            llama.cpp's pre-tokenizer for the tokenizer's pattern;
//   spm                      a BPE model as `llama` (llama.cpp's SentencePiece BPE), a unigram one
//                            as `t5` (its unigram, with the model's compiled normalizer): the
//                            pieces with their scores and types.
// What llama.cpp then does differently from the reference, where anything (a normalizer it lacks,
// an approximated pattern, a segmentation it does not have) is listed in `warnings`.
// The mapping and the measured agreement: docs/interop.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

struct GgufVocab {
    std::string model;  // gpt2 | llama | t5
    std::string pre;    // gpt2: llama.cpp's pre-tokenizer name
    std::vector<std::string> tokens, merges;
    std::vector<float> scores;   // llama only
    std::vector<int32_t> types;  // 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
    int bos = -1, eos = -1, unk = -1, pad = -1;
    int add_space_prefix = -1;   // llama, t5: 0 | 1
    int remove_extra_whitespaces = -1;  // t5: 0 | 1
    std::string precompiled_charsmap;   // t5: the normalizer (SentencePiece's compiled form)
    std::vector<std::string> warnings;  // where llama.cpp may tokenize a text otherwise
};

// tiktoken ranks as a merge list ("A B", A and B in GPT-2's byte alphabet, `text`): every split of
// each ordinary token (`bytes`) into two tokens, by the token's rank, then the parts' ranks. Merging
// by list position is then tiktoken's "lowest-ranked pair first". Also the HF export's.
std::vector<std::string> merges_from_ranks(const std::vector<std::string>& bytes, const std::vector<bool>& ordinary,
                                           const std::vector<std::string>& text);

// "" when `tok` can be written, else why not (for a ConfigError).
std::string gguf_vocab_unsupported(const Tokenizer& tok);
// ConfigError when gguf_vocab_unsupported, or when two tokens have the same text.
GgufVocab gguf_vocab(const Tokenizer& tok);

}  // namespace quintet
