// One rank's part of the model, shared by training (Trainer) and evaluation (Evaluator): the
// parameter table and arena (and its bf16 shadow), the communicators and parallel helpers the
// blocks use, this rank's pipeline chunks and the executor that runs them. Built from a
// validated deck on a process grid; the parameters start at their layout-invariant initial values.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "quintet/deck/deck.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/moe_counts.hpp"
#include "quintet/model/transformer.hpp"
#include "quintet/parallel/context_parallel.hpp"
#include "quintet/parallel/device_comms.hpp"
#include "quintet/parallel/expert_parallel.hpp"
#include "quintet/parallel/pipeline_executor.hpp"
#include "quintet/parallel/process_grid.hpp"
#include "quintet/parallel/tensor_parallel.hpp"
#include "quintet/train/zero_state.hpp"

namespace quintet {

class RankModel {
public:
    // deck: validated, vocab_size set. collective over the grid
    RankModel(const Deck& deck, const ProcessGrid& grid, Backend& be);
    ~RankModel();
    RankModel(const RankModel&) = delete;
    RankModel& operator=(const RankModel&) = delete;

    const Deck& deck() const { return deck_; }
    const ProcessGrid& grid() const { return grid_; }
    Backend& backend() const { return be_; }
    const ModelDims& dims() const { return dims_; }
    const ParamTable& table() const { return table_; }
    const DeviceComms& comms() const { return comms_; }
    TensorParallel& tp() { return tp_; }
    ContextParallel* cp() { return cp_.get(); }    // null when cp = 1
    ExpertParallel* ep() { return ep_.get(); }     // null when ep = 1
    PipelineExecutor& executor() { return *exec_; }
    const std::vector<std::unique_ptr<ModelChunk>>& chunks() const { return chunks_; }
    // The whole parameter arena; null under parallel.zero = 3, where this rank keeps only its
    // slices (zero()->param_shard()).
    float* params() const { return params_; }
    // parallel.zero >= 2: the sharded parameters and gradients, by unit (null below 2).
    ZeroState* zero() const { return zero_.get(); }
    bool host_arena() const { return host_arena_; }  // the arenas are host memory (CPU backend)

    // After every change of the parameters: the GEMMs' bf16 copy refreshed; under ZeRO-3 the
    // gathered copies dropped.
    void refresh_bf16_weights();
    // The parameters of any layout's checkpoint `path` (no optimizer state). collective
    void load_weights(const std::string& path);
    // ZeRO-3: this rank's slices of a whole arena (host memory) into its shard.
    void load_shard(const float* whole);
    // PaLM-convention model FLOPs per token of the whole model (docs/math.md §1).
    double flops_per_token() const { return flops_per_token_; }

    // MoE: the counts of the blocks since they were last taken, added into `counts` by layer;
    // the aux-free biases moved from the step's counts over all ranks.
    bool moe() const { return deck_.model.moe.experts > 0; }
    void take_moe_counts(MoeCounts& counts);
    void update_balance_bias(const MoeCounts& step);

    // Bytes this rank holds: parameters (and the bf16 shadow); activations (the slots in flight
    // at the last step's peak, the workspace, the blocks' scratch); communication buffers
    // (pipeline receive staging, the context ring, the expert exchange).
    double param_bytes() const;
    double activation_bytes() const;
    double buffer_bytes() const;
    // This process's resident set when the model began to be built (libraries, MPI, the data).
    double rss_before_bytes() const { return rss_before_; }

private:
    const Deck& deck_;
    const ProcessGrid& grid_;
    Backend& be_;
    double rss_before_ = 0;
    ModelDims dims_;
    DeviceComms comms_;
    TensorParallel tp_;
    std::unique_ptr<ContextParallel> cp_;
    std::unique_ptr<ExpertParallel> ep_;
    ParamTable table_;
    std::vector<std::unique_ptr<ModelChunk>> chunks_;
    std::unique_ptr<PipelineExecutor> exec_;
    std::unique_ptr<ZeroState> zero_;
    float* params_ = nullptr;
    bf16_bits* params_bf16_ = nullptr;  // train.precision = bf16
    bool host_arena_ = true;
    double flops_per_token_ = 0;
};

}  // namespace quintet
