// What a training run reports about itself (docs/formats.md "Metrics", docs/planner.md): MFU's
// denominators, the memory of every rank by category, the pipeline's idle time, the MoE figures
// and the per-operation profile, written to metrics.h5 every step; the progress line; at the end
// the profile table, the planner's prediction beside the measurement and the pipeline summary.
// Everything goes in as a StepStats and the model's own accounting; nothing here changes the run.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "quintet/data/dataset.hpp"
#include "quintet/io/metrics.hpp"
#include "quintet/model/moe_counts.hpp"
#include "quintet/perf/planner.hpp"
#include "quintet/train/rank_model.hpp"
#include "quintet/train/step_stats.hpp"
#include "quintet/train/stragglers.hpp"

namespace quintet {

class Telemetry {
public:
    // Measures MFU's denominators: the FMA peak of the job's cores (or train.peak_tflops) and
    // the sgemm rate of all ranks at once. collective over the world
    Telemetry(RankModel& model, std::string deck_text);
    ~Telemetry();
    void log(const std::string& line) const;  // rank 0's output
    // Bytes of the gradients (the arena and the reduced shards) and of the optimizer's moments on
    // this rank: the trainer's, constant over the run.
    void set_training_bytes(double grads, double optimizer) { grads_bytes_ = grads, optimizer_bytes_ = optimizer; }
    // The staging copy of checkpoint.async (train/checkpointing), counted with the buffers.
    void set_checkpoint_bytes(double staging) { checkpoint_bytes_ = staging; }

    // Before the first step: the model line, metrics.h5 opened (rank 0; a resumed run keeps its
    // history up to start_step, rebuilt from `resumed_from`'s copy when unreadable), the
    // dead-expert counters continued from that history.
    void begin(int64_t start_step, const std::string& resumed_from);
    MetricsFile* metrics() const { return metrics_.get(); }

    // After step s (s steps done): every rank's memory, pipeline and time figures gathered (one
    // gather), the rows of metrics.h5, the straggler lines, the progress line every
    // output.log_every steps. `moe`: the step's counts summed over all ranks (empty for a dense
    // model); `spike`: the step's first run was above a spike limit (train/spikes). collective
    // over the world
    void record_step(int64_t s, const StepStats& st, bool skipped, bool spike, const MoeCounts& moe);
    // /eval and its line (NaN = interrupted); with per_source (one loss per validation source),
    // /eval/<source>/loss too.
    void record_eval(int64_t s, double loss, const std::vector<double>& per_source = {},
                     const std::vector<Source>& sources = {});
    // /data/source_samples: the samples drawn so far from each training source, and
    // /timing/data_wait: seconds rank 0's step waited for its tokens (rank 0 writes).
    void record_data(int64_t s, const std::vector<int64_t>& counts, const std::vector<Source>& sources,
                     double wait_s);
    // After the step's evaluation: metrics.h5 flushed; after the first step, the activation line.
    void end_step(int64_t s);
    // The run reached train.steps: the planner's prediction beside the measurement, the
    // pipeline's bubble, theory beside measurement, and the ranks by compute time (rank 0).
    void report_finished() const;
    void report_profile() const;  // train.profile: the per-operation table (rank 0)

private:
    bool sources_named_ = false;
    struct MoeFigures {
        std::vector<double> load, imbalance, dead, dropped, aux, ep_tokens;
        double worst_imbalance = 0;
    };
    MoeFigures moe_figures(const MoeCounts& c);  // advances the dead-expert counters
    struct ProfileTotals {
        std::map<std::string, std::pair<double, int64_t>> ops;  // seconds, calls
        int64_t steps = 0;
        double time = 0;
    };
    void take_profile(const StepStats& st, bool steady);
    MemoryBytes memory_account() const;  // this rank's, peak RSS as the total

    RankModel& model_;
    const Deck& deck_;
    std::string deck_text_;
    // MFU's denominator (the FMA peak of the job's cores, or train.peak_tflops) and the sgemm
    // rate of all ranks (the progress line's "of sgemm"): the best seen on this host, and this
    // run's own measurement.
    double peak_flops_ = 0, matmul_flops_ = 0, sgemm_measured_ = 0;
    // The job's cores as MFU counts them (peak_flops_ / one core's peak), 0 under train.peak_tflops:
    // a step's rate per core, against the cached figures (host_peak.hpp).
    double host_cores_used_ = 0;
    double grads_bytes_ = 0, optimizer_bytes_ = 0, checkpoint_bytes_ = 0;
    bool raised_matmul_ = false, raised_peak_ = false;  // a denominator was below a step's rate (said once)
    std::string peak_what_;
    std::unique_ptr<MetricsFile> metrics_;  // rank 0
    int64_t start_step_ = 0;
    double t_start_ = 0;
    std::vector<double> memory_all_;   // [world, 7] the last step's /memory row (rank 0)
    std::vector<double> gathered_;     // [world, 7 + 3] what record_step gathers: memory, then times
    std::vector<double> rank_col_[3];  // [world] step time, compute, comm wait (rank 0)
    std::unique_ptr<StragglerReport> stragglers_;  // rank 0
    std::vector<double> tps_history_;  // tokens/s of the steady-state steps
    std::vector<double> idle_, act_mib_;  // per pipeline stage, the last step
    std::vector<int64_t> moe_idle_;    // [layer, expert] steps without tokens
    // [layer] steps in a row one expert took the collapse threshold's share (moe_figures), and
    // whether that layer's warning was given.
    std::vector<int64_t> moe_collapsed_;
    std::vector<char> moe_warned_;
    ProfileTotals profile_all_, profile_steady_;  // every step; past the first two
    std::vector<std::string> profile_order_;
};

}  // namespace quintet
