// Which tokens make sample j of step s (docs/data.md, docs/math.md §10). A pure function of
// (deck, step, j, global batch): the same samples for every layout, and no state to save for an
// exact resume. Sample n = s * gb + j of the run comes from one training source (the blending
// rule, below) and is that source's k-th sample; its start offset in the source's train split is
//   sequential  (k * T) mod len
//   random      Philox(seed, s, j) mod len
//   shuffle     T * perm_e(k mod m), e = k / m, m = floor((len - 1) / T): every sample of the
//               split once per epoch e, in a seeded bijection of [0, m) (no index in memory)
// and it reads T + 1 tokens circularly. Blending: sample n goes to the source with the largest
// deficit w_i * (n + 1) - c_i (c_i = its samples among the first n; ties to the first source),
// so every prefix holds each source's share to within one sample.
//
// Training reads stream: once a rank says which samples of each step it reads
// (prefetch_range), a background thread reads step s + 1's tokens into one of two buffers
// allocated then, while step s trains. Tokens stay uint16 in memory when the vocabulary fits.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "quintet/data/dataset.hpp"

namespace quintet {

// A bijection of [0, n) keyed by `key` (a few rounds of multiply-odd / xor-shift / add over the
// smallest power of two >= n, cycle-walked back into range). O(1) memory.
uint64_t permute_index(uint64_t x, uint64_t n, uint64_t key);

// A blend's weights from sample `start` on (docs/data.md, "Blends on resume"). A run whose weights
// change on resume has several: from each start the deficits count from the samples each source
// had there, so every source continues from its current sample.
struct BlendSegment {
    int64_t start = 0;
    std::vector<double> weights;  // normalised
};
std::string blend_segments_text(const std::vector<BlendSegment>& segments);  // "start w0 w1 ...\n" per segment
std::vector<BlendSegment> blend_segments_parse(const std::string& text);     // {} when malformed

// The blending rule: the source of each sample in turn, and the count of every source so far.
class Blend {
public:
    explicit Blend(std::vector<double> weights);  // normalised here
    explicit Blend(std::vector<BlendSegment> segments);  // the first starts at 0
    // Moves to sample n (restarting from 0 when n is behind) and returns the source of sample n,
    // counting it; counts() are then the samples of each source among the first n + 1.
    int next();
    int64_t position() const { return n_; }
    void reset();
    const std::vector<int64_t>& counts() const { return c_; }
    const std::vector<double>& weights() const { return w_; }

private:
    std::vector<BlendSegment> seg_;
    size_t at_ = 0;              // the segment of sample n_
    std::vector<double> w_;      // its weights
    std::vector<int64_t> c_, base_;  // counts so far; at the segment's start
    int64_t n_ = 0;
};

class Sampler {
public:
    Sampler(const DataSet& data, const DataConfig& dc, uint64_t seed);
    ~Sampler();
    Sampler(const Sampler&) = delete;
    Sampler& operator=(const Sampler&) = delete;

    struct Ref {
        int source = 0;
        int64_t offset = 0;  // in the source's train split
    };
    // Source and start offset of sample j of step s (global batch gb samples).
    Ref train_ref(int64_t step, int64_t j, int64_t gb);
    // ids[T] = split[o .. o+T), targets[T] = split[o+1 .. o+T+1), read circularly.
    void train_sample(int64_t step, int64_t j, int64_t gb, int32_t* ids, int32_t* targets);
    // This rank reads samples [lo, hi) of every step of gb samples: from then on they are read
    // ahead on a background thread into two buffers allocated here.
    void prefetch_range(int64_t lo, int64_t hi, int64_t gb);
    size_t buffer_bytes() const { return buffer_bytes_; }
    // Seconds train_sample spent waiting for tokens since the last call (0 when the prefetch
    // kept ahead).
    double take_wait_seconds() {
        const double w = wait_s_;
        wait_s_ = 0;
        return w;
    }
    // Samples of each training source among the first n of the run.
    const std::vector<int64_t>& source_samples(int64_t n);
    // The blend's segments (one unless its weights changed on a resume), and this deck's weights.
    void set_blend(const std::vector<BlendSegment>& segments);
    const std::vector<BlendSegment>& blend() const { return segments_; }
    std::vector<double> deck_weights() const;

    const std::vector<Source>& train_sources() const { return data_.train; }
    const std::vector<Source>& val_sources() const { return data_.val; }
    // Batches of mbs samples that evaluate validation source v: `batches`, or with 0 all its
    // whole batches (floor(floor((len - 1) / T) / mbs)).
    int64_t val_batches(int v, int mbs, int64_t batches) const;
    // Sample j of validation batch i of source v, at offset (i * mbs + j) * T of its split.
    void val_sample(int v, int64_t i, int64_t j, int mbs, int32_t* ids, int32_t* targets) const;

private:
    struct Slot {
        int64_t step = -1;
        bool ready = false;
        std::exception_ptr error;
        std::vector<Ref> refs;
        std::vector<unsigned char> tokens;
    };
    const std::vector<Ref>& step_refs(int64_t step, int64_t gb);
    int64_t offset_of(int src, int64_t k, int64_t step, int64_t j) const;
    void decode(const unsigned char* buf, int32_t* ids, int32_t* targets) const;
    void fill(Slot& slot);
    void submit(int64_t step);
    Slot& ready_slot(int64_t step);
    void worker();

    const DataSet& data_;
    TokenReader reader_;
    int T_;
    std::string order_;
    uint64_t seed_, random_key_, shuffle_key_;
    std::vector<BlendSegment> segments_;
    Blend plan_blend_, count_blend_;
    std::vector<int64_t> one_source_{0};  // source_samples of a single source, without allocating
    int64_t plan_step_[2] = {-1, -1}, plan_gb_[2] = {0, 0};
    std::vector<Ref> plan_[2];
    std::vector<unsigned char> scratch_;          // one sample, for reads outside the prefetch
    mutable std::vector<unsigned char> val_scratch_;
    // Prefetch.
    int64_t lo_ = 0, hi_ = 0, gb_ = 0;
    size_t buffer_bytes_ = 0;
    Slot slots_[2];
    bool async_ = false;
    std::thread thread_;
    std::mutex m_;
    std::condition_variable cv_;
    int pending_ = -1;  // slot the worker fills
    double wait_s_ = 0;
    bool stop_ = false;
};

}  // namespace quintet
