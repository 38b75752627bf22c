// quintet's own tokenizers: "byte" (token = byte, vocab 256) and "bpe", a byte-level BPE that
// `quintet prepare` trains on its input: merge i makes token 256 + i from a pair of earlier
// tokens. Both round-trip any byte string exactly, invalid UTF-8 included.
// bpe pre-tokenizes with the GPT-2 pattern exactly (pretokenizer.hpp), so its merges mean the
// same in other runtimes. Token files of format 1 used a hand-written split (kept here as the
// "format-1 split", TokenizerState::pattern ""), so their merges keep their meaning.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

inline constexpr const char* kEndOfText = "<|endoftext|>";
// No token of a trained bpe is longer than this: training counts pieces in chunks of at most
// this many bytes, so one huge piece (a megabyte without a space) stays cheap to count.
inline constexpr size_t kBpeMaxTokenBytes = 64;

Tokenizer tokenizer_byte();

// A bpe from its merges; with_end_of_text adds "<|endoftext|>" as the id after the merges
// (vocab_size = 256 + merges + 1). pattern: the pre-tokenizer regex ("" = the format-1 split).
// Throws ConfigError naming `origin` for a merge that uses a token not made before it, or makes
// a token longer than kBpeMaxTokenBytes.
Tokenizer tokenizer_bpe(const std::vector<std::pair<uint32_t, uint32_t>>& merges, bool with_end_of_text,
                        const std::string& pattern, const std::string& origin);

// Byte-level BPE trained on `text`: pre-split with the GPT-2 pattern, count adjacent pairs over
// the distinct pieces (weighted by frequency), then repeatedly merge the most frequent pair,
// ties broken by the smallest (a, b). Pair counts are updated incrementally, touching only the
// pieces that contain the merged pair. Stops early (fewer merges) if the text runs out of pairs.
// progress(done_merges, total_merges) is called periodically and at the end; may be empty.
// Throws ConfigError for vocab_size <= 256.
Tokenizer tokenizer_train_bpe(std::string_view text, int vocab_size,
                              const std::function<void(int, int)>& progress, bool with_end_of_text = false);

// The same merges with "<|endoftext|>" after them (prepare: when the data has documents).
Tokenizer tokenizer_bpe_with_end_of_text(const Tokenizer& bpe);

}  // namespace quintet
