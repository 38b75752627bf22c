// The trainer: owns this rank's model chunks, the parameter/gradient/moment arenas, the
// pipeline executor, data-parallel reduction, AdamW, the LR schedule, clipping, evaluation,
// metrics and checkpoints. run() is the whole training job for this rank (collective over the
// grid).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/transformer.hpp"
#include "quintet/parallel/data_parallel.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"
#include "quintet/parallel/process_grid.hpp"
#include "quintet/parallel/tensor_parallel.hpp"
#include "quintet/train/sampler.hpp"
#include "quintet/train/train_config.hpp"

namespace quintet {

// The communicators that carry the backend's own buffers (activations, gradients, pipeline
// messages): the grid's MPI communicators on the CPU backend, NCCL ones built from them on the
// CUDA backend. Host scalars (loss sums, norms) always go over the grid's MPI communicators.
struct DeviceComms {
    const Communicator *tp = nullptr, *pp = nullptr, *dp = nullptr;
    std::unique_ptr<Communicator> kv_group, tied;  // sub-groups for replicated tensors (or null)
    std::vector<std::unique_ptr<Communicator>> owned;
};

struct StepStats {
    double loss = 0, lr = 0, grad_norm = 0, step_time = 0;
    double t_pipeline = 0, t_wait = 0, t_sync = 0, t_dp = 0, t_optim = 0;
    double dp_early = 0;  // DP buckets whose reduction started during the backward
    double t_tp = 0, tp_bytes = 0;
};

class Trainer {
public:
    // deck: validated, vocab_size set. tokens: the token file's ids (every rank holds them).
    Trainer(const Deck& deck, const std::string& deck_text, const ProcessGrid& grid, Backend& be,
            const std::vector<uint32_t>& tokens);
    ~Trainer();
    int run();                 // collective over the grid; returns the exit code
    StepStats step(int64_t s); // one optimizer step (collective)
    double evaluate();         // mean validation cross-entropy (collective)
    const ParamTable& table() const { return table_; }

private:
    void run_schedule(int64_t s, StepStats& st, double& loss_sum);
    void sync_replicated_grads();
    // parallel.overlap_dp: the hook the last microbatch's backward reports final gradients to.
    // It completes a replicated tensor's gradient over tp (or its kv group) at once and hands
    // the range to DataParallel; tied embeddings wait for sync_replicated_grads after the
    // schedule (their partner stage finishes later).
    struct OverlapHook final : GradReadyHook {
        Trainer* t = nullptr;
        void ready(float* g, size_t n) override;
    };
    OverlapHook overlap_hook_;
    bool overlap_ = false;
    std::unordered_map<size_t, size_t> spec_at_offset_;  // arena offset -> index in table_.specs
    std::vector<char> synced_;                           // per spec: replica sync done this step
    double grad_norm();
    void save_checkpoint(int64_t step);
    void resume_if_asked();
    void log(const std::string& line) const;
    int acquire_slot(int chunk);
    size_t activation_bytes() const;

    const Deck& deck_;
    std::string deck_text_;
    const ProcessGrid& grid_;
    Backend& be_;
    DeviceComms comms_;
    TensorParallel tp_;
    std::vector<ChunkPlan> plans_;
    ParamTable table_;
    ModelDims dims_;
    std::unique_ptr<DataParallel> dp_;
    std::vector<std::unique_ptr<ModelChunk>> chunks_;
    std::vector<Action> actions_;
    Sampler sampler_;
    float *params_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr, *gshard_ = nullptr;
    bf16_bits* params_bf16_ = nullptr;  // train.precision = bf16: the GEMMs' copy of params_
    void refresh_bf16_weights();        // params_bf16_ = bf16(params_), after every update
    float* recv_stage_ = nullptr;  // [Nr, C] the pre-posted pipeline receive lands here
    bool host_arena_ = true;       // arenas are host memory (CPU backend): no staging for I/O
    size_t opt_size_ = 0, opt_base_ = 0;
    std::vector<int32_t> ids_, tgt_;
    // executor state: per chunk, free slots, the slot of each microbatch, sends in flight per slot
    std::vector<std::vector<int>> free_slots_, slot_of_mb_;
    std::vector<std::vector<std::vector<int>>> pending_;
    std::vector<int> in_flight_, peak_in_flight_;
    std::vector<int> backwards_left_;  // per chunk: backward actions still to run this step
    double p2p_timeout_s_ = 600;
    int64_t start_step_ = 0, tokens_seen_ = 0;
    double peak_flops_ = 0, flops_per_token_ = 0;
};

// Set from SIGTERM/SIGUSR1: checkpoint at the end of the current step and stop.
void install_stop_signals();

}  // namespace quintet
