#include "quintet/parallel/data_parallel.hpp"

#include <algorithm>

namespace quintet {

DataParallel::DataParallel(const Communicator& group, Backend& be, size_t lo, size_t used,
                           double bucket_mb, bool zero)
    : group_(group), be_(be), lo_(lo), used_(used), zero_(zero) {
    shard_size_ = (used + size_t(group.size()) - 1) / size_t(group.size());
    bucket_ = std::max<size_t>(1024, size_t(bucket_mb * 1024 * 1024 / sizeof(float)));
    nbuckets_ = (used + bucket_ - 1) / bucket_;
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
    if (group_.size() > 1)
        handles_.push_back(group_.iall_reduce_sum(grads_ + bucket_lo(k), bucket_hi(k) - bucket_lo(k)));
}

void DataParallel::ready(size_t lo, size_t hi) {
    lo = std::max(lo, lo_);
    hi = std::min(hi, lo_ + used_);
    if (lo >= hi) return;
    // Buckets overlapping [lo, hi): k from the one holding hi-1 down to the one holding lo.
    const size_t end = lo_ + used_;
    for (size_t k = (end - hi) / bucket_; k <= (end - 1 - lo) / bucket_; ++k) {
        size_t a = std::max(lo, bucket_lo(k)), b = std::min(hi, bucket_hi(k));
        filled_[k] += b - a;
        if (filled_[k] == bucket_hi(k) - bucket_lo(k) && !started_[k]) {
            start(k);
            ++early_;
        }
    }
    group_.progress();
}

void DataParallel::finish_overlap() {
    for (size_t k = 0; k < nbuckets_; ++k)
        if (!started_[k]) start(k);
    for (int h : handles_) group_.wait_reduce(h);
    handles_.clear();
}

Range DataParallel::owned() const {
    size_t a = std::min(used_, shard_size_ * size_t(group_.rank()));
    return {lo_ + a, lo_ + std::min(used_, a + shard_size_)};
}

void DataParallel::reduce_grads(float* grads, float* shard_out) const {
    if (group_.size() == 1) {
        // The shard is the whole region (on any backend: a device copy, not std::copy).
        if (zero_ && used_ > 0) be_.copy(shard_out, grads + lo_, used_);
        return;
    }
    if (zero_) {
        group_.reduce_scatter_sum(grads + lo_, shard_out, shard_size_);
        return;
    }
    // Buckets from the end of the region (the LM head, whose gradient is complete first).
    for (size_t k = 0; k < nbuckets_; ++k)
        group_.all_reduce_sum(grads + bucket_lo(k), bucket_hi(k) - bucket_lo(k));
}

void DataParallel::gather_params(float* params) const {
    if (group_.size() == 1) return;
    group_.all_gather(params + lo_ + shard_size_ * size_t(group_.rank()), params + lo_, shard_size_);
}

}  // namespace quintet
