#include "quintet/parallel/data_parallel.hpp"

#include <algorithm>

namespace quintet {

DataParallel::DataParallel(const Communicator& dp, size_t total, double bucket_mb, bool zero)
    : dp_(dp), total_(total), zero_(zero) {
    shard_size_ = (total + dp.size() - 1) / dp.size();
    bucket_ = std::max<size_t>(1024, size_t(bucket_mb * 1024 * 1024 / sizeof(float)));
    nbuckets_ = (total + bucket_ - 1) / bucket_;
    filled_.assign(nbuckets_, 0);
    started_.assign(nbuckets_, 0);
    handles_.reserve(nbuckets_);
}

void DataParallel::begin_overlap(float* grads) {
    grads_ = grads;
    std::fill(filled_.begin(), filled_.end(), 0);
    std::fill(started_.begin(), started_.end(), 0);
    handles_.clear();
    early_ = 0;
}

void DataParallel::start(size_t k) {
    started_[k] = 1;
    if (dp_.size() > 1) handles_.push_back(dp_.iall_reduce_sum(grads_ + bucket_lo(k), bucket_hi(k) - bucket_lo(k)));
}

void DataParallel::ready(size_t lo, size_t hi) {
    if (lo >= hi) return;
    // Buckets overlapping [lo, hi): k from the one holding hi-1 down to the one holding lo.
    for (size_t k = (total_ - hi) / bucket_; k <= (total_ - 1 - lo) / bucket_; ++k) {
        size_t a = std::max(lo, bucket_lo(k)), b = std::min(hi, bucket_hi(k));
        filled_[k] += b - a;
        if (filled_[k] == bucket_hi(k) - bucket_lo(k) && !started_[k]) {
            start(k);
            ++early_;
        }
    }
    dp_.progress();
}

void DataParallel::finish_overlap() {
    for (size_t k = 0; k < nbuckets_; ++k)
        if (!started_[k]) start(k);
    for (int h : handles_) dp_.wait_reduce(h);
    handles_.clear();
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
    for (size_t k = 0; k < nbuckets_; ++k) dp_.all_reduce_sum(grads + bucket_lo(k), bucket_hi(k) - bucket_lo(k));
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
