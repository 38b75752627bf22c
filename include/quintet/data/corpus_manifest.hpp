// A prepared corpus's manifest, DIR/manifest.json (docs/data.md, "The manifest"): written last,
// atomically, by `quintet prepare`, so a directory that has one is complete. It lists the shards
// in order with their token counts, sizes, the offset of their tokens and a checksum of those
// tokens; the tokenizer (stored once, DIR/tokenizer.h5, and named by its fingerprint in every
// shard); the inputs it was made from (path, size, modification time) and the command.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/core/checksum.hpp"

namespace quintet {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kCorpusTokenizerName = "tokenizer.h5";
inline constexpr int kManifestVersion = 1;

struct ManifestShard {
    std::string file;          // relative to the directory
    int64_t tokens = 0;
    int64_t bytes = 0;         // of the file
    int64_t offset = -1;       // of the contiguous /tokens in the file
    std::string checksum;      // Checksum::hex of /tokens as stored (little-endian, `width` bytes each)
};

struct ManifestInput {
    std::string path;
    int64_t bytes = 0, mtime_ns = 0;
};

struct CorpusManifest {
    std::vector<ManifestShard> shards;
    std::string tokenizer_file = kCorpusTokenizerName;
    std::string tokenizer_fingerprint;  // hex of Tokenizer::fingerprint()
    std::string tokenizer_describe;
    int vocab_size = 0, width = 2, eos_id = -1, bos_id = -1;
    int64_t tokens = 0, documents = 0;
    int64_t skipped_files = 0, bad_lines = 0;  // binary files skipped, malformed lines skipped
    std::vector<ManifestInput> inputs;
    std::string command;
};

// Writes DIR/manifest.json through a temporary file, fsync and rename (RankError on failure).
void manifest_write(const std::string& dir, const CorpusManifest& m);
// DIR/manifest.json; `found` false when the directory has none. ConfigError naming the file when
// it is malformed.
CorpusManifest manifest_read(const std::string& dir, bool& found);

// What makes the directory disagree with its manifest, checked cheaply (no token is read): a
// listed shard missing or of another size, a *.h5 file the manifest does not list, the tokenizer
// file missing. Empty when they agree.
std::string manifest_disagreement(const std::string& dir, const CorpusManifest& m);

}  // namespace quintet
