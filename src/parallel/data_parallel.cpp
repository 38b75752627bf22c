#include "quintet/parallel/data_parallel.hpp"

#include <algorithm>

namespace quintet {

DataParallel::DataParallel(const Communicator& dp, size_t total, double bucket_mb, bool zero)
    : dp_(dp), total_(total), zero_(zero) {
    shard_size_ = (total + dp.size() - 1) / dp.size();
    bucket_ = std::max<size_t>(1024, size_t(bucket_mb * 1024 * 1024 / sizeof(float)));
}

Range DataParallel::owned() const {
    size_t lo = std::min(total_, shard_size_ * dp_.rank());
    return {lo, std::min(total_, lo + shard_size_)};
}

void DataParallel::reduce_grads(float* grads, float* shard_out) const {
    if (dp_.size() == 1) {
        if (zero_) std::copy(grads, grads + shard_size_, shard_out);
        return;
    }
    if (zero_) {
        dp_.reduce_scatter_sum(grads, shard_out, shard_size_);
        return;
    }
    // Buckets from the end of the arena (the LM head, whose gradient is complete first).
    for (size_t hi = total_; hi > 0;) {
        size_t lo = hi > bucket_ ? hi - bucket_ : 0;
        dp_.all_reduce_sum(grads + lo, hi - lo);
        hi = lo;
    }
}

void DataParallel::gather_params(float* params) const {
    if (dp_.size() == 1) return;
    dp_.all_gather(params + shard_size_ * dp_.rank(), params, shard_size_);
}

double DataParallel::sum(double x) const {
    dp_.all_reduce_sum(&x, 1);
    return x;
}

}  // namespace quintet
