// The token file (docs/formats.md, "Token data"): one HDF5 file holding the token stream and the
// tokenizer that made it, so data and vocabulary cannot be separated. Training streams it
// (data/dataset.hpp): token_file_header reads the header and where /tokens lies in the file;
// token_file_read reads a whole file (tools and tests on small files).
//   /tokens                1-D uint16 (vocab_size <= 65536) or uint32, contiguous
//   /tokenizer             the tokenizer's group (io/tokenizer_store.hpp)
//   attributes on /        format_version (int64 = 2), vocab_size (int64), tokenizer (its kind),
//   (or on /tokens)        eos_id, bos_id (optional: the tokens that end / begin each document)
// Format 3 is a corpus shard (docs/data.md, "The manifest"): no /tokenizer group but attributes
// tokenizer_file and tokenizer_fingerprint naming the corpus's one tokenizer file beside it.
// Format 1 (before the tokenizer group): tokenizer "byte" or "bpe", /tokenizer/merges; its bpe
// is read with the format-1 split it was made with, so old data keeps its meaning.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

inline constexpr int64_t kTokenFileFormatVersion = 2;  // a token file that carries its tokenizer
inline constexpr int64_t kShardFormatVersion = 3;      // a corpus shard: its tokenizer by reference

struct TokenFile {
    std::vector<uint32_t> tokens;  // [n_tokens], every id < vocab_size
    Tokenizer tokenizer;
    int vocab_size = 0;            // == tokenizer.vocab_size()
    int eos_id = -1;               // the end-of-document token, or -1 (attribute eos_id)
    int bos_id = -1;               // the begin-of-document token, or -1 (attribute bos_id)
    int64_t format_version = 0;    // of the file as read
};

// A token file written piece by piece (bounded memory): create with the final token count, write
// ranges in order, then commit, which flushes, closes and renames `path`.tmp to `path`. Destroyed
// without commit, the partial file is removed. An IoError naming the path on a failed write (a
// full disk). With `tokenizer_file` empty the file carries its tokenizer (format 2); otherwise it
// is a corpus shard (format 3) naming the tokenizer file beside it (attributes tokenizer_file and
// tokenizer_fingerprint). Files are written without HDF5 object times: the same tokens give the
// same bytes.
class TokenFileWriter {
public:
    TokenFileWriter(const std::string& path, int64_t n_tokens, const Tokenizer& tok, int eos_id = -1, int bos_id = -1,
                    const std::string& tokenizer_file = "");
    ~TokenFileWriter();
    TokenFileWriter(const TokenFileWriter&) = delete;
    TokenFileWriter& operator=(const TokenFileWriter&) = delete;
    void write(int64_t at, const uint32_t* ids, int64_t n);
    void commit();
    // After commit: the file's size, the byte offset of /tokens, the checksum of /tokens as stored.
    int64_t bytes() const;
    int64_t offset() const;
    uint64_t checksum() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// A whole token file at once, through TokenFileWriter (format 2: the tokenizer inside).
void token_file_write(const std::string& path, const std::vector<uint32_t>& tokens,
                      const Tokenizer& tok, int eos_id = -1, int bos_id = -1);

// A corpus's tokenizer, stored once (DIR/tokenizer.h5): the /tokenizer group and attributes
// vocab_size, tokenizer (its kind) and tokenizer_fingerprint. Written atomically (IoError on
// failure). Read back (once per process and path) checking that its fingerprint is `fingerprint`
// (hex; "" = any): ConfigError naming the file otherwise.
void corpus_tokenizer_write(const std::string& path, const Tokenizer& tok);
Tokenizer corpus_tokenizer_read(const std::string& path, const std::string& fingerprint);

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

// The header and the place of /tokens, for streaming reads (data/dataset.hpp). Every header
// check of token_file_read, none of the tokens.
struct TokenFileHeader {
    Tokenizer tokenizer;
    int vocab_size = 0, eos_id = -1, bos_id = -1;
    int64_t format_version = 0;
    int64_t n_tokens = 0;
    int width = 2;              // bytes per token on disk: 2 (uint16) or 4 (uint32)
    int64_t file_offset = -1;   // byte offset of a contiguous little-endian /tokens; -1 = read through HDF5
};
TokenFileHeader token_file_header(const std::string& path);

// Tokens [begin, begin + n) of /tokens through HDF5 (a hyperslab), for files whose /tokens is
// not one contiguous run (chunked or compressed, e.g. written by h5py). Not thread-safe: HDF5
// calls belong to the main thread.
void token_file_read_range(const std::string& path, int64_t begin, int64_t n, uint32_t* out);

}  // namespace quintet
