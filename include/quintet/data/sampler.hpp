// Which tokens make sample j of step s (docs/math.md §10). A pure function of (deck, step, j): the
// same samples for every layout, and no state to save for an exact resume.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace quintet {

class Sampler {
public:
    // tokens: the whole file; the last floor(n * val_fraction) tokens are the validation split.
    Sampler(const std::vector<uint32_t>& tokens, double val_fraction, int seq_len, bool random,
            uint64_t seed);
    size_t train_len() const { return train_len_; }
    size_t val_len() const { return val_len_; }
    // Start offset in the train split of sample j of step s, global batch gb samples.
    uint64_t train_offset(int64_t step, int64_t j, int64_t gb) const;
    // ids[T] = split[o .. o+T), targets[T] = split[o+1 .. o+T+1), read circularly.
    void train_sample(int64_t step, int64_t j, int64_t gb, int32_t* ids, int32_t* targets) const;
    // Sample j of validation batch i (batches of mbs samples).
    void val_sample(int64_t i, int64_t j, int mbs, int32_t* ids, int32_t* targets) const;

private:
    void read(size_t begin, size_t len, uint64_t o, int32_t* ids, int32_t* targets) const;
    const std::vector<uint32_t>& tok_;
    size_t train_len_, val_len_;
    int T_;
    bool random_;
    uint64_t key_;
};

}  // namespace quintet
