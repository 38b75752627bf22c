#include "quintet/train/zero_state.hpp"

#include <algorithm>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {
float* alloc_at_least_one(Backend& be, size_t n) { return be.alloc(std::max<size_t>(n, 1)); }
}  // namespace

ZeroState::ZeroState(const ParamTable& table, Backend& be, const DeviceComms& comms, int zero, bool bf16,
                     float* arena, bf16_bits* arena_bf16)
    : table_(table), be_(be), zero_(zero), bf16_(bf16), arena_(arena), arena_bf16_(arena_bf16) {
    QUINTET_CHECK(zero == 2 || zero == 3, "ZeroState is for parallel.zero = 2 or 3");
    QUINTET_CHECK(!table.units.empty() || table.specs.empty(), "ZeRO >= 2 needs the table laid out by unit");
    groups_[int(Replicas::dense)] = &comms.group(Group::dp_cp);
    groups_[int(Replicas::expert)] = &comms.group(Group::edp);
    int size[kNumRegions], rank[kNumRegions];
    for (int r = 0; r < kNumRegions; ++r) {
        size[r] = groups_[r] ? groups_[r]->size() : 1;
        rank[r] = groups_[r] ? groups_[r]->rank() : 0;
    }
    z_ = zero_layout(table, size, rank);
    unit_pieces_.assign(table.units.size(), {});
    for (size_t i = 0; i < z_.pieces.size(); ++i) unit_pieces_[size_t(z_.pieces[i].unit)].push_back(i);
    if (zero_ == 3) {
        QUINTET_CHECK(!arena_, "zero 3 keeps no whole parameter arena");
        pshard_ = alloc_at_least_one(be_, z_.trainable + z_.buffers);
        gather_.resize(kZeroGatherWindows);
        for (auto& w : gather_) {
            w.f = alloc_at_least_one(be_, z_.largest_unit);
            if (bf16_) w.b = be_.alloc_bf16(std::max<size_t>(z_.largest_unit, 1));
            w.handles.reserve(kNumRegions);
        }
    } else {
        QUINTET_CHECK(arena_ && (!bf16_ || arena_bf16_), "zero 2 keeps the whole parameter arena");
    }
}

ZeroState::~ZeroState() {
    for (auto& w : gather_) {
        be_.release(w.f);
        if (w.b) be_.release_bf16(w.b);
    }
    for (auto& w : grad_) {
        be_.release(w.g);
        be_.release(w.recv);
    }
    if (pshard_) be_.release(pshard_);
    if (gshard_) be_.release(gshard_);
}

float* ZeroState::param_at(const ZeroPiece& p, size_t i) const {
    return zero_ == 2 ? arena_ + i : pshard_ + p.at + (i - p.owned.lo);
}

void ZeroState::enable_gradients() {
    if (gshard_) return;
    gshard_ = alloc_at_least_one(be_, z_.trainable);
    grad_.resize(kZeroGradWindows);
    for (auto& w : grad_) {
        w.g = alloc_at_least_one(be_, z_.largest_unit);
        w.recv = alloc_at_least_one(be_, z_.largest_unit_shard);
        w.handles.reserve(kNumRegions);
    }
}

void ZeroState::begin_step() {
    QUINTET_CHECK(gshard_, "ZeroState::begin_step before enable_gradients");
    for (auto& w : grad_) {
        QUINTET_CHECK(!w.open && !w.pending, "a ZeRO gradient window left over from the last step");
        w.unit = -1;
    }
    be_.zero(gshard_, std::max<size_t>(z_.trainable, 1));
    grad_next_ = 0;
}

void ZeroState::finish_step() {
    for (auto& w : grad_) {
        QUINTET_CHECK(!w.open, "a unit's gradient window was never reduced");
        if (w.pending) complete_reduce(w);
        w.unit = -1;
    }
}

void ZeroState::params_changed() {
    for (auto& w : gather_) {
        QUINTET_CHECK(!w.in_use, "parameters changed while a unit is in use");
        if (w.pending) complete_gather(w);
        w.unit = -1;
    }
}

void ZeroState::gather_updated() {
    if (zero_ != 2) return;
    for (const auto& p : z_.pieces) {
        if (Replicas(p.region) == Replicas::none) continue;
        const Communicator& g = *groups_[p.region];
        if (g.size() > 1) g.all_gather(arena_ + p.owned.lo, arena_ + p.part.lo, p.owned.size());
    }
}

// ---- parameters ----------------------------------------------------------------------------

ZeroState::GatherWindow* ZeroState::window_of(int unit) {
    for (auto& w : gather_)
        if (w.unit == unit) return &w;
    return nullptr;
}

ZeroState::GatherWindow* ZeroState::free_window() {
    GatherWindow* best = nullptr;
    for (auto& w : gather_) {
        if (w.in_use) continue;
        if (w.unit < 0) return &w;
        if (!best || w.last < best->last) best = &w;
    }
    if (best && best->pending) complete_gather(*best);
    return best;
}

void ZeroState::start_gather(GatherWindow& w, int unit) {
    const ParamUnit& U = table_.units[size_t(unit)];
    w.unit = unit;
    w.handles.clear();
    w.last = ++clock_;
    for (size_t i : unit_pieces_[size_t(unit)]) {
        const ZeroPiece& p = z_.pieces[i];
        float* dst = w.f + (p.part.lo - U.range.lo);
        const Communicator* g = groups_[p.region];
        if (!g || g->size() == 1) {
            be_.copy(dst, pshard_ + p.at, p.owned.size());
            continue;
        }
        w.handles.push_back({g, g->iall_gather(pshard_ + p.at, dst, p.owned.size())});
    }
    w.pending = true;
}

void ZeroState::complete_gather(GatherWindow& w) {
    for (const Pending& h : w.handles) h.comm->wait_reduce(h.handle);
    w.handles.clear();
    if (w.b) be_.to_bf16(w.b, w.f, table_.units[size_t(w.unit)].range.size());
    w.pending = false;
}

UnitParams ZeroState::params(int unit) {
    if (zero_ == 2) return {arena_, arena_bf16_};
    GatherWindow* w = window_of(unit);
    if (!w) {
        w = free_window();
        QUINTET_CHECK(w, "ZeRO-3: every gather window is in use");
        start_gather(*w, unit);
    }
    if (w->pending) complete_gather(*w);
    w->in_use = true;
    w->last = ++clock_;
    const size_t lo = table_.units[size_t(unit)].range.lo;
    // Base pointers: base + (arena offset) lands in the window (param_units.hpp).
    return {w->f - lo, w->b ? w->b - lo : nullptr};
}

void ZeroState::prefetch(int unit) {
    if (zero_ == 2 || unit < 0 || window_of(unit)) return;
    if (GatherWindow* w = free_window()) start_gather(*w, unit);
    for (const auto* g : groups_)
        if (g) g->progress();
}

void ZeroState::release(int unit) {
    if (zero_ == 2) return;
    if (GatherWindow* w = window_of(unit)) w->in_use = false;
}

float* ZeroState::buffers(int unit) {
    if (zero_ == 2) return arena_;
    for (size_t i : unit_pieces_[size_t(unit)]) {
        const ZeroPiece& p = z_.pieces[i];
        if (Replicas(p.region) == Replicas::none) return pshard_ + p.at - p.part.lo;
    }
    return nullptr;  // the unit has none
}

// ---- gradients -----------------------------------------------------------------------------

float* ZeroState::grads(int unit) {
    QUINTET_CHECK(gshard_, "ZeroState::grads before enable_gradients");
    const size_t lo = table_.units[size_t(unit)].range.lo;
    for (auto& w : grad_)
        if (w.open && w.unit == unit) return w.g - lo;
    GradWindow& w = grad_[grad_next_];
    grad_next_ = (grad_next_ + 1) % grad_.size();
    QUINTET_CHECK(!w.open, "ZeRO: more units' gradients open at once than windows");
    if (w.pending) complete_reduce(w);
    be_.zero(w.g, table_.units[size_t(unit)].range.size());
    w.unit = unit;
    w.open = true;
    return w.g - lo;
}

void ZeroState::reduce(int unit) {
    GradWindow* w = nullptr;
    for (auto& x : grad_)
        if (x.open && x.unit == unit) w = &x;
    QUINTET_CHECK(w, "ZeRO: reduce of a unit whose gradients were not asked for");
    const size_t lo = table_.units[size_t(unit)].range.lo;
    w->open = false;
    w->handles.clear();
    size_t off = 0;
    for (size_t i : unit_pieces_[size_t(unit)]) {
        const ZeroPiece& p = z_.pieces[i];
        if (Replicas(p.region) == Replicas::none) continue;
        const Communicator& g = *groups_[p.region];
        const float* src = w->g + (p.part.lo - lo);
        if (g.size() == 1) {
            be_.add_inplace(gshard_ + p.at, src, p.owned.size());
            continue;
        }
        w->handles.push_back({&g, g.ireduce_scatter_sum(src, w->recv + off, p.owned.size())});
        off += p.owned.size();
    }
    w->pending = !w->handles.empty();
    for (const auto* g : groups_)
        if (g) g->progress();
}

void ZeroState::complete_reduce(GradWindow& w) {
    for (const Pending& h : w.handles) h.comm->wait_reduce(h.handle);
    w.handles.clear();
    // This rank's slices of the sums, added to the shard in the order they were started.
    size_t off = 0;
    for (size_t i : unit_pieces_[size_t(w.unit)]) {
        const ZeroPiece& p = z_.pieces[i];
        if (Replicas(p.region) == Replicas::none || groups_[p.region]->size() == 1) continue;
        be_.add_inplace(gshard_ + p.at, w.recv + off, p.owned.size());
        off += p.owned.size();
    }
    w.pending = false;
}

// ---- bytes ---------------------------------------------------------------------------------

double ZeroState::param_bytes() const { return zero_param_bytes(double(table_.total), z_, zero_, bf16_); }
double ZeroState::grad_bytes() const { return gshard_ ? zero_grad_bytes(z_) : 0.0; }

}  // namespace quintet
