// SentencePiece models (Llama 2, Mistral, Gemma), through the SentencePiece library itself
// (Debian libsentencepiece-dev), so the ids are the library's: its normalizer, its unigram or
// BPE model, its byte fallback. The library replaces invalid UTF-8 by U+FFFD (or its byte
// pieces) and normalizes the text, so decode(encode(text)) may differ from the text.
// Special tokens: the model's control pieces (<s>, </s>) and user-defined pieces.
#pragma once
#include <string>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

// From the bytes of a .model file. Throws ConfigError naming `origin` when the bytes are not a
// SentencePiece model (with the library's message).
Tokenizer tokenizer_sentencepiece(const std::string& model_bytes, const std::string& origin);

}  // namespace quintet
