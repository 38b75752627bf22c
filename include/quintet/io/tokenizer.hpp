// Byte-level tokenizers: "byte" (token = byte, vocab 256) and byte-level BPE (GPT-2 style merges
// on top of the 256 bytes). Both round-trip any byte string exactly, including invalid UTF-8.
// The tokenizer travels inside the token file (io/token_data.hpp); this file knows nothing of HDF5.
// It is deliberately not a Hugging Face tokenizer: no normalisation, and one special token at
// most: the end-of-document token of packed data (`quintet prepare` with several inputs or
// --split-on), a reserved id after the BPE merges, or a chosen byte of the byte tokenizer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quintet {

struct TokenizerTables;  // decode bytes and merge ranks, built once from `merges`

// Pre-split (both training and encoding work inside these chunks; merges never cross them):
// bytes are classed as letter (A-Z, a-z and every byte >= 0x80, so UTF-8 stays together),
// digit, whitespace (space \t \n \r \v \f) or other. A chunk is
//   - a single space followed by a run of one non-whitespace class (" the", " 42", " ,;"), or
//   - a run of whitespace; when it precedes a non-space and ends in ' ', that last space is
//     left to start the next chunk ("\n\n  x" -> "\n\n ", " x"), or
//   - a run of one non-whitespace class ("Hello", "2024", "!?").
// Runs are cut every kTokenizerMaxChunk bytes so pathological inputs (one huge word) stay linear.
// This is GPT-2's split without contractions and Unicode classes.
inline constexpr size_t kTokenizerMaxChunk = 64;
inline constexpr const char* kEndOfText = "<|endoftext|>";

struct Tokenizer {
    std::string kind = "byte";                          // "byte" | "bpe"
    std::vector<std::pair<uint32_t, uint32_t>> merges;  // merge i makes token 256+i from (a, b)
    // Built on first use from kind + merges (or by build_tables()); shared by copies.
    // Call build_tables() after editing `merges` in place, and before using one Tokenizer
    // from several threads at once (the lazy build is not synchronised).
    mutable std::shared_ptr<const TokenizerTables> tables;
    // The end-of-document token, or -1. BPE: 256 + merges.size() (one id after the merges, so
    // vocab_size grows by one); byte: one of the 256 bytes (vocab_size stays 256).
    int eos_id = -1;

    int vocab_size() const;  // 256 + merges.size() (+ 1 for a BPE end-of-document token)
    void build_tables() const;

    std::vector<uint32_t> encode(std::string_view text) const;
    // progress(bytes_done, bytes_total) is called every few hundred KiB and at the end.
    std::vector<uint32_t> encode(std::string_view text,
                                 const std::function<void(size_t, size_t)>& progress) const;
    // Exact inverse of encode; a BPE end-of-document token decodes as kEndOfText.
    std::string decode(const uint32_t* ids, size_t n) const;
    std::string token_bytes(uint32_t id) const;
};

// Byte-level BPE trained on `text`: pre-split as above, count adjacent pairs over the distinct
// chunks (weighted by frequency), then repeatedly merge the most frequent pair, ties broken by
// the smallest (a, b). Pair counts are updated incrementally, touching only the chunks that
// contain the merged pair. Stops early (fewer merges) if the text runs out of pairs.
// progress(done_merges, total_merges) is called periodically and at the end; may be empty.
// Throws ConfigError for vocab_size <= 256.
Tokenizer tokenizer_train_bpe(std::string_view text, int vocab_size,
                              const std::function<void(int, int)>& progress);

}  // namespace quintet
