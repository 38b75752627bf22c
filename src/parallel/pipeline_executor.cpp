#include "quintet/core/profile.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/parallel/pipeline_executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace quintet {

namespace {
constexpr int kTagFwd = 0, kTagBwd = 1;
}  // namespace

PipelineExecutor::PipelineExecutor(std::vector<PipelineStage*> chunks, Backend& be,
                                   const Communicator& pp_comm, int stage, int virtual_stages,
                                   std::vector<Action> actions, int microbatches, int B, int T)
    : chunks_(std::move(chunks)), be_(be), comm_(pp_comm), pp_(pp_comm.size()), stage_(stage),
      v_(virtual_stages), m_(microbatches), B_(B), T_(T), actions_(std::move(actions)) {
    recv_stage_ = be_.alloc(chunks_[0]->boundary_floats());
    const int nc = int(chunks_.size());
    free_slots_.assign(size_t(nc), {});
    slot_of_mb_.assign(size_t(nc), std::vector<int>(size_t(m_), -1));
    pending_.assign(size_t(nc), {});
    in_flight_.assign(size_t(nc), 0);
    peak_in_flight_.assign(size_t(nc), 0);
    backwards_left_.assign(size_t(nc), 0);
    ids_.resize(size_t(B) * T);
    tgt_.resize(ids_.size());
}

PipelineExecutor::~PipelineExecutor() { be_.release(recv_stage_); }

int PipelineExecutor::acquire_slot(int c) {
    // A free slot whose sends have completed; waiting for one that has not could deadlock (its
    // receiver may post the matching recv only later in its schedule), so then take a new slot.
    auto sends_done = [&](int slot) {
        auto& hs = pending_[size_t(c)][size_t(slot)];
        hs.erase(std::remove_if(hs.begin(), hs.end(), [&](int h) { return comm_.test(h); }), hs.end());
        return hs.empty();
    };
    int slot = -1;
    auto& free = free_slots_[size_t(c)];
    for (size_t i = 0; i < free.size(); ++i)
        if (sends_done(free[i])) {
            slot = free[i];
            free.erase(free.begin() + long(i));
            break;
        }
    if (slot < 0) {
        slot = chunks_[size_t(c)]->add_slot();  // only until the schedule's steady state is reached
        pending_[size_t(c)].emplace_back();
    }
    peak_in_flight_[size_t(c)] = std::max(peak_in_flight_[size_t(c)], ++in_flight_[size_t(c)]);
    return slot;
}

PipelineExecutor::Result PipelineExecutor::run(const float* params, float* grads, float grad_scale,
                                               const Data& data, GradReadyHook* last_hook) {
    Result res;
    for (auto& slots : slot_of_mb_) std::fill(slots.begin(), slots.end(), -1);
    std::fill(backwards_left_.begin(), backwards_left_.end(), m_);
    char what[96];
    auto is_recv = [](Op op) { return op == Op::recv_fwd || op == Op::recv_bwd; };
    int posted = -1;
    auto post_next = [&](size_t from) {
        for (size_t k = from; k < actions_.size(); ++k) {
            const Action& a = actions_[k];
            if (!is_recv(a.op)) continue;
            posted = comm_.irecv(recv_stage_, chunks_[size_t(a.chunk)]->boundary_floats(),
                                 schedule_peer(pp_, v_, stage_, a).stage,
                                 a.op == Op::recv_fwd ? kTagFwd : kTagBwd);
            return;
        }
    };
    post_next(0);
    for (size_t k = 0; k < actions_.size(); ++k) {
        const Action& a = actions_[k];
        PipelineStage& chunk = *chunks_[size_t(a.chunk)];
        int& slot = slot_of_mb_[size_t(a.chunk)][size_t(a.microbatch)];
        const size_t n = chunk.boundary_floats();
        const int vs = virtual_stage(pp_, stage_, a.chunk);
        switch (a.op) {
        case Op::recv_fwd:
        case Op::recv_bwd: {
            const bool fwd = a.op == Op::recv_fwd;
            if (fwd) slot = acquire_slot(a.chunk);
            std::snprintf(what, sizeof what, "pipeline stage %d: %s mb %d (virtual stage %d)", stage_,
                          fwd ? "recv_fwd" : "recv_bwd", a.microbatch, vs);
            double t0 = now_s();
            {
                QUINTET_PROFILE("comm.pp");
                comm_.wait_recv(posted, what);
            }
            res.t_wait += now_s() - t0;
            be_.copy(fwd ? chunk.input(slot) : chunk.grad_output(slot), recv_stage_, n);
            post_next(k + 1);
            break;
        }
        case Op::forward: {
            if (slot < 0) slot = acquire_slot(a.chunk);
            if (chunk.needs_tokens()) data(a.microbatch, ids_.data(), tgt_.data());
            res.ce_sum += chunk.forward(slot, params, ids_.data(), tgt_.data(), grad_scale, true);
            res.aux_sum += chunk.aux_loss(slot);
            break;
        }
        case Op::send_fwd:
            pending_[size_t(a.chunk)][size_t(slot)].push_back(
                comm_.isend(chunk.output(slot), n, schedule_peer(pp_, v_, stage_, a).stage, kTagFwd));
            break;
        case Op::backward:
            // The chunk's last backward of the step finalises its gradients: the hook may start
            // their data-parallel reduction while the backward goes on.
            chunk.backward(slot, params, grads, --backwards_left_[size_t(a.chunk)] == 0 ? last_hook : nullptr);
            free_slots_[size_t(a.chunk)].push_back(slot);  // reused only after its sends complete
            --in_flight_[size_t(a.chunk)];
            break;
        case Op::send_bwd:
            pending_[size_t(a.chunk)][size_t(slot)].push_back(
                comm_.isend(chunk.grad_input(slot), n, schedule_peer(pp_, v_, stage_, a).stage, kTagBwd));
            break;
        }
    }
    for (auto& per_chunk : pending_)
        for (auto& handles : per_chunk) {
            for (int h : handles) comm_.wait(h);
            handles.clear();
        }
    return res;
}

double PipelineExecutor::forward_only(const float* params, const int32_t* ids, const int32_t* targets) {
    double sum = 0.0;
    for (int vs = 0; vs < pp_ * v_; ++vs) {
        if (vs % pp_ != stage_) continue;
        PipelineStage& chunk = *chunks_[size_t(vs / pp_)];
        if (chunk.slots() == 0) chunk.add_slot();
        if (vs > 0)
            comm_.recv(chunk.input(0), chunk.boundary_floats(), (stage_ - 1 + pp_) % pp_, kTagFwd,
                       "evaluation: recv_fwd");
        sum += chunk.forward(0, params, ids, targets, 1.0f, false);
        if (vs < pp_ * v_ - 1)
            comm_.send(chunk.output(0), chunk.boundary_floats(), (stage_ + 1) % pp_, kTagFwd);
    }
    return sum;
}

size_t PipelineExecutor::buffer_bytes() const { return chunks_[0]->boundary_floats() * sizeof(float); }

size_t PipelineExecutor::activation_bytes() const {
    size_t b = 0;
    for (size_t c = 0; c < chunks_.size(); ++c)
        b += size_t(peak_in_flight_[c]) * chunks_[c]->slot_bytes() + chunks_[c]->workspace_bytes();
    return b;
}

}  // namespace quintet
