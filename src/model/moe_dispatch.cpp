#include "quintet/model/moe_dispatch.hpp"

#include <algorithm>
#include <cmath>

namespace quintet {

MoeDispatcher::MoeDispatcher(Backend& be, ExpertParallel* ep, const MoeConfig& moe, int rows, int C)
    : be_(be), ep_(ep), E_(moe.experts), k_(moe.top_k), rows_(rows), C_(C), capacity_(moe.capacity_factor) {
    const size_t R = size_t(rows) * k_;
    host_expert_.resize(R);
    host_slot_.resize(R);
    host_src_.resize(R);
    host_weight_.resize(R);
    next_.resize(size_t(E_));
    if (capacity_ > 0) order_.reserve(R);
}

int MoeDispatcher::expert_rows(const MoeConfig& moe, int rows, int ep) {
    const int El = moe.experts / ep;
    return ep > 1 ? ep * rows * std::min(moe.top_k, El) : rows * moe.top_k;
}

void MoeDispatcher::plan(MoeRouting& r) {
    const int Nr = rows_, R = Nr * k_;
    // The counting sort of the choices by expert (host): counts, offsets, each choice's sorted
    // row (slot) and each sorted row's token (src). Stable: within an expert, token order, then j.
    be_.to_host_i32(host_expert_.data(), r.expert, size_t(R));
    std::fill(r.routed.begin(), r.routed.end(), 0);
    for (int i = 0; i < R; ++i) ++r.routed[size_t(host_expert_[size_t(i)])];
    r.count = r.routed;
    int dropped = 0;
    if (capacity_ > 0) {
        const int cap = int(std::ceil(capacity_ * double(k_) * double(Nr) / double(E_)));
        bool over = false;
        for (int e = 0; e < E_; ++e) over = over || r.count[size_t(e)] > cap;
        if (over) {
            be_.to_host(host_weight_.data(), r.weight, size_t(R));
            for (int e = 0; e < E_; ++e) {
                if (r.count[size_t(e)] <= cap) continue;
                order_.clear();
                for (int i = 0; i < R; ++i)
                    if (host_expert_[size_t(i)] == e) order_.push_back(i);
                // Keep the cap heaviest (ties: the earlier choice); mark the rest with -1.
                std::sort(order_.begin(), order_.end(), [&](int a, int b) {
                    const float wa = host_weight_[size_t(a)], wb = host_weight_[size_t(b)];
                    return wa > wb || (wa == wb && a < b);
                });
                for (size_t q = size_t(cap); q < order_.size(); ++q) host_expert_[size_t(order_[q])] = -1;
                dropped += r.count[size_t(e)] - cap;
                r.count[size_t(e)] = cap;
            }
        }
    }
    int at = 0;
    for (int e = 0; e < E_; ++e) {
        r.offset[size_t(e)] = at;
        at += r.count[size_t(e)];
    }
    r.kept = at;
    r.dropped = dropped;
    std::copy(r.offset.begin(), r.offset.end(), next_.begin());
    for (int i = 0; i < R; ++i) {
        const int e = host_expert_[size_t(i)];
        if (e < 0) {
            host_slot_[size_t(i)] = R;
            continue;
        }
        const int row = next_[size_t(e)]++;
        host_slot_[size_t(i)] = row;
        host_src_[size_t(row)] = i / k_;
    }
    be_.from_host_i32(r.slot, host_slot_.data(), size_t(R));
    be_.from_host_i32(r.src, host_src_.data(), size_t(r.kept));
}

void MoeDispatcher::sort_rows(const MoeRouting& r, const float* x, float* sorted) const {
    be_.gather_rows(sorted, x, r.src, r.kept, C_);
}

void MoeDispatcher::send(ExpertExchange& x, const MoeRouting& r, const float* sorted) const {
    ep_->plan(x, r.count.data());
    ep_->dispatch_start(x, sorted);
}

int MoeDispatcher::receive(ExpertExchange& x, float* expert_major) const {
    ep_->dispatch_finish(x, expert_major);
    return x.rows;
}

void MoeDispatcher::send_back(ExpertExchange& x, const float* expert_major, float* sorted) const {
    ep_->combine(x, expert_major, sorted);
}

void MoeDispatcher::combine(float* out, const float* y_sorted, const MoeRouting& r, const float* weight) const {
    be_.moe_combine(out, y_sorted, r.slot, weight, rows_, k_, C_);
}

void MoeDispatcher::combine_backward(float* dy_sorted, float* dweight, const float* dout, const float* y_sorted,
                                     const MoeRouting& r) const {
    be_.moe_combine_backward(dy_sorted, dweight, dout, y_sorted, r.slot, r.weight, rows_, k_, C_);
}

}  // namespace quintet
