// The MoE token dispatcher (docs/math.md §9), the stage between the router and the experts:
// the choices sorted by expert -- a counting sort, stable in token order, with
// moe.capacity_factor's drops -- the rows gathered in that order, sent to their experts' ranks
// under expert parallelism (parallel/expert_parallel) and back, and summed back per token with
// their weights. The sort is host work with no collective call (tested on its own).
#pragma once
#include <cstdint>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/config.hpp"
#include "quintet/model/moe_router.hpp"
#include "quintet/parallel/expert_parallel.hpp"

namespace quintet {

class MoeDispatcher {
public:
    // rows: token rows routed per microbatch on this rank (Nr); C: the row width.
    MoeDispatcher(Backend& be, ExpertParallel* ep, const MoeConfig& moe, int rows, int C);
    // The most rows this rank's experts may be handed: its own rows' k choices, or under ep the
    // dropless worst case, every rank sending min(k, E/ep) rows per token.
    static int expert_rows(const MoeConfig& moe, int rows, int ep);
    ExpertParallel* ep() const { return ep_; }

    // The counting sort of r's choices by expert: r.count, r.offset, r.slot (the sorted row of
    // each choice; R = rows*k for a dropped one), r.src (the token of each sorted row), r.kept.
    // Over ceil(cf * k * rows / E) per expert (moe.capacity_factor > 0), the choices with the
    // lowest weights are dropped (ties: the later choice).
    void plan(MoeRouting& r);
    // sorted[kept, C] = the rows of x[rows, C] in the sorted order.
    void sort_rows(const MoeRouting& r, const float* x, float* sorted) const;
    // Expert parallelism: the counts exchanged and the sorted rows started towards their
    // experts' ranks (sorted stays untouched until receive); the rows this rank's experts got,
    // expert-major, into expert_major [x.rows, C]; back to the rows' home ranks. collective over ep
    void send(ExpertExchange& x, const MoeRouting& r, const float* sorted) const;
    int receive(ExpertExchange& x, float* expert_major) const;
    void send_back(ExpertExchange& x, const float* expert_major, float* sorted) const;
    void progress() const {
        if (ep_) ep_->progress();
    }
    // out[rows, C] += sum over each token's k choices of weight * y_sorted[slot] (weight null: 1),
    // the choices summed in order.
    void combine(float* out, const float* y_sorted, const MoeRouting& r, const float* weight) const;
    // Its backward: dy_sorted and dweight from dout.
    void combine_backward(float* dy_sorted, float* dweight, const float* dout, const float* y_sorted,
                          const MoeRouting& r) const;

private:
    Backend& be_;
    ExpertParallel* ep_;
    const int E_, k_, rows_, C_;
    const double capacity_;
    std::vector<int32_t> host_expert_, host_slot_, host_src_;
    std::vector<float> host_weight_;
    std::vector<int> next_, order_;
};

}  // namespace quintet
