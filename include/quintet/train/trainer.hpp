// The trainer: one rank's part of a training job. It wires the rank's model (RankModel) to
// what acts on it -- the gradient arena and its synchronisation over the replica groups
// (train/grad_sync), the optimizer (train/optimizer: AdamW, Muon), the sampler -- and to the run's policies:
// checkpoints (train/checkpointing), faults (train/faults), evaluation (train/evaluator) and
// telemetry (train/telemetry) and the timeline (train/timeline). step() reads as the list of what a step does; run() is the
// whole job (collective over the grid).
#pragma once
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quintet/data/sampler.hpp"
#include "quintet/io/run_lock.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/model/moe_counts.hpp"
#include "quintet/train/checkpointing.hpp"
#include "quintet/train/evaluator.hpp"
#include "quintet/train/faults.hpp"
#include "quintet/train/grad_sync.hpp"
#include "quintet/train/optimizer.hpp"
#include "quintet/train/rank_model.hpp"
#include "quintet/train/spikes.hpp"
#include "quintet/train/step_stats.hpp"
#include "quintet/train/telemetry.hpp"
#include "quintet/train/timeline.hpp"

namespace quintet {

class Trainer {
public:
    // data: the sources (read a step ahead by the sampler; the tokenizer goes into every checkpoint);
    // lock: the run_dir lock, refreshed every step (may be null). collective over the grid
    // (measures MFU's denominators)
    Trainer(RankModel& model, const std::string& deck_text, const DataSet& data, WeightsSource source,
            const RunLock* lock = nullptr);
    ~Trainer();
    int run();  // the whole job; returns the exit status. collective over the grid
    // One optimizer step (collective). A step whose loss or gradient norm is not finite (agreed
    // on every rank), or a spike the spike policy acts on, returns with `nonfinite` (`spike`)
    // set and the state untouched, so that it can be run again; `locate` runs it without the
    // overlapped reduction and finds where it began.
    StepStats step(int64_t s, bool locate = false);

private:
    int run_steps();
    RunState run_state() const;  // what a checkpoint keeps of the run besides the tensors
    // The blend's segments: the checkpoint's, and a new one from the resumed step when the deck's
    // weights differ; logged with what each source gives over the run, recorded in /runs.
    void set_up_blend();
    int64_t global_batch() const;  // samples per step
    std::string zero_nonfinite(double local_loss) const;  // this rank's finding under ZeRO-2/3

    RankModel& model_;
    const Deck& deck_;
    const ProcessGrid& grid_;
    Backend& be_;
    float* grads_ = nullptr;
    std::unique_ptr<GradientSync> sync_;
    std::unique_ptr<Optimizer> opt_;
    Sampler sampler_;
    std::optional<Evaluator> eval_;  // eval.every > 0
    FaultInjection faults_;
    Telemetry telemetry_;
    Checkpointing checkpoints_;
    SkipBudget skips_;  // rejected steps in a row (non-finite or spikes), against train.max_skips
    NonFinitePolicy nonfinite_;
    SpikePolicy spikes_;
    Timeline timeline_;  // train.trace_steps
    MoeCounts moe_;  // the step's counts of every MoE layer, summed over all ranks
    const RunLock* lock_;
    int64_t start_step_ = 0, tokens_seen_ = 0;
    std::atomic<int64_t> steps_done_{0};  // the watchdog thread reads it for run_dir/fault
};

}  // namespace quintet
