// The trainer: owns the model replica, the parameter/gradient/moment arenas, data-parallel
// reduction, AdamW, the LR schedule, clipping, evaluation, metrics and checkpoints. run() is
// the whole training job for this rank (collective over the grid).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/transformer.hpp"
#include "quintet/parallel/data_parallel.hpp"
#include "quintet/parallel/process_grid.hpp"
#include "quintet/train/sampler.hpp"
#include "quintet/train/train_config.hpp"

namespace quintet {

class MetricsFile;

struct StepStats {
    double loss = 0, lr = 0, grad_norm = 0, step_time = 0;
    double t_compute = 0, t_dp = 0, t_optim = 0;
};

class Trainer {
public:
    // deck: validated, vocab_size set. tokens: the token file's ids (every rank holds them).
    Trainer(const Deck& deck, const std::string& deck_text, const ProcessGrid& grid, Backend& be,
            const std::vector<uint32_t>& tokens);
    ~Trainer();
    // collective over the grid. Returns the process exit code (0).
    int run();
    // One optimizer step (collective); exposed for tests.
    StepStats step(int64_t s);
    double evaluate();  // mean validation cross-entropy (collective)
    const ParamTable& table() const { return table_; }
    const float* params() const { return params_; }
    int64_t start_step() const { return start_step_; }

private:
    void save_checkpoint(int64_t step);
    void resume_if_asked();
    void log(const std::string& line) const;

    const Deck& deck_;
    std::string deck_text_;
    const ProcessGrid& grid_;
    Backend& be_;
    ParamTable table_;
    ModelDims dims_;
    std::unique_ptr<DataParallel> dp_;
    std::unique_ptr<Transformer> model_;
    Sampler sampler_;
    float *params_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr, *gshard_ = nullptr;
    size_t opt_size_ = 0, opt_base_ = 0;
    std::vector<int32_t> ids_, tgt_;
    int64_t start_step_ = 0, tokens_seen_ = 0;
    double peak_flops_ = 0, flops_per_token_ = 0;
};

// Set from SIGTERM/SIGUSR1: checkpoint at the end of the current step and stop.
void install_stop_signals();

}  // namespace quintet
