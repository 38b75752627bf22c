// What one optimizer step reports: the numbers Trainer::step produces and the telemetry, the
// non-finite policy and the tests read.
#pragma once
#include <array>
#include <limits>

#include "quintet/model/probe.hpp"
#include <string>

#include "quintet/comm/comm_counters.hpp"

namespace quintet {

struct StepStats {
    double loss = 0, ce_loss = 0, aux_loss = 0, mtp_loss = 0, lr = 0, grad_norm = 0, step_time = 0;
    // Seconds: the pipeline schedule (forward and backward of this replica's microbatches), of
    // which blocked in pipeline receives; the replica-group sums after it (tp/kv/tied partials,
    // then the data-parallel reduction); the optimizer.
    double t_pipeline = 0, t_wait = 0, t_sync = 0, t_dp = 0, t_optim = 0;
    double dp_early = 0;  // DP buckets whose reduction started during the backward
    // Seconds of the step this rank was blocked: in communication (every communicator's waits),
    // on its data. The rest of step_time is its compute (/ranks/*, the straggler report).
    double comm_wait = 0, data_wait = 0;
    // This rank's communication per axis (expert parallelism: the dispatch and the combine).
    CommCounters tp, cp, ep_dispatch, ep_combine;
    // The expert exchange of every rank: bytes measured, and from the routed counts (docs/math.md §9).
    double ep_bytes_all = 0, ep_bytes_theory = 0;
    // A non-finite loss or gradient norm: the update was not applied. `what` names it; with
    // step(s, true) `origin` names the first rank and tensor where it appeared.
    std::array<double, kNumProbeKinds> probe_rms{};  // train.probe_rms: each kind's RMS over the step (all ranks)
    bool nonfinite = false;
    std::string what, origin;
    // The spike policy (train/spikes): the loss and gradient norm every rank judged (world rank
    // 0's), the limits in force (NaN while the window fills), whether a value was above its limit
    // (over_limit, also under on_spike = none) and whether the update was therefore not applied
    // (spike; `what` says which value).
    double checked_loss = 0, checked_grad_norm = 0;
    double spike_loss_limit = std::numeric_limits<double>::quiet_NaN();
    double spike_grad_norm_limit = std::numeric_limits<double>::quiet_NaN();
    bool over_limit = false, spike = false;
};

}  // namespace quintet
