// A tokenizer's stored form (TokenizerState) as an HDF5 group, the same in token files and
// checkpoints (docs/formats.md, "The tokenizer group"):
//   <group>                    attributes: kind (string), pattern (string; bpe, tiktoken)
//   <group>/merges             uint32 [n_merges, 2]   bpe: merge i makes token 256 + i
//   <group>/file               uint8 [n]              tiktoken, hf, spm: the original file's bytes
//   <group>/special_tokens     uint8 [n]              "ID TEXT" lines (TEXT with \\ and \n escaped)
// The original file is kept byte for byte, so `h5py` can hand it back to other tools.
#pragma once
#include <hdf5.h>

#include <string>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

// Creates `group` under `loc` and writes `state` into it. In a parallel file every rank calls it
// (metadata is collective) and only the ranks with write_data = true write the datasets' bytes.
// Throws RankError on a failed write.
void tokenizer_store_write(hid_t loc, const std::string& group, const TokenizerState& state, bool write_data = true);

// Reads the group back; kind "" when `loc` has no such group. Throws ConfigError naming
// `origin` and the part that is malformed.
TokenizerState tokenizer_store_read(hid_t loc, const std::string& group, const std::string& origin);

// The special tokens as stored, and back (ConfigError naming `origin` on a malformed line).
std::string tokenizer_specials_text(const std::vector<SpecialToken>& specials);
std::vector<SpecialToken> tokenizer_specials_parse(const std::string& text, const std::string& origin);

}  // namespace quintet
