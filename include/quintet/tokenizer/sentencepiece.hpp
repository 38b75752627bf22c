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

// What a .model file holds beyond what the processor's API tells: every piece with its score
// and type, and the trainer's and normalizer's settings, read from the ModelProto's protobuf
// wire format (fields of sentencepiece_model.proto; absent fields take the proto's defaults).
// For writing the model into other formats (GGUF). ConfigError naming `origin` on bytes that
// are not such a message.
struct SentencePieceModelInfo {
    struct Piece {
        std::string text;
        float score = 0;
        int type = 1;  // 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
    };
    std::vector<Piece> pieces;
    int model_type = 1;             // 1 unigram, 2 bpe, 3 word, 4 char
    bool byte_fallback = false;
    std::string normalizer = "nmt_nfkc";  // normalizer_spec.name
    std::string precompiled_charsmap;     // the normalizer's rules, compiled (empty for identity)
    bool add_dummy_prefix = true;
    bool remove_extra_whitespaces = true;
    bool escape_whitespaces = true;
    int unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
};
SentencePieceModelInfo sentencepiece_model_info(const std::string& model_bytes, const std::string& origin);

}  // namespace quintet
