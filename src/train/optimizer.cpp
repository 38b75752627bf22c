#include "quintet/train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"

namespace quintet {

namespace {
// ZeRO-2/3: f(piece, spec, a, b) for each trainable spec's part [a, b) inside this rank's slices.
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

Optimizer::Optimizer(const ParamTable& table, Backend& be, const GradientSync& sync, const DeviceComms& comms, int tp,
                     const TrainConfig& cfg, std::vector<TensorRule> rules)
    : table_(table), be_(be), sync_(sync), cfg_(cfg), rules_(std::move(rules)) {
    QUINTET_CHECK(rules_.empty() || rules_.size() == table_.specs.size(), "Optimizer: one rule per tensor");
    const bool muon = cfg_.optimizer == "muon";
    if (muon) {
        size_t taken = 0;
        for (const LogicalTensor& t : table_.logical) taken += muon_takes(t) ? 1 : 0;
        if (taken == 0)
            config_fail("train.optimizer", "muon",
                        "this model has no hidden or expert matrix for Muon to take, so every tensor would stay under "
                        "AdamW; use train.optimizer = adamw");
    }
    // The segments: what this rank updates of each trainable tensor, and where.
    auto add = [&](const ParamSpec& spec, size_t a, size_t b, int gsrc, int region, size_t g_at, bool p_shard,
                   size_t p_at) {
        Segment s;
        s.spec = size_t(&spec - table_.specs.data()), s.a = a, s.b = b;
        s.gsrc = gsrc, s.region = region, s.g_at = g_at, s.p_shard = p_shard, s.p_at = p_at;
        s.muon = muon && muon_takes(spec);
        segments_.push_back(s);
    };
    if (const ZeroState* z = sync_.sharded()) {
        for_each_owned(table_, *z, [&](const ZeroPiece& p, const ParamSpec& spec, size_t a, size_t b) {
            const size_t at = p.at + (a - p.owned.lo);
            const bool zero3 = z->level() == 3;  // zero 3: the parameters are the shard too
            add(spec, a, b, 2, p.region, at, zero3, zero3 ? at : a);
        });
    } else {
        for (int r = 0; r < kNumRegions; ++r) {
            const DataParallel* dp = sync_.region(r);
            if (!dp || !sync_.zero()) continue;
            // Under ZeRO-1 the reduced gradient of the shard (S floats, the last rank's partly padding).
            shards_[r] = be_.alloc(std::max<size_t>(dp->shard_size(), 1));
            shard_floats_ += std::max<size_t>(dp->shard_size(), 1);
            owned_.push_back(shards_[r]);
        }
        for (const ParamSpec& spec : table_.specs) {
            if (!spec.trainable()) continue;
            const int r = int(spec.replicas);
            const Range u = updated(r);
            const size_t a = std::max(u.lo, spec.offset), b = std::min(u.hi, spec.offset + spec.numel());
            if (a < b) add(spec, a, b, sync_.zero() ? 1 : 0, r, sync_.zero() ? a - u.lo : a, false, a);
        }
    }
    // AdamW's moments for its segments, back to back; Muon's segments in its own list.
    std::vector<MuonSegment> mseg;
    for (Segment& s : segments_) {
        if (s.muon) {
            s.state = mseg.size();
            mseg.push_back({s.spec, s.a - table_.specs[s.spec].offset, s.b - table_.specs[s.spec].offset});
        } else {
            s.state = moments_;
            moments_ += s.b - s.a;
        }
    }
    m_ = be_.alloc(std::max<size_t>(moments_, 1));
    v_ = be_.alloc(std::max<size_t>(moments_, 1));
    if (muon) {
        muon_ptrs_.resize(mseg.size());
        muon_ = std::make_unique<Muon>(table_, be_, comms, tp, cfg_, rules_, std::move(mseg), sync_.zero() || sync_.sharded());
    }
}

Optimizer::~Optimizer() {
    muon_.reset();
    for (float* p : owned_) be_.release(p);
    be_.release(m_);
    be_.release(v_);
}

Range Optimizer::updated(int r) const {
    const DataParallel* dp = sync_.region(r);
    return sync_.zero() ? dp->owned() : dp->region();
}

Range Optimizer::written(const Segment& s) const {
    if (sync_.sharded() || sync_.zero()) return {s.a, s.b};  // each element is one rank's
    const Range own = sync_.region(s.region)->owned();       // the replicas split the writing
    const size_t a = std::max(own.lo, s.a), b = std::min(own.hi, s.b);
    return a < b ? Range{a, b} : Range{s.a, s.a};
}

const float* Optimizer::grad_of(const Segment& s, const float* grads) const {
    if (s.gsrc == 0) return grads + s.g_at;
    if (s.gsrc == 1) return shards_[s.region] + s.g_at;
    return sync_.sharded()->grad_shard() + s.g_at;
}

float* Optimizer::param_of(const Segment& s, float* params) const {
    return s.p_shard ? sync_.sharded()->param_shard() + s.p_at : params + s.p_at;
}

std::vector<ArenaRange> Optimizer::param_write_ranges() const {
    std::vector<ArenaRange> w;
    for (const Segment& s : segments_) {
        const Range r = written(s);
        if (r.size() > 0) w.push_back({r, 0});
    }
    return w;
}

OptimizerStateIo Optimizer::state(bool for_save) const {
    OptimizerStateIo st;
    st.optimizer = cfg_.optimizer;
    st.exp_avg = m_, st.exp_avg_sq = v_;
    for (const Segment& s : segments_) {
        if (s.muon) continue;
        const Range r = for_save ? written(s) : Range{s.a, s.b};
        if (r.size() > 0) st.ranges.push_back({r, s.state + (r.lo - s.a)});
    }
    if (muon_)
        for (const Muon::Owned& o : muon_->owned()) st.momentum.push_back({o.logical, o.momentum});
    return st;
}

double Optimizer::bytes() const {
    double f = 2.0 * double(std::max<size_t>(moments_, 1));
    if (muon_) f += double(muon_->momentum_floats() + muon_->buffer_floats());
    return f * 4;
}

std::string Optimizer::describe() const {
    size_t mt = 0, me = 0, at = 0, ae = 0;
    for (const LogicalTensor& t : table_.logical) {
        if (!t.trainable) continue;
        if (muon_ && muon_takes(t)) ++mt, me += t.numel();
        else ++at, ae += t.numel();
    }
    char b[320];
    if (!muon_) {
        std::snprintf(b, sizeof b, "optimizer: AdamW for all %zu trainable tensors (%.4g M elements)", at, double(ae) / 1e6);
        return b;
    }
    std::snprintf(b, sizeof b,
                  "optimizer: Muon for %zu matrices (%.4g M elements: the hidden and expert matrices; momentum %g, "
                  "%d Newton-Schulz steps, scale %g), AdamW for the other %zu tensors (%.4g M elements: embedding, head, "
                  "norms, router)",
                  mt, double(me) / 1e6, cfg_.muon_momentum, cfg_.muon_ns_steps, cfg_.muon_scale, at, double(ae) / 1e6);
    return b;
}

double Optimizer::grad_norm(const float* grads, const Communicator& world) const {
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

void Optimizer::clip(float* grads, double norm) {
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

void Optimizer::update(float* params, const float* grads, int64_t s, double lr) {
    const double bc1 = 1.0 - std::pow(cfg_.beta1, double(s + 1));
    const double bc2 = 1.0 - std::pow(cfg_.beta2, double(s + 1));
    {
        QUINTET_PROFILE("optimizer.adamw");
        for (const Segment& seg : segments_) {
            if (seg.muon) {
                muon_ptrs_[seg.state] = {grad_of(seg, grads), param_of(seg, params)};
                continue;
            }
            const ParamSpec& spec = table_.specs[seg.spec];
            // A group's multipliers scale its learning rate and, as in PyTorch's parameter groups,
            // the decoupled decay lr * wd with it. Multiplier 1 is the plain step, bit for bit.
            double lr_i = lr, wd_i = cfg_.weight_decay;
            if (!rules_.empty()) lr_i *= rules_[seg.spec].lr_mult, wd_i *= rules_[seg.spec].wd_mult;
            be_.adamw(param_of(seg, params), grad_of(seg, grads), m_ + seg.state, v_ + seg.state, seg.b - seg.a,
                      float(lr_i), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                      spec.decay() ? float(wd_i) : 0.0f, float(bc1), float(bc2));
        }
    }
    if (muon_) muon_->step(muon_ptrs_.data(), lr);
    if (ZeroState* z = sync_.sharded()) {
        z->gather_updated();  // zero 2: every rank's slices into the arena
        return;
    }
    if (sync_.zero())
        for (int r = 0; r < kNumRegions; ++r)
            if (const DataParallel* dp = sync_.region(r)) dp->gather_params(params);
}

}  // namespace quintet
