// One pipeline chunk of the dense Llama-style decoder on this rank: the embedding (first chunk),
// layers [layer_begin, layer_end), and the final norm + LM head + loss (last chunk), each layer
// with an explicit forward and backward (no autograd tape), tensor-parallel over `tp`.
//
// Activations saved for backward live in slots, one per microbatch in flight (the pipeline
// schedule decides how many); slots are allocated on first use and reused, so the steady-state
// step allocates nothing. Parameters and gradients live in the caller's arenas.
//
// Row counts: N = B*T tokens; Nr = N/tp rows of the residual stream under sequence
// parallelism, else N.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/tensor_parallel.hpp"
#include "quintet/parallel/vocab_parallel.hpp"

namespace quintet {

class ModelChunk {
public:
    ModelChunk(Backend& be, const ModelConfig& m, const RopeConfig& rope, const ParamTable& table,
               const ChunkPlan& plan, TensorParallel& tp, int B, int T);
    ~ModelChunk();
    ModelChunk(const ModelChunk&) = delete;
    ModelChunk& operator=(const ModelChunk&) = delete;

    // Forward of one microbatch into `slot`. The first chunk embeds `ids` (host [N]); the others
    // read input(slot). The last chunk computes the loss against `targets` (host [N]) and returns
    // the sum of token losses (with need_grad it leaves grad_scale * dloss/dlogits for backward);
    // the others leave output(slot) for the next stage and return 0.
    double forward(int slot, const float* params, const int32_t* ids, const int32_t* targets,
                   float grad_scale, bool need_grad);
    // Backward of the microbatch in `slot`: the last chunk starts from its saved dlogits, the
    // others from grad_output(slot). Parameter gradients accumulate into `grads`; the first chunk
    // ends in the embedding, the others leave grad_input(slot) for the previous stage.
    void backward(int slot, const float* params, float* grads);

    // Convenience for a chunk that is the whole model (tests, tp-only layouts).
    double forward_backward(const float* params, float* grads, const int32_t* ids,
                            const int32_t* targets, float grad_scale);
    double forward_loss(const float* params, const int32_t* ids, const int32_t* targets);

    int add_slot();                      // allocates one more slot; returns its index
    int slots() const { return int(slots_.size()); }
    float* input(int s) { return slots_[s].res[0]; }        // [Nr, C] from the previous stage
    float* output(int s) { return slots_[s].res.back(); }   // [Nr, C] to the next stage
    float* grad_output(int s) { return slots_[s].dout; }    // [Nr, C] from the next stage
    float* grad_input(int s) { return slots_[s].dres; }     // [Nr, C] to the previous stage
    size_t boundary_floats() const { return size_t(Nr_) * d_.C; }
    size_t slot_bytes() const { return slot_floats_ * sizeof(float); }
    const ChunkPlan& plan() const { return plan_; }
    const ModelDims& dims() const { return d_; }

private:
    struct Layer {  // saved for backward, per layer
        float *rstd1, *xn1, *qkv, *att, *lse, *h, *rstd2, *xn2, *gu, *act;
    };
    struct Slot {
        std::vector<float*> res;  // res[i]: input of layer i; res[n_layers]: chunk output
        std::vector<Layer> layers;
        float *rstd_f = nullptr, *xf = nullptr, *logits = nullptr;  // last chunk
        float *dout = nullptr, *dres = nullptr;
        int32_t* ids = nullptr;   // [N] the microbatch's local ids (first chunk: the embedding backward)
    };
    float* buf(size_t n, bool per_slot);
    // Views of the arenas, rebuilt only when the caller passes another arena (never in the
    // steady state: building one allocates and looks tensors up by name).
    const ChunkView& view(ChunkView& cache, const float*& cached_base, const float* base);
    void set_tokens(Slot& s, const int32_t* ids, const int32_t* targets);

    Backend& be_;
    ModelDims d_;
    const ParamTable& table_;
    ChunkPlan plan_;
    TensorParallel& tp_;
    int B_, T_, N_, Nr_;
    float eps_, attn_scale_;
    float *cos_, *sin_;                 // [T, HD/2]
    int32_t* tgt_;                      // [N] vocabulary-shard-local targets (-1: elsewhere)
    std::vector<int32_t> host_ids_, host_tgt_;
    std::vector<float> losses_;         // [N] host
    VocabParallelScratch xent_;
    std::vector<Slot> slots_;
    // Scratch shared by all slots (one microbatch computes at a time).
    float *full_a_, *full_b_;           // [N, C] gathered rows / partial sums before reduction
    float *datt_, *dqkv_, *dgu_, *dact_, *dshard_;
    std::vector<float*> owned_;
    size_t slot_floats_ = 0;
    ChunkView wview_, gview_;
    const float *wbase_ = nullptr, *gbase_ = nullptr;
};

}  // namespace quintet
