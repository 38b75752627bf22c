#include "quintet/core/profile.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/core/trace.hpp"
#include "quintet/parallel/pipeline_executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

namespace quintet {

namespace {
constexpr int kTagFwd = 0, kTagBwd = 1;
}  // namespace

PipelineExecutor::PipelineExecutor(std::vector<PipelineStage*> chunks, Backend& be,
                                   const Communicator& pp_comm, int stage, int virtual_stages,
                                   std::vector<Action> actions, int microbatches, int B, int T,
                                   Placement placement)
    : chunks_(std::move(chunks)), be_(be), comm_(pp_comm), pp_(pp_comm.size()), stage_(stage),
      v_(virtual_stages), m_(microbatches), B_(B), T_(T), actions_(std::move(actions)), placement_(placement) {
    recv_stage_ = be_.alloc(chunks_[0]->boundary_floats());
    const int locals = self_messages_in_flight(actions_, pp_, v_, stage_, placement_);
    for (int i = 0; i < locals; ++i) local_.push_back(be_.alloc(chunks_[0]->boundary_floats()));
    local_free_.reserve(local_.size());
    for (auto& q : local_queue_) q.reserve(local_.size());
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

PipelineExecutor::~PipelineExecutor() {
    be_.release(recv_stage_);
    for (float* p : local_) be_.release(p);
}

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
    local_free_.assign(local_.begin(), local_.end());
    for (auto& q : local_queue_) q.clear();
    char what[96];
    auto is_recv = [](Op op) { return op == Op::recv_fwd || op == Op::recv_bwd; };
    int posted = -1;
    auto post_next = [&](size_t from) {  // the next receive from another stage
        for (size_t k = from; k < actions_.size(); ++k) {
            const Action& a = actions_[k];
            if (!is_recv(a.op) || to_self(a)) continue;
            posted = comm_.irecv(recv_stage_, chunks_[size_t(a.chunk)]->boundary_floats(),
                                 schedule_peer(pp_, v_, stage_, a, placement_).stage,
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
        const int vs = virtual_stage(pp_, stage_, a.chunk, placement_);
        switch (a.op) {
        case Op::recv_fwd:
        case Op::recv_bwd: {
            const bool fwd = a.op == Op::recv_fwd;
            if (fwd) slot = acquire_slot(a.chunk);
            if (to_self(a)) {  // sent by this stage's other chunk earlier: the oldest local message
                auto& q = local_queue_[fwd ? 0 : 1];
                be_.copy(fwd ? chunk.input(slot) : chunk.grad_output(slot), q.front(), n);
                local_free_.push_back(q.front());
                q.erase(q.begin());
                break;
            }
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
            trace::Span span(trace::Track::compute, "forward", a.microbatch, a.chunk);
            res.ce_sum += chunk.forward(slot, params, ids_.data(), tgt_.data(), grad_scale, true);
            res.aux_sum += chunk.aux_loss(slot);
            res.mtp_sum += chunk.mtp_loss(slot);
            break;
        }
        case Op::send_fwd:
        case Op::send_bwd: {
            const bool fwd = a.op == Op::send_fwd;
            const float* out = fwd ? chunk.output(slot) : chunk.grad_input(slot);
            if (to_self(a)) {  // staged locally until this stage's other chunk receives it
                if (local_free_.empty()) throw std::logic_error("pipeline executor: no local staging buffer left");
                float* buf = local_free_.back();
                local_free_.pop_back();
                be_.copy(buf, out, n);
                local_queue_[fwd ? 0 : 1].push_back(buf);
                break;
            }
            pending_[size_t(a.chunk)][size_t(slot)].push_back(
                comm_.isend(out, n, schedule_peer(pp_, v_, stage_, a, placement_).stage, fwd ? kTagFwd : kTagBwd));
            break;
        }
        case Op::backward:
        case Op::backward_weight: {
            // The chunk's last backward (or W) of the step finalises its gradients: the hook may
            // start their data-parallel reduction while the backward goes on.
            trace::Span span(trace::Track::compute, a.op == Op::backward ? "backward" : "backward W", a.microbatch,
                             a.chunk);
            if (a.op == Op::backward)
                chunk.backward(slot, params, grads, --backwards_left_[size_t(a.chunk)] == 0 ? last_hook : nullptr);
            else
                chunk.backward_weight(slot, params, grads,
                                      --backwards_left_[size_t(a.chunk)] == 0 ? last_hook : nullptr);
            free_slots_[size_t(a.chunk)].push_back(slot);  // reused only after its sends complete
            --in_flight_[size_t(a.chunk)];
            break;
        }
        case Op::backward_input: {  // the slot stays: W reads it later
            trace::Span span(trace::Track::compute, "backward B", a.microbatch, a.chunk);
            chunk.backward_input(slot, params);
            break;
        }
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
    for (int c = 0; c < v_; ++c)
        if (chunks_[size_t(c)]->slots() == 0) chunks_[size_t(c)]->add_slot();
    for (int vs = 0; vs < pp_ * v_; ++vs) {
        int c = -1;
        for (int k = 0; k < v_; ++k)
            if (virtual_stage(pp_, stage_, k, placement_) == vs) c = k;
        if (c < 0) continue;
        PipelineStage& chunk = *chunks_[size_t(c)];
        if (vs > 0) {
            const SchedulePeer from = schedule_peer(pp_, v_, stage_, {Op::recv_fwd, 0, c}, placement_);
            if (from.stage == stage_)  // the V's turn: this stage's own other chunk
                be_.copy(chunk.input(0), chunks_[size_t(from.chunk)]->output(0), chunk.boundary_floats());
            else
                comm_.recv(chunk.input(0), chunk.boundary_floats(), from.stage, kTagFwd, "evaluation: recv_fwd");
        }
        sum += chunk.forward(0, params, ids, targets, 1.0f, false);
        if (vs < pp_ * v_ - 1) {
            const SchedulePeer to = schedule_peer(pp_, v_, stage_, {Op::send_fwd, 0, c}, placement_);
            if (to.stage != stage_) comm_.send(chunk.output(0), chunk.boundary_floats(), to.stage, kTagFwd);
        }
    }
    return sum;
}

size_t PipelineExecutor::buffer_bytes() const {
    return (1 + local_.size()) * chunks_[0]->boundary_floats() * sizeof(float);
}

size_t PipelineExecutor::activation_bytes() const {
    size_t b = 0;
    for (size_t c = 0; c < chunks_.size(); ++c)
        b += size_t(peak_in_flight_[c]) * chunks_[c]->slot_bytes() + chunks_[c]->workspace_bytes();
    return b;
}

}  // namespace quintet
