// The token file (docs/formats.md, "Token data"): one HDF5 file holding the token stream and the
// tokenizer that made it, so data and vocabulary cannot be separated. Serial HDF5 only: it is
// read whole (a few hundred MB at most for this project's corpora), not sliced per rank.
//   /tokens                1-D uint16 (vocab_size <= 65536) or uint32, contiguous
//   /tokenizer/merges      uint32 [n_merges, 2], BPE only; merge i makes token 256 + i
//   attributes on /        format_version (int64 = 1), vocab_size (int64),
//   (or on /tokens)        tokenizer ("byte"|"bpe"), eos_id (optional: ends each document)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/io/tokenizer.hpp"

namespace quintet {

inline constexpr int64_t kTokenFileFormatVersion = 1;

struct TokenFile {
    std::vector<uint32_t> tokens;  // [n_tokens], every id < vocab_size
    Tokenizer tokenizer;           // tables built
    int vocab_size = 0;            // == tokenizer.vocab_size()
    int eos_id = -1;               // the end-of-document token, or -1 (attribute eos_id)
};

// Writes `path` + ".tmp" and renames it over `path`, so a failed write never leaves a half file.
// Throws RankError (naming the path) if the file cannot be written.
// tok.eos_id >= 0 is recorded as the attribute eos_id (the token that ends each document).
void token_file_write(const std::string& path, const std::vector<uint32_t>& tokens,
                      const Tokenizer& tok);

// Reads and fully validates a token file. Throws ConfigError naming the path and the problem:
// missing file, not HDF5 / corrupt, no or malformed /tokens, missing attributes, fewer than
// 2 tokens, a token id >= vocab_size (with its index), merges inconsistent with vocab_size.
TokenFile token_file_read(const std::string& path);

// The tokenizer only, without reading the tokens (for generate). Same checks on the header.
Tokenizer token_file_read_tokenizer(const std::string& path);

// The header only: how many tokens and the vocabulary size (for `quintet plan`).
struct TokenFileInfo {
    int64_t n_tokens = 0;
    int vocab_size = 0;
};
TokenFileInfo token_file_info(const std::string& path);

}  // namespace quintet
