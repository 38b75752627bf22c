// GPT-2's byte-to-unicode alphabet, the one place quintet keeps it: byte-level BPE vocabularies
// (tokenizer.json, GGUF's `gpt2` model, Hugging Face exports) write each byte as one printable
// character -- the printable Latin-1 bytes as themselves, the other 68 as U+0100 onwards.
#pragma once
#include <string>

namespace quintet {

// `bytes` in the alphabet (each byte one character, UTF-8 encoded).
std::string byte_level_text(const std::string& bytes);
// The bytes a string of the alphabet stands for; false when a character is outside it.
bool byte_level_bytes(const std::string& text, std::string& bytes);

}  // namespace quintet
