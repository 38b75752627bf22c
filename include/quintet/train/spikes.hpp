// Loss spikes (train.on_spike = none | skip | rerun, docs/reliability.md "Loss spikes"): a step
// whose loss or pre-clip gradient norm is above mean + train.spike_sigma x std of the same
// quantity over the last train.spike_window accepted steps (population std, two passes, oldest
// first), once the window is full, is handled like a non-finite one: its update is not applied
// (skip), or it is run once more from the same state to tell a transient fault from the data
// (rerun: within the limits now, the rerun's result is kept; a spike again, it is skipped).
// Skips count against train.max_skips with the non-finite ones. Every rank decides from the same
// values -- world rank 0's loss and norm, broadcast -- so the replicas never diverge, whatever
// the layout. The window is checkpointed (/train_state/spike_window) so a resumed run decides as
// the unbroken one would.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quintet/deck/train_config.hpp"
#include "quintet/train/faults.hpp"
#include "quintet/train/step_stats.hpp"

namespace quintet {

// The last `capacity` accepted steps' loss and gradient norm.
class SpikeWindow {
public:
    explicit SpikeWindow(int capacity);
    void push(double loss, double grad_norm);
    bool full() const { return n_ == size_t(capacity_); }
    size_t size() const { return n_; }
    // mean + sigma x std of each column, oldest value first; NaN until the window is full.
    struct Limits {
        double loss = 0, grad_norm = 0;                      // the limits
        double loss_mean = 0, loss_std = 0, norm_mean = 0, norm_std = 0;
    };
    Limits limits(double sigma) const;
    std::vector<double> rows() const;            // [n][2] row-major, oldest first
    void restore(const std::vector<double>& rows);  // the newest `capacity` rows of [n][2]

private:
    int capacity_;
    std::vector<double> loss_, norm_;  // rings
    size_t next_ = 0, n_ = 0;
};

class SpikePolicy {
public:
    SpikePolicy(const TrainConfig& train, std::string run_dir, int rank, SkipBudget& skips,
                std::function<void(const std::string&)> log);
    bool acts() const { return t_.on_spike != "none"; }
    // Inside a step, before its update: (loss, grad_norm) -- the same on every rank -- against
    // the window. Sets st.spike_loss_limit, st.spike_grad_norm_limit, st.over_limit (also under
    // none, for the metrics) and st.spike (the update must not be applied: skip or rerun), with
    // st.what saying which value was above its limit.
    void check(double loss, double grad_norm, StepStats& st) const;
    // `first` came back a spike from step s (0-based): skip it, or (rerun) run it again first.
    // Returns the stats to record and sets *skipped; a rerun that is not finite is returned as it
    // is (the non-finite policy takes it). Throws DivergedError after train.max_skips rejected
    // steps in a row.
    StepStats handle(int64_t s, const StepStats& first, const std::function<StepStats()>& rerun,
                     const std::string& last_checkpoint, bool* skipped);
    // An accepted step: its values join the window.
    void accept(const StepStats& st) { window_.push(st.checked_loss, st.checked_grad_norm); }
    std::vector<double> window() const { return window_.rows(); }
    void restore(const std::vector<double>& rows) { window_.restore(rows); }
    size_t window_size() const { return window_.size(); }

private:
    StepStats skip(int64_t s, const StepStats& st, const std::string& why, const std::string& last_checkpoint,
                   bool* skipped);
    const TrainConfig& t_;
    std::string run_dir_;
    int rank_;
    SkipBudget& skips_;
    std::function<void(const std::string&)> log_;
    SpikeWindow window_;
};

}  // namespace quintet
