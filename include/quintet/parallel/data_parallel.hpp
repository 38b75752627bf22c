// Data parallelism over the gradient arena: bucketed all-reduce, or with ZeRO-1 a
// reduce-scatter into this rank's shard of the optimizer state and an all-gather of the
// updated parameters. Shards are contiguous ranges of the flat arena (padded to a multiple
// of dp so every shard has the same size S).
#pragma once
#include <cstddef>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/parallel/layout.hpp"

namespace quintet {

class DataParallel {
public:
    DataParallel(const Communicator& dp, size_t total, double bucket_mb, bool zero);
    bool zero() const { return zero_; }
    size_t padded() const { return shard_size_ * dp_.size(); }  // arena floats incl. padding
    size_t shard_size() const { return shard_size_; }
    // [r*S, min((r+1)*S, total)): the optimizer shard under ZeRO-1 and, in every mode, the part
    // of each tensor this rank writes into a checkpoint.
    Range owned() const;
    // collective over dp. Without ZeRO: grads[0, total) summed in place, bucket by bucket.
    // With ZeRO: shard_out[0, S) = sum over dp of grads[owned].
    void reduce_grads(float* grads, float* shard_out) const;

    // Overlapped reduction (without ZeRO), the same sums as reduce_grads: begin_overlap at the
    // start of a step; ready(lo, hi) once grads[lo, hi) are final -- every bucket that this
    // completes starts reducing at once (non-blocking) while the backward goes on; replicas
    // report in the same order, so they start buckets in the same order. finish_overlap()
    // starts the buckets not yet complete and waits for all.
    void begin_overlap(float* grads);
    void ready(size_t lo, size_t hi);
    void finish_overlap();
    size_t buckets_started_early() const { return early_; }  // last step, before finish_overlap

    // collective over dp (ZeRO only): every rank's owned params gathered into all ranks.
    void gather_params(float* params) const;
    // collective over dp: sum of a double across replicas.
    double sum(double x) const;

private:
    const Communicator& dp_;
    size_t total_, shard_size_, bucket_;
    bool zero_;
    // Bucket k = [max(0, total - (k+1)*bucket), total - k*bucket): from the end of the arena,
    // where the backward finishes first.
    size_t nbuckets_ = 0;
    std::vector<size_t> filled_;   // floats reported ready, per bucket
    std::vector<char> started_;
    std::vector<int> handles_;     // in start order
    float* grads_ = nullptr;
    size_t early_ = 0;
    void start(size_t k);
    size_t bucket_lo(size_t k) const { return total_ > (k + 1) * bucket_ ? total_ - (k + 1) * bucket_ : 0; }
    size_t bucket_hi(size_t k) const { return total_ - k * bucket_; }
};

}  // namespace quintet
