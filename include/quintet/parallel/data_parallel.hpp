// Data parallelism over the gradient arena: bucketed all-reduce, or with ZeRO-1 a
// reduce-scatter into this rank's shard of the optimizer state and an all-gather of the
// updated parameters. Shards are contiguous ranges of the flat arena (padded to a multiple
// of dp so every shard has the same size S).
#pragma once
#include <cstddef>

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
    // collective over dp (ZeRO only): every rank's owned params gathered into all ranks.
    void gather_params(float* params) const;
    // collective over dp: sum of a double across replicas.
    double sum(double x) const;

private:
    const Communicator& dp_;
    size_t total_, shard_size_, bucket_;
    bool zero_;
};

}  // namespace quintet
