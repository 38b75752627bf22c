#include "quintet/train/grad_sync.hpp"
#include "quintet/core/clock.hpp"

#include <mpi.h>

#include <algorithm>

namespace quintet {

GradientSync::GradientSync(const ParamTable& table, Backend& be, const DeviceComms& comms,
                           TensorParallel& tp, double bucket_mb, bool zero, bool overlap, ZeroState* sharded)
    : table_(table), comms_(comms), tp_(tp), zero_(zero && !sharded), sharded_(sharded) {
    hook_.s = this;
    synced_.assign(table.specs.size(), 0);
    if (sharded_) return;
    bool any_group = false;
    for (int r = 0; r < kNumRegions; ++r) {
        // Buffers have no gradient; an empty region (no expert tensors) needs no reduction.
        if (Replicas(r) == Replicas::none || table.region_used[r] == 0) continue;
        const Communicator& g = comms.group(replica_group(Replicas(r)));
        dp_[r] = std::make_unique<DataParallel>(g, be, table.region[r].lo, table.region_used[r],
                                                bucket_mb, zero);
        any_group = any_group || g.size() > 1;
    }
    overlap_ = overlap && !zero && any_group;
    for (size_t i = 0; i < table.specs.size(); ++i) spec_at_offset_[table.specs[i].offset] = i;
}

void GradientSync::begin_step(float* grads) {
    grads_ = grads;
    std::fill(synced_.begin(), synced_.end(), 0);
    if (sharded_) sharded_->begin_step();
    if (overlap_)
        for (auto& d : dp_)
            if (d) d->begin_overlap(grads);
}

void GradientSync::sync_one(size_t i, float* grads) {
    const ParamSpec& s = table_.specs[i];
    float* g = grads + s.offset;
    switch (s.sync) {
    case GradSync::none: break;
    case GradSync::tp: tp_.all_reduce_sum(g, s.numel()); break;
    case GradSync::kv_group: comms_.kv_group->all_reduce_sum(g, s.numel()); break;
    case GradSync::tied: comms_.tied->all_reduce_sum(g, s.numel()); break;
    }
    synced_[i] = 1;
}

void GradientSync::Hook::ready(float* g, size_t n) {
    // [g, g+n) may span several specs (fused q|k|v, gate|up), each with its own sync rule; the
    // table's specs lie in arena order, back to back.
    const size_t lo = size_t(g - s->grads_), hi = lo + n;
    const auto& specs = s->table_.specs;
    for (size_t i = s->spec_at_offset_.at(lo); i < specs.size(); ++i) {
        const ParamSpec& p = specs[i];
        if (p.offset >= hi) break;
        // A tied embedding completes after the schedule (its partner stage finishes later);
        // its bucket waits.
        if (p.sync == GradSync::tied || !p.trainable()) continue;
        s->sync_one(i, s->grads_);
        s->dp_[size_t(p.replicas)]->ready(p.offset, p.offset + p.numel());
    }
}

void GradientSync::sync_shard(size_t i) {
    // Every member of the sync group lays the tensor's unit out alike and owns the same slice
    // of it (tp, kv_group and tied partners share their dp x cp and edp coordinates, and the
    // units holding these tensors have the same size on each of them): the slice is summed.
    const ParamSpec& s = table_.specs[i];
    for (const ZeroPiece& p : sharded_->layout().pieces) {
        if (p.unit != s.unit || p.region != int(s.replicas)) continue;
        const size_t a = std::max(p.owned.lo, s.offset), b = std::min(p.owned.hi, s.offset + s.numel());
        float* g = sharded_->grad_shard() + p.at + (a - p.owned.lo);
        const size_t n = a < b ? b - a : 0;
        switch (s.sync) {
        case GradSync::none: break;
        case GradSync::tp: tp_.all_reduce_sum(g, n); break;
        case GradSync::kv_group: comms_.kv_group->all_reduce_sum(g, n); break;
        case GradSync::tied: comms_.tied->all_reduce_sum(g, n); break;
        }
    }
}

std::pair<double, double> GradientSync::finish_step(float* grads, float* const* shards) {
    if (sharded_) {  // the units' reductions (started by the chunks), then the partial sums
        const double t0 = now_s();
        sharded_->finish_step();
        const double t1 = now_s();
        for (size_t i = 0; i < table_.specs.size(); ++i)
            if (table_.specs[i].trainable() && table_.specs[i].sync != GradSync::none) sync_shard(i);
        return {now_s() - t1, t1 - t0};
    }
    const double t0 = now_s();
    for (size_t i = 0; i < table_.specs.size(); ++i)
        if (!synced_[i] && table_.specs[i].trainable()) sync_one(i, grads);
    const double t1 = now_s();
    for (int r = 0; r < kNumRegions; ++r) {
        if (!dp_[r]) continue;
        if (overlap_) dp_[r]->finish_overlap();
        else dp_[r]->reduce_grads(grads, shards ? shards[r] : nullptr);
    }
    return {t1 - t0, now_s() - t1};
}

double GradientSync::buckets_overlapped() const {
    double n = 0;
    for (const auto& d : dp_)
        if (d) n += double(d->buckets_started_early());
    return n;
}

}  // namespace quintet
