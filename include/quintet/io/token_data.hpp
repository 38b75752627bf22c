// The token file (docs/formats.md, "Token data"): one HDF5 file holding the token stream and the
// tokenizer that made it, so data and vocabulary cannot be separated. Serial HDF5 only: it is
// read whole (a few hundred MB at most for this project's corpora), not sliced per rank.
//   /tokens                1-D uint16 (vocab_size <= 65536) or uint32, contiguous
//   /tokenizer             the tokenizer's group (io/tokenizer_store.hpp)
//   attributes on /        format_version (int64 = 2), vocab_size (int64), tokenizer (its kind),
//   (or on /tokens)        eos_id, bos_id (optional: the tokens that end / begin each document)
// Format 1 (before the tokenizer group): tokenizer "byte" or "bpe", /tokenizer/merges; its bpe
// is read with the format-1 split it was made with, so old data keeps its meaning.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

inline constexpr int64_t kTokenFileFormatVersion = 2;

struct TokenFile {
    std::vector<uint32_t> tokens;  // [n_tokens], every id < vocab_size
    Tokenizer tokenizer;
    int vocab_size = 0;            // == tokenizer.vocab_size()
    int eos_id = -1;               // the end-of-document token, or -1 (attribute eos_id)
    int bos_id = -1;               // the begin-of-document token, or -1 (attribute bos_id)
    int64_t format_version = 0;    // of the file as read
};

// Writes `path` + ".tmp" and renames it over `path`, so a failed write never leaves a half file.
// Throws RankError (naming the path) if the file cannot be written. eos_id / bos_id >= 0 are
// recorded as attributes (the tokens that end / begin each document).
void token_file_write(const std::string& path, const std::vector<uint32_t>& tokens,
                      const Tokenizer& tok, int eos_id = -1, int bos_id = -1);

// Reads and fully validates a token file. Throws ConfigError naming the path and the problem:
// missing file, not HDF5 / corrupt, no or malformed /tokens, missing attributes, fewer than
// 2 tokens, a token id >= vocab_size (with its index), merges inconsistent with vocab_size.
TokenFile token_file_read(const std::string& path);

// The tokenizer only, without reading the tokens (for generate). Same checks on the header.
Tokenizer token_file_read_tokenizer(const std::string& path);
// The same with the end-of-document token (-1 when none).
Tokenizer token_file_read_tokenizer(const std::string& path, int& eos_id);

// The header only: how many tokens and the vocabulary size (for `quintet plan`).
struct TokenFileInfo {
    int64_t n_tokens = 0;
    int vocab_size = 0;
};
TokenFileInfo token_file_info(const std::string& path);

}  // namespace quintet
