// Hugging Face tokenizer.json with a BPE model: byte-level (GPT-2, Llama 3, Qwen, DeepSeek-V3) or
// character-level with byte fallback (Llama 2, Mistral, Gemma); the normalizers NFC, NFKC,
// Prepend, Replace; the pre-tokenizers ByteLevel, Split (every behaviour), Metaspace, Sequences of
// them; "ignore_merges"; the added tokens; a character-level model's decoder. Encodes as the
// tokenizers library does: added tokens that are not special are cut out of the text first; each
// segment is normalized, pre-tokenized, and each piece merges the pair that comes first in the
// merges list (the leftmost on a tie). Anything else is refused with its JSON path; post-processors
// are not read (quintet adds special tokens only when asked).
#pragma once
#include <string>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

// From the text of a tokenizer.json. `origin` names it in errors: a JSON syntax error (with its
// byte offset), or a part quintet cannot read (with its JSON path, e.g. /model/merges/12).
Tokenizer tokenizer_hf_json(const std::string& json_text, const std::string& origin);

}  // namespace quintet
