// Speculative greedy decoding with DeepSeek-V3's MTP modules (quintet generate --speculative mtp;
// docs/math.md §11): the modules draft the next tokens, the main model checks them all in one
// cached forward and keeps the longest prefix its own greedy choice agrees with, so the output is
// plain greedy decoding's, token for token; every accepted draft saves one main-model forward.
#pragma once
#include <cstdint>
#include <vector>

#include "quintet/model/decoder.hpp"

namespace quintet {

struct SpeculativeStats {
    int64_t rounds = 0;    // verification forwards
    int64_t drafted = 0;   // tokens the modules proposed
    int64_t accepted = 0;  // of them, those the main model's greedy choice confirmed
    double rate() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
};

class MtpSpeculator {
public:
    // `dec` has the prompt in its caches (prefill or steps) with keep_hidden on since before it
    // (dec.hidden() holds the prompt's rows), and model.mtp_depth > 0. prompt: its tokens.
    MtpSpeculator(Decoder& dec, const std::vector<int32_t>& prompt);
    // next: the main model's greedy token after everything so far (not yet through the decoder).
    // Drafts up to min(mtp_depth, limit) tokens after it, verifies them with `next` in one
    // forward and returns the tokens that follow `next`: the accepted drafts and the main model's
    // own token after them (at most `limit`; the last is the next call's `next`).
    std::vector<int32_t> advance(int32_t next, int limit);
    const SpeculativeStats& stats() const { return stats_; }

private:
    Decoder& dec_;
    int C_ = 0, D_ = 0;
    std::vector<int32_t> tokens_;          // every token through the main model so far
    std::vector<std::vector<float>> h_;    // h_[k]: [rows, C] the depth-k hidden state per position
    SpeculativeStats stats_;
};

}  // namespace quintet
