// The data a run trains and validates on (docs/data.md): data.path and data.val_path, each a
// comma list of sources; a source is a token file, a directory (its *.h5, sorted) or a glob,
// optionally preceded by a weight ("0.7 web/, 0.3 code/*.h5"). A source's shards, in order, form
// one token stream. Only headers are read here; tokens are read on demand by TokenReader, a
// sample at a time, so a rank never holds the corpus.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/data/data_config.hpp"
#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

struct TokenShard {
    std::string path;
    int64_t n_tokens = 0;
    int width = 2;             // bytes per token on disk
    int64_t file_offset = -1;  // of a contiguous /tokens (read with pread); -1 = through HDF5
    std::string checksum;      // of /tokens, from the corpus's manifest; "" = none known
};

// Reads every token of a shard: each id < vocab_size and, where the shard has one, the checksum of
// its manifest. "" when it holds, else what is wrong (naming the shard).
std::string shard_verify(const TokenShard& shard, int vocab_size);

struct Source {
    std::string spec;          // as written in the deck (without its weight)
    std::string name;          // short unique name: metrics groups /eval/<name>, logs
    double weight = -1;        // as written; -1 = none given
    std::vector<TokenShard> shards;
    std::vector<int64_t> start;  // [shards + 1]: first token of each shard in the stream
    int64_t n_tokens = 0;
    // The split of the stream this source stands for: tokens [begin, begin + len).
    int64_t begin = 0, len = 0;
};

// One token source list as written: (weight or -1, spec) per item. ConfigError naming `key` for
// an empty item, a bad or negative weight, weights on some items only, or weights all zero.
std::vector<std::pair<double, std::string>> parse_source_list(const std::string& key, const std::string& value);

// The files of one source spec: the file itself, a directory's shards (those its manifest lists,
// in order; without a manifest, under allow_incomplete, its *.h5 sorted), or a glob's matches
// (sorted; a corpus's tokenizer.h5 left out). ConfigError naming `key` and the spec when nothing is
// there, or when a directory has no complete manifest that agrees with its files and
// allow_incomplete is false.
std::vector<std::string> expand_source(const std::string& key, const std::string& spec, bool allow_incomplete = true);

struct DataSet {
    Tokenizer tokenizer;       // the same in every shard (checked)
    int vocab_size = 0, eos_id = -1, bos_id = -1;
    std::string first_file;    // the first shard of the first source (messages)
    std::vector<Source> train, val;
    bool any_hdf5_reads = false;  // some shard cannot be read with pread
    int64_t train_tokens() const;
};

// Reads every shard's header of data.path (and data.val_path) -- for a corpus with a manifest,
// the manifest alone and each shard's size -- and cuts the splits: without
// val_path each source's last floor(n * val_fraction) tokens are its validation split; with it
// the train sources are used whole and val_path's sources are the validation sets. ConfigError
// (exit status 2) for a missing shard, an empty source, a glob that matches nothing, bad weights,
// shards whose tokenizers differ (naming both files), a corrupt header.
DataSet data_open(const DataConfig& dc);

// The vocabulary and the tokens of every source of a data.path value (headers only), for the
// planner; and the bytes of the prefetch buffers a rank holds (two steps of its samples).
struct DataInfo {
    int vocab_size = 0;
    int64_t n_tokens = 0;
};
DataInfo data_info(const std::string& path_value);
double data_buffer_bytes(const DataConfig& dc, int64_t samples_per_rank, int vocab_size);

// Reads tokens of a source's split, circularly, with pread on the shards' file descriptors
// (opened lazily; thread-safe for pread shards). Every id is checked against the vocabulary: a
// bad id or a short read is an IoError naming the shard (exit status 4 during a run).
class TokenReader {
public:
    explicit TokenReader(const DataSet& data);
    ~TokenReader();
    TokenReader(const TokenReader&) = delete;
    TokenReader& operator=(const TokenReader&) = delete;
    // out[0 .. n) = split[(o + k) mod src.len] for k < n, as uint16 (width 2) or uint32 (width 4).
    void read(const Source& src, int64_t o, int64_t n, void* out, int width) const;
    // Bytes per token in memory: 2 when the vocabulary fits uint16, else 4.
    int width() const { return width_; }

private:
    void read_stream(const Source& src, int64_t at, int64_t n, unsigned char* out, int width) const;
    ssize_t pread_shard(const TokenShard& sh, void* buf, size_t bytes, int64_t off) const;
    const DataSet& data_;
    int width_;
    struct Fds;
    std::unique_ptr<Fds> fds_;
};

}  // namespace quintet
