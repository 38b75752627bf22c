// Passkey retrieval (Mohtashami & Jaggi 2023): a random 5-digit key hidden at some depth of
// filler text, then a question; a model that uses its whole context continues with the key.
// `quintet eval --passkey N` scores greedy retrieval by length and depth; the same generator
// writes a training corpus of such documents (`--write-passkey-corpus`) for the synthetic task.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

struct PasskeyPrompt {
    std::string prompt;  // intro, filler, the key sentence at `depth`, filler, the question
    std::string key;     // 5 digits: the expected continuation
    double depth = 0;    // where the key sentence sits in the filler, 0 (start) .. 1 (end)
    int tokens = 0;      // prompt + key, in tokens of `tok`
};

// A prompt of (as nearly as the tokenizer allows, at most) `length` tokens including the key;
// key and depth from (seed, index). Deterministic.
PasskeyPrompt passkey_prompt(const Tokenizer& tok, int length, double depth, uint64_t seed,
                             uint64_t index);

// `n` documents of `length` tokens each (prompt + key, filler trimmed to fit), depths uniform
// in [0, 1]: a training corpus for the synthetic task. Byte tokenizer: exact lengths.
std::string passkey_corpus(const Tokenizer& tok, int n, int length, uint64_t seed);

}  // namespace quintet
