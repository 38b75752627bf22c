// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011) keyed by
// (seed, parameter name, logical element index). Every element of every parameter is a pure
// function of those, so a rank can generate exactly its shard and the step-0 checkpoint is
// bit-identical for every parallel layout. Not a general-purpose stream RNG.
#pragma once
#include <cstdint>
#include <string_view>

namespace quintet {

struct Philox {
    uint64_t key;  // derived from (seed, stream name)
    // Four 32-bit uniform words for counter `ctr` (ctr = element index / pair index, ...).
    void block(uint64_t ctr_lo, uint64_t ctr_hi, uint32_t out[4]) const;
    // A standard normal for logical index `i` (Box-Muller on the block of i).
    float normal(uint64_t i) const;
    // A uniform in [0, 1) for index `i`, sub-stream `sub`.
    double uniform(uint64_t i, uint64_t sub = 0) const;
};

// 64-bit FNV-1a of a name, mixed with the seed: the key of a parameter's stream.
uint64_t stream_key(uint64_t seed, std::string_view name);

}  // namespace quintet
