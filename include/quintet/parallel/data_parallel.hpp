// Data parallelism over one region of the gradient arena (the tensors of one replica group:
// dense tensors over dp x cp, expert tensors over edp): bucketed all-reduce, or with ZeRO-1 a
// reduce-scatter into this rank's shard of the optimizer state and an all-gather of the updated
// parameters. Shards are contiguous ranges of the region, which the parameter table pads to a
// multiple of the group size so every shard has the same size S. All indices are absolute
// arena indices.
#pragma once
#include <cstddef>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/parallel/layout.hpp"

namespace quintet {

class DataParallel {
public:
    // The region [lo, lo + used) of the arena (tensors), padded to [lo, lo + padded()).
    DataParallel(const Communicator& group, Backend& be, size_t lo, size_t used, double bucket_mb,
                 bool zero);
    const Communicator& comm() const { return group_; }
    bool zero() const { return zero_; }
    size_t padded() const { return shard_size_ * size_t(group_.size()); }  // region floats incl. padding
    size_t shard_size() const { return shard_size_; }
    Range region() const { return {lo_, lo_ + used_}; }
    // [lo + r*S, min(lo + (r+1)*S, lo + used)): the optimizer shard under ZeRO-1 and, in every
    // mode, the part of each tensor this rank writes into a checkpoint.
    Range owned() const;
    // collective over the group. Without ZeRO: grads[region] summed in place, bucket by bucket.
    // With ZeRO: shard_out[0, S) = sum over the group of grads[owned].
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

    // collective over the group (ZeRO only): every rank's owned params gathered into all ranks.
    void gather_params(float* params) const;

private:
    const Communicator& group_;
    Backend& be_;
    size_t lo_, used_, shard_size_, bucket_;
    bool zero_;
    // Bucket k = [lo + max(0, used - (k+1)*bucket), lo + used - k*bucket): from the end of the
    // region, where the backward finishes first.
    size_t nbuckets_ = 0;
    std::vector<size_t> filled_;   // floats reported ready, per bucket
    std::vector<char> started_;
    std::vector<int> handles_;     // in start order
    float* grads_ = nullptr;
    size_t early_ = 0;
    void start(size_t k);
    size_t bucket_lo(size_t k) const { return lo_ + (used_ > (k + 1) * bucket_ ? used_ - (k + 1) * bucket_ : 0); }
    size_t bucket_hi(size_t k) const { return lo_ + used_ - k * bucket_; }
};

}  // namespace quintet
