// The checkpoint policy of a training run: where its weights come from (a resume, or
// checkpoint.init_from), loading them into any layout, and writing checkpoints -- never over
// non-finite weights, with the metrics history beside each, every phase under the collective
// deadline, the arenas staged through host memory on a device backend, and under
// checkpoint.async the write on a thread of its own while training goes on (docs/reliability.md
// "Asynchronous checkpoints", docs/long-context.md "The contracts").
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/io/checkpoint_writer.hpp"
#include "quintet/io/metrics.hpp"
#include "quintet/train/faults.hpp"
#include "quintet/train/grad_sync.hpp"
#include "quintet/train/optimizer.hpp"
#include "quintet/train/rank_model.hpp"

namespace quintet {

// Where a run's weights come from, and the context they were trained at: the checkpoint a
// resume continues (resume wins), else checkpoint.init_from, else none. Resolves
// rope.original_max_position = 0 under YaRN to that checkpoint's trained context (data.seq_len
// from scratch), and returns warnings to print: a run past the trained context without a
// scaling rule, [rope] settings that differ from the checkpoint's.
struct WeightsSource {
    std::string path;             // "" = from scratch
    bool resume = false;          // continue that run (else weights only)
    int64_t trained_context = 0;  // of the source checkpoint (0: none)
    std::string deck;             // the source checkpoint's resolved deck
    std::string blend;            // its data blend's segments ("" = its deck's weights from sample 0)
    std::vector<std::string> warnings;
    std::vector<std::string> changes;  // the deck keys that differ from the checkpoint's (report_changes)
};
// collective over comm (the checkpoint is verified)
WeightsSource resolve_weights_source(Deck& deck, const MpiCommunicator& comm);
// One line per deck key this run changes against the source checkpoint's deck (`deck` fully
// resolved: its layout too), saying whether the change is allowed: optimizer, schedule, data,
// evaluation and MoE routing keys are, with the line as the warning; the layout is (a
// checkpoint loads into any layout); a key that changes the model's tensors is not -- a
// ConfigError (exit 2) lists every such key before any work.
std::vector<std::string> report_changes(const WeightsSource& source, const Deck& deck);

// What a checkpoint keeps of the run besides the tensors (/train_state, docs/formats.md).
struct RunState {
    std::vector<double> spike_window;  // [n][2]: loss, gradient norm of the last accepted steps
    int64_t skips_in_row = 0;
};

class Checkpointing {
public:
    // log: a line for rank 0's output. collective over the grid (makes the I/O communicator;
    // under checkpoint.async, checks that the staging copy fits this node's memory -- a
    // ConfigError naming the bytes when it does not -- and allocates it).
    // tokenizer: the training data's, stored in every checkpoint.
    Checkpointing(RankModel& model, const GradientSync& sync, Optimizer& opt, std::string deck_text,
                  TokenizerState tokenizer, WeightsSource source, const FaultInjection& faults,
                  std::function<void(const std::string&)> log);
    ~Checkpointing();

    // Before the first step: refuses to overwrite a run's checkpoints under resume = none, prints
    // the source's warnings, then loads what the source names -- a resume (parameters, the
    // optimizer state and *state; under an allowed change of optimizer the new one's state starts
    // at zero) or init_from (parameters only). Returns the step the run continues from (0 for a
    // fresh start) and sets *tokens_seen. collective
    int64_t start(int64_t* tokens_seen, RunState* state);
    // The checkpoint of `step` (steps done), with the metrics history so far beside it. Blocking
    // (checkpoint.async = false, or `complete_now`): complete on return. Else the values are
    // copied into the staging buffer and written on a thread of its own while training goes on;
    // step_end() commits it. At most one save is in flight: one still running is completed
    // first. Throws DivergedError (after recording the fault) when the weights are not finite.
    // collective
    void save(int64_t step, int64_t tokens_seen, const RunState& state, MetricsFile* metrics,
              bool complete_now = false);
    // At the end of every step: whether a stop signal reached any rank, agreed on in the same
    // all-reduce as the state of the save in flight, which is committed here once every rank
    // has written its part. A background write that failed on any rank (or ran past
    // train.collective_timeout_s) stops the run on every rank: IoError (DeadlineError). collective
    bool step_end(MetricsFile* metrics);
    // The save in flight, if any, completed now (its writes waited for, said in the log, then
    // committed): before anything that may end the run or needs `latest`. collective
    void complete(MetricsFile* metrics, const std::string& before);
    bool in_flight() const { return bool(flight_); }
    const std::string& last() const { return last_; }  // the newest complete checkpoint, or ""
    const WeightsSource& source() const { return source_; }
    // The staging buffer of checkpoint.async (0 when blocking), accounted as buffers memory.
    double staging_bytes() const { return double(staging_.size()) * sizeof(float); }
    void set_blend(std::string text) { blend_ = std::move(text); }  // stored in every checkpoint

private:
    struct InFlight;
    // Where this rank's checkpoint values are (device or host memory): its dp-owned slice of
    // each trainable tensor (ZeRO-2/3: its slices), the buffers from the first rank of its
    // dp x cp group, the AdamW moments of the parts of AdamW's tensors it writes, and (Muon)
    // the momentum of the whole matrices it orthogonalises.
    struct Sources {
        std::vector<CheckpointSource> ranges;
        std::vector<CheckpointWhole> momentum;
    };
    Sources sources() const;
    size_t staged_floats() const;  // the staging copy of sources()
    // sources() copied into `to` (host memory, staged_floats()), and the same values there;
    // *finite: whether every parameter copied is finite (checked in the same pass).
    Sources stage(float* to, bool* finite) const;
    void check_staging_fits(double bytes) const;
    void finish(MetricsFile* metrics, int agreed);  // commits (or fails) the save in flight
    void record(MetricsFile* metrics, int64_t step, const std::string& path, double blocked, double staging,
                double write_s, bool background);
    RankModel& model_;
    const GradientSync& sync_;
    Optimizer& opt_;
    std::string deck_text_, blend_;
    TokenizerState tokenizer_;
    WeightsSource source_;
    const FaultInjection& faults_;
    std::function<void(const std::string&)> log_;
    // The world without a deadline per operation: each phase of a write is timed as one
    // watchdog entry, which its barriers must not replace.
    std::unique_ptr<MpiCommunicator> io_comm_;
    std::vector<float> staging_;  // checkpoint.async: the copy a background write reads
    std::unique_ptr<InFlight> flight_;
    std::string last_;
};

}  // namespace quintet
