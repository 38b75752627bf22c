#include "quintet/data/sampler.hpp"

#include <cmath>

#include "quintet/core/rng.hpp"

namespace quintet {

Sampler::Sampler(const std::vector<uint32_t>& tokens, double val_fraction, int seq_len,
                 bool random, uint64_t seed)
    : tok_(tokens), T_(seq_len), random_(random), key_(stream_key(seed, "data.order.random")) {
    val_len_ = size_t(std::floor(double(tokens.size()) * val_fraction));
    train_len_ = tokens.size() - val_len_;
}

uint64_t Sampler::train_offset(int64_t s, int64_t j, int64_t gb) const {
    if (!random_) return uint64_t((s * gb + j) * int64_t(T_)) % train_len_;
    Philox rng{key_};
    uint32_t w[4];
    rng.block(uint64_t(s), uint64_t(j), w);
    uint64_t r = (uint64_t(w[0]) << 32) | w[1];
    return r % train_len_;
}

void Sampler::read(size_t begin, size_t len, uint64_t o, int32_t* ids, int32_t* targets) const {
    for (int k = 0; k < T_; ++k) {
        ids[k] = int32_t(tok_[begin + (o + k) % len]);
        targets[k] = int32_t(tok_[begin + (o + k + 1) % len]);
    }
}

void Sampler::train_sample(int64_t s, int64_t j, int64_t gb, int32_t* ids, int32_t* targets) const {
    read(0, train_len_, train_offset(s, j, gb), ids, targets);
}

void Sampler::val_sample(int64_t i, int64_t j, int mbs, int32_t* ids, int32_t* targets) const {
    uint64_t o = uint64_t((i * mbs + j) * int64_t(T_)) % val_len_;
    read(train_len_, val_len_, o, ids, targets);
}

}  // namespace quintet
