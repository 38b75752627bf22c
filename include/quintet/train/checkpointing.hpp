// The checkpoint policy of a training run: where its weights come from (a resume, or
// checkpoint.init_from), loading them into any layout, and writing checkpoints -- never over
// non-finite weights, with the metrics history beside each, the whole write under one deadline,
// and the arenas staged through host memory on a device backend (docs/reliability.md,
// docs/long-context.md "The contracts").
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/deck/deck.hpp"
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

class Checkpointing {
public:
    // log: a line for rank 0's output. collective over the grid (makes the I/O communicator)
    // tokenizer: the training data's, stored in every checkpoint.
    Checkpointing(RankModel& model, const GradientSync& sync, AdamW& opt, std::string deck_text,
                  TokenizerState tokenizer, WeightsSource source, const FaultInjection& faults,
                  std::function<void(const std::string&)> log);
    ~Checkpointing();

    // Before the first step: refuses to overwrite a run's checkpoints under resume = none, prints
    // the source's warnings, then loads what the source names -- a resume (parameters and AdamW
    // moments) or init_from (parameters only). Returns the step the run continues from (0 for a
    // fresh start) and sets *tokens_seen. collective
    int64_t start(int64_t* tokens_seen);
    // Writes the checkpoint of `step` (steps done) with the metrics history so far beside it.
    // Throws DivergedError (after recording the fault) when the weights are not finite.
    // collective
    void save(int64_t step, int64_t tokens_seen, MetricsFile* metrics);
    const std::string& last() const { return last_; }  // the newest complete checkpoint, or ""
    const WeightsSource& source() const { return source_; }
    void set_blend(std::string text) { blend_ = std::move(text); }  // stored in every checkpoint

private:
    // The arena ranges this rank writes (its dp-owned slice of each trainable region, and the
    // buffers from the first rank of its dp x cp group), and those whose moments it holds.
    std::vector<ArenaRange> writes() const;
    std::vector<ArenaRange> state() const;
    std::vector<float> whole_from_shard() const;  // ZeRO-3 (host)
    RankModel& model_;
    const GradientSync& sync_;
    AdamW& opt_;
    std::string deck_text_, blend_;
    TokenizerState tokenizer_;
    WeightsSource source_;
    const FaultInjection& faults_;
    std::function<void(const std::string&)> log_;
    // The world without a deadline per operation: the whole write is timed as one watchdog
    // entry, which its barriers must not replace.
    std::unique_ptr<MpiCommunicator> io_comm_;
    std::string last_;
};

}  // namespace quintet
