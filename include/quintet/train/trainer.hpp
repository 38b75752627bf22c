// The trainer orchestrates one rank's part of a training job: it owns the parameter and
// gradient arenas and the pieces that act on them -- the model chunks and the pipeline executor
// (parallel/pipeline_executor), the gradient synchronisation per replica group
// (train/grad_sync), AdamW (train/optimizer) -- and the outputs: metrics, evaluation,
// checkpoints. step() reads as the list of what a step does; run() is the whole job
// (collective over the grid).
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "quintet/io/metrics.hpp"
#include "quintet/io/run_lock.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/transformer.hpp"
#include "quintet/parallel/context_parallel.hpp"
#include "quintet/parallel/pipeline_executor.hpp"
#include "quintet/parallel/process_grid.hpp"
#include "quintet/parallel/tensor_parallel.hpp"
#include "quintet/parallel/device_comms.hpp"
#include "quintet/train/grad_sync.hpp"
#include "quintet/train/optimizer.hpp"
#include "quintet/perf/planner.hpp"
#include "quintet/data/sampler.hpp"
#include "quintet/deck/train_config.hpp"

namespace quintet {

struct StepStats {
    double loss = 0, ce_loss = 0, aux_loss = 0, lr = 0, grad_norm = 0, step_time = 0;
    double t_pipeline = 0, t_wait = 0, t_sync = 0, t_dp = 0, t_optim = 0;
    double dp_early = 0;  // DP buckets whose reduction started during the backward
    double t_tp = 0, tp_bytes = 0;
    double t_cp = 0, t_cp_exposed = 0, cp_bytes = 0;  // the context-parallel ring
    double t_ep_dispatch = 0, t_ep_combine = 0, ep_bytes = 0;  // MoE's token exchange (this rank)
    double ep_bytes_all = 0, ep_bytes_theory = 0;  // every rank's, measured and from the routed counts
    // A non-finite loss or gradient norm: the update was not applied. `what` names it; with
    // step(s, true) `origin` names the first rank and tensor where it appeared.
    bool nonfinite = false;
    std::string what, origin;
};

// Where a run's weights come from, and the context they were trained at (docs/long-context.md, "The contracts"): the
// checkpoint a resume continues (resume wins), else checkpoint.init_from, else none. Resolves
// rope.original_max_position = 0 under YaRN to that checkpoint's trained context (data.seq_len
// from scratch), and returns warnings to print: a run past the trained context without a
// scaling rule, [rope] settings that differ from the checkpoint's.
struct WeightsSource {
    std::string path;           // "" = from scratch
    bool resume = false;        // continue that run (else weights only)
    int64_t trained_context = 0;  // of the source checkpoint (0: none)
    std::vector<std::string> warnings;
};
// collective over comm (the checkpoint is verified)
WeightsSource resolve_weights_source(Deck& deck, const MpiCommunicator& comm);

enum class TrainerMode { train, eval };  // eval: no gradients, no optimizer, writes nothing

class Trainer {
public:
    // deck: validated, vocab_size set. tokens: the token file's ids (every rank holds them).
    Trainer(const Deck& deck, const std::string& deck_text, const ProcessGrid& grid, Backend& be,
            const std::vector<uint32_t>& tokens, TrainerMode mode = TrainerMode::train,
            WeightsSource source = {});
    ~Trainer();
    int run();                 // collective over the grid; returns the exit code
    // One optimizer step (collective). A step whose loss or gradient norm is not finite (agreed
    // on every rank) returns with `nonfinite` set and the state untouched, so that it can be run
    // again; `locate` runs it without the overlapped reduction and finds where it began.
    StepStats step(int64_t s, bool locate = false);
    // Mean validation cross-entropy (collective). by_position (rank 0, when given): the mean
    // cross-entropy at each position of the samples [T].
    double evaluate(std::vector<double>* by_position = nullptr);
    // Eval mode: the parameters of `path` (any layout), no optimizer state. collective
    void load_weights(const std::string& path);
    const ParamTable& table() const { return table_; }
    // The run_dir lock run() refreshes every step (train_main holds it).
    void set_run_lock(const RunLock* lock) { lock_ = lock; }

private:
    void save_checkpoint(int64_t step);
    void resume_if_asked();
    void log(const std::string& line) const;
    void refresh_bf16_weights();  // params_bf16_ = bf16(params_), after every update
    std::vector<ArenaRange> checkpoint_writes() const;
    std::vector<ArenaRange> checkpoint_state() const;

    const Deck& deck_;
    std::string deck_text_;
    const ProcessGrid& grid_;
    Backend& be_;
    TrainerMode mode_;
    WeightsSource source_;
    ModelDims dims_;
    DeviceComms comms_;
    std::unique_ptr<MpiCommunicator> io_comm_;  // checkpoint I/O: the world, untimed per operation
    TensorParallel tp_;
    std::unique_ptr<ContextParallel> cp_;  // null when cp = 1
    std::unique_ptr<ExpertParallel> ep_;   // null when ep = 1
    std::vector<ChunkPlan> plans_;
    ParamTable table_;
    std::vector<std::unique_ptr<ModelChunk>> chunks_;
    // MoE: [n_layers * moe_width_] this step's counts over all ranks (moe_counts_width in
    // model/block.hpp); the per-layer figures written to /moe; steps each expert has had no tokens.
    std::vector<double> moe_counts_;
    int moe_width_ = 0;
    struct MoeFigures {
        std::vector<double> load, imbalance, dead, dropped, aux, ep_tokens;
        double worst_imbalance = 0;
    };
    MoeFigures moe_figures();
    std::vector<int64_t> moe_idle_;  // [n_layers * experts]
    std::unique_ptr<PipelineExecutor> exec_;
    std::unique_ptr<GradientSync> sync_;
    std::unique_ptr<AdamW> opt_;
    Sampler sampler_;
    float *params_ = nullptr, *grads_ = nullptr;
    bf16_bits* params_bf16_ = nullptr;  // train.precision = bf16: the GEMMs' copy of params_
    bool host_arena_ = true;            // arenas are host memory (CPU backend): no staging for I/O
    int64_t start_step_ = 0, tokens_seen_ = 0;
    const RunLock* lock_ = nullptr;
    std::unique_ptr<MetricsFile> metrics_;  // rank 0
    int skips_in_row_ = 0;
    std::atomic<int64_t> current_step_{0};  // steps done (the watchdog thread reads it for run_dir/fault)
    int run_steps();        // train.on_nonfinite = skip: consecutive skipped steps
    bool poisoned_once_ = false;  // QUINTET_INJECT_FAULT mode=nan_once has fired
    std::string last_checkpoint_;  // the newest complete checkpoint (this run's or the resumed one)
    // Records a fault for job scripts: run_dir/fault holds "kind=K step=S rank=R" (rank 0 writes).
    void record_fault(const std::string& kind, int64_t step, int rank, const std::string& what) const;
    // The first rank (lowest) whose local values are not finite, and what: "rank R, gradient of T"
    // or "rank R, loss" (collective; "" when every rank is finite).
    std::string locate_nonfinite(double local_loss) const;
    // MFU's denominator (the FMA peak of the job's cores, or train.peak_tflops) and the measured
    // sgemm rate of all ranks (the second column: the achieved share of the matmul rate).
    double peak_flops_ = 0, matmul_flops_ = 0, flops_per_token_ = 0;
    std::string peak_what_;
    // Memory accounting (the metrics' /memory/*, docs/formats.md): this rank's bytes by category, measured peak RSS
    // as the total; every rank's, gathered on rank 0 each step; tokens/s after the first steps.
    static constexpr int kMemoryColumns = 7;  // params grads optimizer activations buffers runtime peak_rss
    MemoryBytes memory_account() const;
    std::vector<double> memory_all_, tps_history_;
    double sgemm_measured_ = 0;  // this run's own sgemm measurement (matmul_flops_: the best seen on the host)
    double start_rss_ = 0;  // resident set when the trainer began (libraries, MPI, the data)
    // Rank 0, at the end of a run: the planner's prediction for this deck and layout against the
    // measured memory of the largest rank and the median tokens/s.
    void report_prediction() const;
    // train.profile: per-operation totals (seconds, calls), and the table. Two sets: every step,
    // and the steady state (the steps the tokens/s median reads: past the first two, which
    // carry first-touch page faults and warm-up); the table shows the second when it has steps.
    struct ProfileTotals {
        std::map<std::string, std::pair<double, int64_t>> ops;
        int64_t steps = 0;
        double time = 0;
    };
    ProfileTotals profile_all_, profile_steady_;
    std::vector<std::string> profile_order_;
    void report_profile() const;
};

// run_dir/fault for job scripts: "kind=K step=S rank=R" and the message (written atomically).
void write_fault_file(const std::string& run_dir, const std::string& kind, int64_t step, int rank,
                      const std::string& what);

// Set from SIGTERM/SIGUSR1/SIGINT: checkpoint at the end of the current step and stop.
void install_stop_signals();

}  // namespace quintet
