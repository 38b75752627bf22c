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

// fp32: everything in fp32. bf16 (docs/cuda.md "bf16"): every linear layer multiplies bf16
// operands with fp32 accumulation -- a bf16 shadow of the fp32 master weights, and bf16
// activations: the saved inputs of the linear layers are stored only in bf16; the residual
// stream, norms' statistics, attention's softmax and the loss stay fp32; gradients are fp32.
enum class Precision { fp32, bf16 };

// Told, during a backward, that a parameter gradient g[0, n) in the gradient arena is final for
// this step, so its data-parallel reduction can start while the backward goes on.
struct GradReadyHook {
    virtual ~GradReadyHook() = default;
    virtual void ready(float* g, size_t n) = 0;
};

class ModelChunk {
public:
    ModelChunk(Backend& be, const ModelConfig& m, const RopeConfig& rope, const ParamTable& table,
               const ChunkPlan& plan, TensorParallel& tp, int B, int T,
               Precision precision = Precision::fp32);
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
    // `hook` (the step's last microbatch only) is told of each tensor as its gradient completes.
    void backward(int slot, const float* params, float* grads, GradReadyHook* hook = nullptr);

    // Convenience for a chunk that is the whole model (tests, tp-only layouts).
    double forward_backward(const float* params, float* grads, const int32_t* ids,
                            const int32_t* targets, float grad_scale);
    double forward_loss(const float* params, const int32_t* ids, const int32_t* targets);

    // bf16 only: the weights the GEMMs read are shadow[i] = bf16(master[i]) for the arena
    // `master` (the caller refreshes the shadow after every optimizer step). forward/backward
    // must then be given params == master.
    void set_bf16_weights(const float* master, const bf16_bits* shadow);
    Precision precision() const { return bf16_ ? Precision::bf16 : Precision::fp32; }

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
    // A saved input of a linear layer: fp32 (f) or, in bf16 mode, bf16 only (b).
    struct Act {
        float* f = nullptr;
        bf16_bits* b = nullptr;
    };
    // A GEMM operand: its fp32 form (fp32 mode) or its bf16 form (bf16 mode).
    struct Mat {
        const float* f = nullptr;
        const bf16_bits* b = nullptr;
    };
    struct Layer {  // saved for backward, per layer
        float *rstd1, *qkv, *lse, *h, *rstd2, *gu;
        Act xn1, att, xn2, act;
    };
    struct Slot {
        std::vector<float*> res;  // res[i]: input of layer i; res[n_layers]: chunk output
        std::vector<Layer> layers;
        float *rstd_f = nullptr, *logits = nullptr;  // last chunk
        Act xf;
        float *dout = nullptr, *dres = nullptr;
        int32_t* ids = nullptr;   // [N] the microbatch's local ids (first chunk: the embedding backward)
    };
    float* buf(size_t n, bool per_slot);
    bf16_bits* buf_bf16(size_t n, bool per_slot);
    Act act_buf(size_t n);  // per slot, in this chunk's precision
    // Where a kernel writes a value to be saved as `a`: a.f, or fp32 scratch to be kept by keep().
    float* produce(const Act& a, float* scratch) const { return bf16_ ? scratch : a.f; }
    void keep(const Act& a, const float* scratch, size_t n);
    Mat local(const Act& a) const { return {a.f, a.b}; }
    Mat gathered(const Act& a, size_t rows, size_t C);  // tp_.gather in the stored precision
    Mat lowp(const float* x, size_t n);                 // x, as a GEMM operand (bf16: into lowp_)
    Mat weight(const float* w) const { return {w, bf16_ ? shadow_ + (w - master_) : nullptr}; }
    // C[M,N] = op(A) op(B) + beta * C in the chunk's precision.
    void mm(bool ta, bool tb, int M, int N, int K, Mat A, int lda, Mat B, int ldb, float beta,
            float* C, int ldc);
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
    std::vector<bf16_bits*> owned_bf16_;
    bool bf16_ = false;
    const float* master_ = nullptr;       // bf16: the fp32 arena the shadow mirrors
    const bf16_bits* shadow_ = nullptr;
    bf16_bits *lowp_ = nullptr, *gather_bf16_ = nullptr;  // bf16 scratch: operands, SP gathers
    size_t slot_floats_ = 0;
    ChunkView wview_, gview_;
    const float *wbase_ = nullptr, *gbase_ = nullptr;
};

}  // namespace quintet
