#include "quintet/train/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "quintet/core/error.hpp"

namespace quintet {

AdamW::AdamW(const ParamTable& table, Backend& be, const GradientSync& sync, const TrainConfig& cfg,
             std::vector<TensorRule> rules)
    : table_(table), be_(be), sync_(sync), cfg_(cfg), rules_(std::move(rules)) {
    QUINTET_CHECK(rules_.empty() || rules_.size() == table_.specs.size(), "AdamW: one rule per tensor");
    if (const ZeroState* z = sync_.sharded()) state_ = z->layout().trainable;  // by piece.at
    for (int r = 0; r < kNumRegions && !sync_.sharded(); ++r) {
        const DataParallel* dp = sync_.region(r);
        if (!dp) continue;
        state_at_[r] = state_;
        // Under ZeRO the moments and the reduced gradient cover the shard (S floats, the last
        // rank's partly padding); else the whole region.
        state_ += sync_.zero() ? dp->shard_size() : dp->region().size();
        if (sync_.zero()) {
            shards_[r] = be_.alloc(std::max<size_t>(dp->shard_size(), 1));
            shard_floats_ += std::max<size_t>(dp->shard_size(), 1);
            owned_.push_back(shards_[r]);
        }
    }
    m_ = be_.alloc(std::max<size_t>(state_, 1));
    v_ = be_.alloc(std::max<size_t>(state_, 1));
}

AdamW::~AdamW() {
    for (float* p : owned_) be_.release(p);
    be_.release(m_);
    be_.release(v_);
}

Range AdamW::updated(int r) const {
    const DataParallel* dp = sync_.region(r);
    return sync_.zero() ? dp->owned() : dp->region();
}

ArenaRange AdamW::write_range(int r) const {
    const DataParallel* dp = sync_.region(r);
    const Range own = dp->owned(), u = updated(r);
    return {own, state_at_[r] + (own.lo - u.lo)};
}

ArenaRange AdamW::state_range(int r) const { return {updated(r), state_at_[r]}; }

std::vector<ArenaRange> AdamW::write_ranges() const {
    std::vector<ArenaRange> w;
    if (const ZeroState* z = sync_.sharded()) {
        for (const ZeroPiece& p : z->layout().pieces)
            if (Replicas(p.region) != Replicas::none) w.push_back({p.owned, p.at});
        return w;
    }
    for (int r = 0; r < kNumRegions; ++r)
        if (sync_.region(r)) w.push_back(write_range(r));
    return w;
}

std::vector<ArenaRange> AdamW::state_ranges() const {
    if (sync_.sharded()) return write_ranges();
    std::vector<ArenaRange> w;
    for (int r = 0; r < kNumRegions; ++r)
        if (sync_.region(r)) w.push_back(state_range(r));
    return w;
}

namespace {
// ZeRO-2/3: f(piece, a, b) for each trainable spec's part [a, b) inside this rank's slices.
template <typename F>
void for_each_owned(const ParamTable& table, const ZeroState& z, F f) {
    for (const ZeroPiece& p : z.layout().pieces) {
        if (Replicas(p.region) == Replicas::none) continue;
        for (const auto& spec : table.specs) {
            if (spec.unit != p.unit || int(spec.replicas) != p.region) continue;
            const size_t a = std::max(p.owned.lo, spec.offset), b = std::min(p.owned.hi, spec.offset + spec.numel());
            if (a < b) f(p, spec, a, b);
        }
    }
}
}  // namespace

double AdamW::grad_norm(const float* grads, const Communicator& world) const {
    double ss = 0.0;
    if (const ZeroState* z = sync_.sharded()) {  // each rank's slices: every element once
        for_each_owned(table_, *z, [&](const ZeroPiece& p, const ParamSpec& spec, size_t a, size_t b) {
            if (spec.writer) ss += be_.sumsq(z->grad_shard() + p.at + (a - p.owned.lo), b - a);
        });
        world.all_reduce_sum(&ss, 1);
        return std::sqrt(ss);
    }
    for (const auto& spec : table_.specs) {
        if (!spec.writer || !spec.trainable()) continue;
        const int r = int(spec.replicas);
        const DataParallel* dp = sync_.region(r);
        // Counted once: the ZeRO shard of each rank, or the whole region on its group's rank 0.
        Range u = updated(r);
        if (!sync_.zero() && dp->comm().rank() != 0) continue;
        const size_t a = std::max(u.lo, spec.offset), b = std::min(u.hi, spec.offset + spec.numel());
        if (a >= b) continue;
        const float* g = sync_.zero() ? shards_[r] + (a - u.lo) : grads + a;
        ss += be_.sumsq(g, b - a);
    }
    world.all_reduce_sum(&ss, 1);
    return std::sqrt(ss);
}

void AdamW::clip(float* grads, double norm) {
    if (!(cfg_.grad_clip > 0 && norm > cfg_.grad_clip)) return;
    const float s = float(cfg_.grad_clip / (norm + 1e-6));
    if (const ZeroState* z = sync_.sharded()) {
        be_.scale(z->grad_shard(), std::max<size_t>(z->layout().trainable, 1), s);
        return;
    }
    for (int r = 0; r < kNumRegions; ++r) {
        const DataParallel* dp = sync_.region(r);
        if (!dp) continue;
        if (sync_.zero()) be_.scale(shards_[r], dp->shard_size(), s);
        else be_.scale(grads + dp->region().lo, dp->region().size(), s);
    }
}

void AdamW::step_range(size_t i, float* p, const float* g, float* m, float* v, size_t n, double lr, double bc1,
                       double bc2) const {
    const ParamSpec& spec = table_.specs[i];
    // A group's multipliers scale its learning rate and, as in PyTorch's parameter groups, the
    // decoupled decay lr * wd with it. Multiplier 1 is the plain step, bit for bit.
    double lr_i = lr, wd_i = cfg_.weight_decay;
    if (!rules_.empty()) lr_i *= rules_[i].lr_mult, wd_i *= rules_[i].wd_mult;
    be_.adamw(p, g, m, v, n, float(lr_i), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
              spec.decay() ? float(wd_i) : 0.0f, float(bc1), float(bc2));
}

void AdamW::update(float* params, const float* grads, int64_t s, double lr) {
    const double bc1 = 1.0 - std::pow(cfg_.beta1, double(s + 1));
    const double bc2 = 1.0 - std::pow(cfg_.beta2, double(s + 1));
    if (ZeroState* z = sync_.sharded()) {  // this rank's slices, then (zero 2) every rank's into the arena
        for_each_owned(table_, *z, [&](const ZeroPiece& p, const ParamSpec& spec, size_t a, size_t b) {
            const size_t o = p.at + (a - p.owned.lo);
            step_range(size_t(&spec - table_.specs.data()), z->param_at(p, a), z->grad_shard() + o, m_ + o, v_ + o,
                       b - a, lr, bc1, bc2);
        });
        z->gather_updated();
        return;
    }
    for (size_t i = 0; i < table_.specs.size(); ++i) {
        const ParamSpec& spec = table_.specs[i];
        if (!spec.trainable()) continue;
        const int r = int(spec.replicas);
        const Range u = updated(r);
        const size_t a = std::max(u.lo, spec.offset), b = std::min(u.hi, spec.offset + spec.numel());
        if (a >= b) continue;
        const size_t o = state_at_[r] + (a - u.lo);
        const float* g = sync_.zero() ? shards_[r] + (a - u.lo) : grads + a;
        step_range(i, params + a, g, m_ + o, v_ + o, b - a, lr, bc1, bc2);
    }
    if (sync_.zero())
        for (int r = 0; r < kNumRegions; ++r)
            if (const DataParallel* dp = sync_.region(r)) dp->gather_params(params);
}

}  // namespace quintet
