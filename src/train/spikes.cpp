#include "quintet/train/spikes.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

#include "quintet/core/error.hpp"

namespace quintet {

SpikeWindow::SpikeWindow(int capacity)
    : capacity_(std::max(capacity, 1)), loss_(size_t(capacity_)), norm_(size_t(capacity_)) {}

void SpikeWindow::push(double loss, double grad_norm) {
    loss_[next_] = loss;
    norm_[next_] = grad_norm;
    next_ = (next_ + 1) % size_t(capacity_);
    n_ = std::min(n_ + 1, size_t(capacity_));
}

namespace {
// Mean and population std of the ring's n values, oldest first (the order a resumed window has:
// the same sums, bit for bit).
void moments(const std::vector<double>& ring, size_t next, size_t n, double* mean, double* std) {
    const size_t cap = ring.size(), first = (next + cap - n) % cap;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += ring[(first + i) % cap];
    *mean = sum / double(n);
    double sq = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = ring[(first + i) % cap] - *mean;
        sq += d * d;
    }
    *std = std::sqrt(sq / double(n));
}
}  // namespace

SpikeWindow::Limits SpikeWindow::limits(double sigma) const {
    Limits l;
    if (!full()) {
        l.loss = l.grad_norm = std::numeric_limits<double>::quiet_NaN();
        return l;
    }
    moments(loss_, next_, n_, &l.loss_mean, &l.loss_std);
    moments(norm_, next_, n_, &l.norm_mean, &l.norm_std);
    l.loss = l.loss_mean + sigma * l.loss_std;
    l.grad_norm = l.norm_mean + sigma * l.norm_std;
    return l;
}

std::vector<double> SpikeWindow::rows() const {
    std::vector<double> r;
    r.reserve(2 * n_);
    const size_t cap = size_t(capacity_), first = (next_ + cap - n_) % cap;
    for (size_t i = 0; i < n_; ++i) r.insert(r.end(), {loss_[(first + i) % cap], norm_[(first + i) % cap]});
    return r;
}

void SpikeWindow::restore(const std::vector<double>& rows) {
    next_ = n_ = 0;
    const size_t n = rows.size() / 2, from = n > size_t(capacity_) ? n - size_t(capacity_) : 0;
    for (size_t i = from; i < n; ++i) push(rows[2 * i], rows[2 * i + 1]);
}

SpikePolicy::SpikePolicy(const TrainConfig& train, std::string run_dir, int rank, SkipBudget& skips,
                         std::function<void(const std::string&)> log)
    : t_(train), run_dir_(std::move(run_dir)), rank_(rank), skips_(skips), log_(std::move(log)),
      window_(train.spike_window) {}

void SpikePolicy::check(double loss, double grad_norm, StepStats& st) const {
    st.checked_loss = loss;
    st.checked_grad_norm = grad_norm;
    const SpikeWindow::Limits l = window_.limits(t_.spike_sigma);
    st.spike_loss_limit = l.loss;
    st.spike_grad_norm_limit = l.grad_norm;
    if (!window_.full()) return;
    const bool over_loss = loss > l.loss, over_norm = grad_norm > l.grad_norm;
    st.over_limit = over_loss || over_norm;
    st.spike = st.over_limit && acts();
    if (!st.over_limit) return;
    char b[512];
    auto part = [&](const char* what, double v, double limit, double mean, double std) {
        std::snprintf(b, sizeof b, "%s %.6g is above its limit %.6g (mean %.6g + %g x std %.4g of the last %zu accepted steps)",
                      what, v, limit, mean, t_.spike_sigma, std, window_.size());
        return std::string(b);
    };
    st.what = over_norm ? part("the gradient norm", grad_norm, l.grad_norm, l.norm_mean, l.norm_std) : "";
    if (over_loss)
        st.what += (st.what.empty() ? "" : ", and ") + part("the loss", loss, l.loss, l.loss_mean, l.loss_std);
}

StepStats SpikePolicy::skip(int64_t s, const StepStats& st, const std::string& why, const std::string& last_checkpoint,
                            bool* skipped) {
    const std::string msg = "step " + std::to_string(s + 1) + ": " + why;
    if (skips_.exhausted()) {
        if (rank_ == 0) write_fault_file(run_dir_, "diverged", s + 1, -1, msg);
        throw DivergedError(msg + "; " + std::to_string(t_.max_skips) +
                            " steps in a row rejected (train.max_skips, non-finite steps and spikes together). No "
                            "update was applied and no checkpoint written; the last good one is " +
                            (last_checkpoint.empty() ? "none" : last_checkpoint) + " (train.on_spike = " + t_.on_spike + ")");
    }
    skips_.skipped();
    log_("warning: " + msg + ": a loss spike; the update is skipped (train.on_spike = " + t_.on_spike + ", " +
         std::to_string(skips_.in_row()) + " in a row of at most " + std::to_string(t_.max_skips) + ")");
    *skipped = true;
    return st;
}

StepStats SpikePolicy::handle(int64_t s, const StepStats& first, const std::function<StepStats()>& rerun,
                              const std::string& last_checkpoint, bool* skipped) {
    *skipped = false;
    if (t_.on_spike != "rerun") return skip(s, first, first.what, last_checkpoint, skipped);
    log_("warning: step " + std::to_string(s + 1) + ": " + first.what +
         ": a loss spike; the step is re-run once from the same state (train.on_spike = rerun)");
    StepStats again = rerun();
    if (again.nonfinite) return again;  // the non-finite policy's case now
    if (!again.spike) {
        char b[256];
        std::snprintf(b, sizeof b, "loss %.6g, gradient norm %.6g", again.checked_loss, again.checked_grad_norm);
        log_("warning: step " + std::to_string(s + 1) + ": the rerun is within the limits (" + b +
             "): a transient fault (suspect this job's hardware); continuing with the rerun");
        if (rank_ == 0)
            write_fault_file(run_dir_, "transient_spike", s + 1, -1, first.what + "; the rerun was within the limits");
        return again;
    }
    return skip(s, again, again.what + ", also when the step is re-run from the same state", last_checkpoint, skipped);
}

}  // namespace quintet
