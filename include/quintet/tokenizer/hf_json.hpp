// Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, Qwen 2 style): the NFC
// normalizer (through ICU), the pre-tokenizer (ByteLevel, Split with a regex, a Sequence of
// them), the vocabulary and merges in the byte-to-unicode alphabet, "ignore_merges", and the
// added tokens. Encodes as the tokenizers library does: added tokens that are not special are
// cut out of the text first; each segment is normalized, pre-tokenized, and each piece merges
// the pair that comes first in the merges list (the leftmost on a tie).
// Not read: other normalizers (a file with one is refused), post-processors (quintet adds
// special tokens only when asked), other models (WordPiece, Unigram: spm: for SentencePiece).
#pragma once
#include <string>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

// From the text of a tokenizer.json. `origin` names it in errors: a JSON syntax error (with its
// byte offset), or a part quintet cannot read (with its JSON path, e.g. /model/merges/12).
Tokenizer tokenizer_hf_json(const std::string& json_text, const std::string& origin);

}  // namespace quintet
