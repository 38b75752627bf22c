#include "quintet/data/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/rng.hpp"
#include "quintet/core/trace.hpp"

namespace quintet {

uint64_t permute_index(uint64_t x, uint64_t n, uint64_t key) {
    if (n <= 1) return 0;
    int bits = 2;
    while (bits < 63 && (uint64_t(1) << bits) < n) ++bits;
    const uint64_t mask = (uint64_t(1) << bits) - 1;
    const int shift = bits / 2 + 1 > bits - 1 ? bits - 1 : bits / 2 + 1;
    uint32_t k[8];
    const Philox rng{key};
    rng.block(0, 0, k);
    rng.block(1, 0, k + 4);
    auto round = [&](uint64_t v) {
        for (int r = 0; r < 4; ++r) {
            v = (v * ((uint64_t(k[2 * r]) << 1) | 1)) & mask;  // odd multiplier: a bijection mod 2^bits
            v ^= v >> shift;                                   // xor-shift: a bijection
            v = (v + k[2 * r + 1]) & mask;
        }
        return v;
    };
    // Cycle-walking: the bijection of [0, 2^bits) restricted to [0, n) by iterating until back in range.
    do x = round(x);
    while (x >= n);
    return x;
}

namespace {
std::vector<double> normalised(std::vector<double> w) {
    double sum = 0;
    for (double x : w) sum += x;
    for (double& x : w) x = sum > 0 ? x / sum : 1.0 / double(w.size());
    return w;
}
}  // namespace

std::string blend_segments_text(const std::vector<BlendSegment>& segments) {
    std::string out;
    char buf[40];
    for (const auto& s : segments) {
        out += std::to_string(s.start);
        for (double w : s.weights) {
            std::snprintf(buf, sizeof buf, " %.17g", w);
            out += buf;
        }
        out += '\n';
    }
    return out;
}

std::vector<BlendSegment> blend_segments_parse(const std::string& text) {
    std::vector<BlendSegment> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        std::istringstream l(line);
        BlendSegment s;
        if (!(l >> s.start)) return {};
        for (double w; l >> w;) s.weights.push_back(w);
        if (s.weights.empty() || (!out.empty() && (s.start <= out.back().start || s.weights.size() != out[0].weights.size())))
            return {};
        out.push_back(std::move(s));
    }
    if (!out.empty() && out[0].start != 0) return {};
    return out;
}

Blend::Blend(std::vector<double> weights) : Blend(std::vector<BlendSegment>{{0, normalised(std::move(weights))}}) {}

Blend::Blend(std::vector<BlendSegment> segments) : seg_(std::move(segments)) {
    for (auto& s : seg_) s.weights = normalised(s.weights);
    reset();
}

void Blend::reset() {
    at_ = 0;
    w_ = seg_[0].weights;
    c_.assign(w_.size(), 0);
    base_ = c_;
    n_ = 0;
}

int Blend::next() {
    if (at_ + 1 < seg_.size() && n_ == seg_[at_ + 1].start) {  // new weights: deficits from here
        w_ = seg_[++at_].weights;
        base_ = c_;
    }
    // The largest deficit w_i * (n - start + 1) - (c_i - c_i at start), ties to the first source.
    const double m = double(n_ - seg_[at_].start + 1);
    int best = 0;
    double best_d = -1e300;
    for (size_t i = 0; i < w_.size(); ++i) {
        const double d = w_[i] * m - double(c_[i] - base_[i]);
        if (d > best_d) best_d = d, best = int(i);
    }
    ++c_[size_t(best)];
    ++n_;
    return best;
}

namespace {
std::vector<double> blend_weights(const DataSet& d) {
    std::vector<double> w;
    for (const auto& s : d.train) w.push_back(s.weight >= 0 ? s.weight : double(s.len));
    return w;
}
}  // namespace

Sampler::Sampler(const DataSet& data, const DataConfig& dc, uint64_t seed)
    : data_(data), reader_(data), T_(dc.seq_len), order_(dc.order), seed_(seed),
      random_key_(stream_key(seed, "data.order.random")), shuffle_key_(stream_key(seed, "data.order.shuffle")),
      segments_{{0, normalised(blend_weights(data))}}, plan_blend_(segments_), count_blend_(segments_) {
    scratch_.resize(size_t(T_ + 1) * 4);
    val_scratch_.resize(size_t(T_ + 1) * 4);
    async_ = !data.any_hdf5_reads;
}

Sampler::~Sampler() {
    if (thread_.joinable()) {
        {
            std::lock_guard<std::mutex> lock(m_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
}

int64_t Sampler::offset_of(int src, int64_t k, int64_t s, int64_t j) const {
    const int64_t len = data_.train[size_t(src)].len;
    if (order_ == "sequential") return int64_t(uint64_t(k * int64_t(T_)) % uint64_t(len));
    if (order_ == "random") {
        Philox rng{random_key_};
        uint32_t w[4];
        rng.block(uint64_t(s), uint64_t(j), w);
        const uint64_t r = (uint64_t(w[0]) << 32) | w[1];
        return int64_t(r % uint64_t(len));
    }
    // shuffle: epoch e of the source's m whole samples
    const int64_t m = (len - 1) / T_;
    const int64_t e = k / m, p = k % m;
    Philox rng{shuffle_key_};
    uint32_t w[4];
    rng.block(uint64_t(e), uint64_t(src), w);
    const uint64_t key = (uint64_t(w[0]) << 32) | w[1];
    return int64_t(permute_index(uint64_t(p), uint64_t(m), key)) * T_;
}

// The refs of every sample of a step; two steps are kept (the one training, the one prefetched).
const std::vector<Sampler::Ref>& Sampler::step_refs(int64_t s, int64_t gb) {
    for (int i = 0; i < 2; ++i)
        if (plan_step_[i] == s && plan_gb_[i] == gb) return plan_[i];
    const int slot = plan_step_[0] <= plan_step_[1] ? 0 : 1;  // the older
    std::vector<Ref>& refs = plan_[slot];
    refs.resize(size_t(gb));
    const int64_t n0 = s * gb;
    if (data_.train.size() == 1) {
        for (int64_t j = 0; j < gb; ++j) refs[size_t(j)] = {0, offset_of(0, n0 + j, s, j)};
    } else {
        if (plan_blend_.position() > n0) plan_blend_.reset();
        while (plan_blend_.position() < n0) plan_blend_.next();
        for (int64_t j = 0; j < gb; ++j) {
            const int src = plan_blend_.next();
            const int64_t k = plan_blend_.counts()[size_t(src)] - 1;
            refs[size_t(j)] = {src, offset_of(src, k, s, j)};
        }
    }
    plan_step_[slot] = s;
    plan_gb_[slot] = gb;
    return refs;
}

Sampler::Ref Sampler::train_ref(int64_t s, int64_t j, int64_t gb) { return step_refs(s, gb)[size_t(j)]; }

void Sampler::set_blend(const std::vector<BlendSegment>& segments) {
    segments_ = segments;
    plan_blend_ = Blend(segments_);
    count_blend_ = Blend(segments_);
    plan_step_[0] = plan_step_[1] = -1;
}

std::vector<double> Sampler::deck_weights() const { return normalised(blend_weights(data_)); }

const std::vector<int64_t>& Sampler::source_samples(int64_t n) {
    if (data_.train.size() == 1) {
        one_source_[0] = n;
        return one_source_;
    }
    if (count_blend_.position() > n) count_blend_.reset();
    while (count_blend_.position() < n) count_blend_.next();
    return count_blend_.counts();
}

void Sampler::decode(const unsigned char* buf, int32_t* ids, int32_t* targets) const {
    if (reader_.width() == 2) {
        const uint16_t* t = reinterpret_cast<const uint16_t*>(buf);
        for (int k = 0; k < T_; ++k) ids[k] = int32_t(t[k]), targets[k] = int32_t(t[k + 1]);
    } else {
        const uint32_t* t = reinterpret_cast<const uint32_t*>(buf);
        for (int k = 0; k < T_; ++k) ids[k] = int32_t(t[k]), targets[k] = int32_t(t[k + 1]);
    }
}

void Sampler::train_sample(int64_t s, int64_t j, int64_t gb, int32_t* ids, int32_t* targets) {
    if (hi_ > lo_ && gb == gb_ && j >= lo_ && j < hi_) {
        const Slot& slot = ready_slot(s);
        decode(slot.tokens.data() + size_t(j - lo_) * size_t(T_ + 1) * size_t(reader_.width()), ids, targets);
        return;
    }
    const double t0 = now_s();
    {
        trace::Wait timeline(trace::Track::data, "read sample");
        const Ref r = train_ref(s, j, gb);
        reader_.read(data_.train[size_t(r.source)], r.offset, T_ + 1, scratch_.data(), reader_.width());
    }
    wait_s_ += now_s() - t0;
    decode(scratch_.data(), ids, targets);
}

// ----------------------------------------------------------------------------------------------
// Prefetch: slot s % 2 holds step s. The main thread plans (the blend is not thread-safe) and
// the worker only reads.

void Sampler::prefetch_range(int64_t lo, int64_t hi, int64_t gb) {
    lo_ = lo, hi_ = hi, gb_ = gb;
    const size_t bytes = size_t(hi - lo) * size_t(T_ + 1) * size_t(reader_.width());
    for (Slot& sl : slots_) {
        sl.tokens.assign(bytes, 0);
        sl.refs.reserve(size_t(hi - lo));
    }
    buffer_bytes_ = 2 * bytes;
    if (async_ && !thread_.joinable()) thread_ = std::thread([this] { worker(); });
}

void Sampler::fill(Slot& slot) {
    try {
        const size_t sample = size_t(T_ + 1) * size_t(reader_.width());
        for (size_t i = 0; i < slot.refs.size(); ++i)
            reader_.read(data_.train[size_t(slot.refs[i].source)], slot.refs[i].offset, T_ + 1,
                         slot.tokens.data() + i * sample, reader_.width());
    } catch (...) {
        slot.error = std::current_exception();
    }
}

void Sampler::worker() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
        cv_.wait(lock, [&] { return stop_ || pending_ >= 0; });
        if (stop_) return;
        Slot& slot = slots_[pending_];
        lock.unlock();
        fill(slot);
        lock.lock();
        slot.ready = true;
        pending_ = -1;
        cv_.notify_all();
    }
}

void Sampler::submit(int64_t s) {
    const int i = int(s & 1);
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return pending_ < 0; });  // the worker is idle
    Slot& slot = slots_[i];
    const std::vector<Ref>& refs = step_refs(s, gb_);
    slot.refs.assign(refs.begin() + lo_, refs.begin() + hi_);
    slot.step = s;
    slot.ready = false;
    slot.error = nullptr;
    if (!async_) {
        lock.unlock();
        fill(slot);
        slot.ready = true;
        return;
    }
    pending_ = i;
    cv_.notify_all();
}

Sampler::Slot& Sampler::ready_slot(int64_t s) {
    Slot& slot = slots_[s & 1];
    const double t0 = now_s();
    {
        std::unique_lock<std::mutex> lock(m_);
        if (slot.step != s || !slot.ready) {  // waits only when the prefetch is not done (an event then)
            lock.unlock();
            trace::Wait timeline(trace::Track::data, "wait for the prefetch");
            if (slot.step != s) submit(s);
            lock.lock();
            cv_.wait(lock, [&] { return slot.ready; });
        }
    }
    wait_s_ += now_s() - t0;
    if (slot.error) std::rethrow_exception(slot.error);
    // Step s + 1 is read while step s trains (the HDF5 fallback reads it when it is asked for).
    if (async_ && slots_[(s + 1) & 1].step != s + 1) submit(s + 1);
    return slot;
}

// ----------------------------------------------------------------------------------------------

int64_t Sampler::val_batches(int v, int mbs, int64_t batches) const {
    if (batches > 0) return batches;
    return (data_.val[size_t(v)].len - 1) / T_ / mbs;
}

void Sampler::val_sample(int v, int64_t i, int64_t j, int mbs, int32_t* ids, int32_t* targets) const {
    const Source& src = data_.val[size_t(v)];
    const int64_t o = int64_t(uint64_t((i * mbs + j) * int64_t(T_)) % uint64_t(src.len));
    reader_.read(src, o, T_ + 1, val_scratch_.data(), reader_.width());
    decode(val_scratch_.data(), ids, targets);
}

}  // namespace quintet
