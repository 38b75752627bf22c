// One pipeline chunk of the Llama-style decoder on this rank, as a stack: the embedding (first
// chunk), layers [layer_begin, layer_end), and the final norm + LM head + loss (last chunk). Each
// layer is two RMSNorms around an attention block and a feed-forward block (model/block.hpp), of
// the kinds the deck names, on the residual stream; tensor-parallel over `tp`. No autograd tape:
// every part has an explicit backward, in two halves (B: input gradients, W: weight gradients)
// that one reverse walk over the layers runs whole, as B only, or as W only.
//
// The activations live in a SlotStore (model/slot_store.hpp): one slot per microbatch in flight,
// laid out from what the block kinds and linear layers declare. Parameters and gradients live in
// the caller's arenas, or under ZeRO >= 2 come unit by unit from ParamUnits.
//
// Generation (quintet generate) runs the same chunk with a KV cache per attention block: see
// model/decoder.hpp.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/block.hpp"
#include "quintet/model/linear.hpp"
#include "quintet/model/rms_norm.hpp"
#include "quintet/model/slot_store.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/param_units.hpp"
#include "quintet/parallel/pipeline_executor.hpp"
#include "quintet/parallel/tensor_parallel.hpp"
#include "quintet/parallel/vocab_parallel.hpp"

namespace quintet {

struct ChunkOptions {
    Precision precision = Precision::fp32;
    int max_positions = 0;  // RoPE tables cover [0, max_positions); 0 = T
    int rope_seq_len = 0;   // stands in for rope.original_max_position = 0; 0 = T
    ContextParallel* cp = nullptr;  // the context-parallel ring (null: cp = 1)
    // Packed documents (data.document_mask): a token attends only to earlier tokens of its own
    // document; eos_id ends a document (and belongs to it). document_positions: RoPE positions
    // restart at each document (rope.document_positions).
    bool document_mask = false, document_positions = false;
    int eos_id = -1;
    Recompute recompute = Recompute::none;  // train.recompute
    ExpertParallel* ep = nullptr;  // MoE's token exchange (null: ep = 1)
    // The schedule splits each backward into B and W and runs W later (zb_h1, zbv): what W needs
    // of B is kept per slot (BufferShape::split_bw).
    bool split_bw = false;
    // parallel.zero >= 2: parameters and gradients come unit by unit from here (the table is laid
    // out by unit); the params and grads arguments of forward/backward are then ignored.
    ParamUnits* units = nullptr;
    // train.mtp_weight: the MTP modules' share of the loss (model.mtp_depth > 0).
    double mtp_weight = 0.3;
};

class ModelChunk final : public PipelineStage {
public:
    // B samples of T tokens per microbatch (under context parallelism this rank holds T/cp of
    // each sample: chunks r and 2cp-1-r, docs/math.md §8).
    ModelChunk(Backend& be, const ModelConfig& m, const RopeConfig& rope, const ParamTable& table,
               const ChunkPlan& plan, TensorParallel& tp, int B, int T, ChunkOptions opt = {});
    ~ModelChunk();
    ModelChunk(const ModelChunk&) = delete;
    ModelChunk& operator=(const ModelChunk&) = delete;

    // Forward of one microbatch into `slot`. ids and targets are the whole microbatch (host
    // [B*T], every cp rank picks its rows); a chunk needs them when needs_tokens(). The first
    // chunk embeds its rows; the others read input(slot). The last chunk computes the loss of
    // its rows' targets and returns their sum of cross-entropies (with need_grad it leaves
    // grad_scale * dloss/dlogits for backward); the others leave output(slot) for the next stage
    // and return 0.
    // collective over tp
    double forward(int slot, const float* params, const int32_t* ids, const int32_t* targets,
                   float grad_scale, bool need_grad) override;
    // The auxiliary losses the blocks of this chunk added in slot's last forward (MoE; 0 dense).
    double aux_loss(int slot) const override;
    // The last chunk's MTP modules (model.mtp_depth): the sum over modules of their rows'
    // cross-entropies in slot's last training forward (0 without MTP, and after an evaluation).
    double mtp_loss(int slot) const override;
    int mtp_depth() const { return int(mtp_.modules.size()); }
    // MoE: the largest expert count of this chunk's layers (0: dense); the counts of this step
    // added into `counts` by layer (and reset); the aux-free biases moved from the global
    // batch's loads (the same on every rank); d(loss)/d(aux) per microbatch.
    int moe_experts() const;
    void take_moe_counts(MoeCounts& counts);
    void update_balance_bias(float* params, const MoeCounts& step);
    void set_aux_scale(double s) { ctx_.aux_scale = s; }
    // train.probe_rms: while set, every training forward adds its layer outputs' squares (null: off).
    void set_probe(RmsProbe* p) { probe_ = p; }
    // Backward of the microbatch in `slot`: the last chunk starts from its saved dlogits, the
    // others from grad_output(slot). Parameter gradients accumulate into `grads`; the first chunk
    // ends in the embedding, the others leave grad_input(slot) for the previous stage.
    // `hook` (the step's last microbatch only) is told of each tensor as its gradient completes.
    // collective over tp
    void backward(int slot, const float* params, float* grads, GradReadyHook* hook = nullptr) override;
    // The same backward in two parts (split_bw chunks; docs/parallelism.md, "Zero-bubble
    // schedules"). B: grad_input(slot) (every input gradient, no parameter gradient), keeping in
    // the slot what W needs. W, any time later: the parameter gradients, accumulated into
    // `grads` (params are read only under full recomputation, which runs the forward again).
    // B then W is backward(), bit for bit. collective over tp
    void backward_input(int slot, const float* params) override;
    void backward_weight(int slot, const float* params, float* grads, GradReadyHook* hook = nullptr) override;

    // Convenience for a chunk that is the whole model (tests, tp-only layouts).
    double forward_backward(const float* params, float* grads, const int32_t* ids,
                            const int32_t* targets, float grad_scale);
    double forward_loss(const float* params, const int32_t* ids, const int32_t* targets);

    // bf16 only: the weights the GEMMs read are shadow[i] = bf16(master[i]) for the arena
    // `master` (the caller refreshes the shadow after every optimizer step). forward/backward
    // must then be given params == master.
    void set_bf16_weights(const float* master, const bf16_bits* shadow) { lin_.set_bf16_weights(master, shadow); }
    Precision precision() const { return lin_.bf16() ? Precision::bf16 : Precision::fp32; }

    int add_slot() override;  // allocates one more slot; returns its index
    int slots() const override { return store_.slots(); }
    float* input(int s) override { return store_.slot(s).res[0]; }        // [Nr, C] from the previous stage
    float* output(int s) override { return store_.slot(s).res.back(); }   // [Nr, C] to the next stage
    float* grad_output(int s) override { return store_.slot(s).dout; }    // [Nr, C] from the next stage
    float* grad_input(int s) override { return store_.slot(s).dres; }     // [Nr, C] to the previous stage
    size_t boundary_floats() const override { return size_t(ctx_.Nr) * ctx_.d.C; }
    size_t slot_bytes() const override { return buffers().slot_bytes(); }
    // Activations kept once for all slots (full recompute: one layer's worth, shared).
    size_t workspace_bytes() const override { return buffers().workspace_bytes(); }
    // Buffers kept once besides those: the blocks' shared scratch and operand staging.
    size_t scratch_bytes() const { return buffers().shared_bytes(); }
    const ChunkBuffers& buffers() const { return store_.buffers(); }
    bool needs_tokens() const override { return plan_.first || plan_.last || documents_; }
    // The last chunk's per-row cross-entropies of its last forward (host [N], this rank's rows),
    // and the position in its sample of local row n.
    const std::vector<float>& token_losses() const { return losses_; }
    int position_of_row(int n) const;
    const ChunkPlan& plan() const { return plan_; }
    const ModelDims& dims() const { return ctx_.d; }

private:
    friend class Decoder;  // generation runs the layers with caches (model/decoder.cpp)
    enum class Pass { whole, input, weight };  // the backward, its B, its W
    struct Layer {
        RmsNormLayer norm1, norm2;  // input_layernorm, post_attention_layernorm
        std::unique_ptr<AttentionBlock> attn;
        std::unique_ptr<FeedForwardBlock> ffn;
        int unit = -1;  // ZeRO >= 2: its ParamTable::units index
    };
    // Multi-token prediction (the last chunk; model/mtp.cpp, docs/math.md §11).
    struct MtpModule {
        RmsNormLayer enorm, hnorm;   // of the embedding, of the previous depth's hidden state
        std::unique_ptr<Linear> eh;  // eh_proj [C, 2C], its input kept per slot
        Layer block;                 // a decoder layer of the model's kinds; its unit is the module's
        RmsNormLayer head_norm;      // shared_head.norm, before the shared head
    };
    struct Mtp {
        std::vector<MtpModule> modules;
        size_t wte = 0;           // the embedding the modules read (this rank's copy)
        int embed_unit = -1;      // ZeRO >= 2: that copy's unit
        float weight = 0.0f;      // mtp_weight / D
        std::vector<double> sums;   // per slot
        std::vector<float> losses;  // [N] host
        std::vector<int32_t> ids, tgt;  // [N] host: one module's shifted ids and targets
        std::vector<int> masked;        // its rows past the sample's end
    };
    void mtp_build(const ModelConfig& m, const ParamTable& table, double weight);
    void mtp_add_slot(Slot& s);
    // The training forward of every module (their losses in mtp_.sums), or none (evaluation).
    void mtp_forward(int si, const float* params, const int32_t* targets, float grad_scale, bool need_grad);
    // The modules' backward as the pass says, last module first, each part under its unit's
    // scope; returns dL/dh^0 (scratch) for whole and B, null for W.
    float* mtp_backward(int si, const float* params, float* grads, Pass pass);
    void mtp_shift(int ahead, const int32_t* targets);  // module ahead-1's rows: mtp_.ids, tgt, masked
    // Generation (model/decoder.cpp, speculative drafting): module k on slot 0's rows, whose ids
    // (the embedded tokens) and positions the caller set and whose h^{k-1} is in the slot's
    // mtp_h0, its attention through `cache`; h^k [N, C] and the last row's logits [V] to the host.
    void mtp_generate(int k, const float* params, KvCache* cache, float* h_host, float* last_logits_host);
    void run_layers(int si, const float* params, std::vector<std::unique_ptr<KvCache>>* caches);
    // Layer i of slot si on input x into y (the workspace's values under full recompute).
    void forward_layer(size_t i, int si, const float* params, const float* x, float* y, KvCache* cache);
    // One decoder layer's backward (its blocks' slot bs, deferred slot si, input x, saved l) as
    // the pass says: dres, dL/d(its output), becomes dL/dx (whole, B); gradients into G (whole, W).
    void layer_backward(Layer& layer, int bs, int si, const TokenInfo& tok, const LayerSaved& l, const float* x,
                        float* dres, const float* P, float* G, Pass pass);
    // One RMSNorm's backward as the pass says: whole (dx += ..., dw += ...), B (dx += ..., its
    // incoming gradient kept for W) or W (dw += ... from what B kept; dx, dy and P unread).
    void norm_backward(RmsNormLayer& norm, Pass pass, int si, float* dx, float* G, const float* dy, const float* x,
                       const float* P, const float* rstd);
    double loss(Slot& s, const float* params, float grad_scale, bool need_grad);
    // The one reverse walk: the head, the layers, the embedding, as the pass says.
    void backward_pass(int si, const float* params, float* grads, Pass pass);
    void head_backward(int si, const float* params, float* grads, Pass pass);
    void embedding_weight(Slot& s, float* grads);  // the first chunk's last backward step (W)

    Backend& be_;
    TensorParallel& tp_;
    LinearContext lin_;
    BlockContext ctx_;
    ChunkPlan plan_;
    SlotStore store_;
    bool documents_ = false;
    std::vector<Layer> layers_;
    size_t wte_ = 0;                         // the embedding's arena offset (first chunk)
    std::optional<RmsNormLayer> final_norm_;  // last chunk
    std::optional<VocabHead> head_;
    // The head is this rank's own embedding (tied, and held here untied to any other stage):
    // its gradient completes only with the embedding's backward.
    bool head_is_local_embedding_ = false;
    ParamUnits* units_ = nullptr;
    int embed_unit_ = -1, norm_unit_ = -1, head_unit_ = -1;  // ZeRO >= 2: ParamTable::units indices
    VocabParallelScratch xent_;
    std::vector<float> losses_;  // [N] host
    int seq_ = 0;                // T: tokens of a sample (all cp ranks')
    Mtp mtp_;
    RmsProbe* probe_ = nullptr;
    void probe(ProbeKind k, const float* x, const float* minus, size_t n);  // squares of x (- minus)
};

}  // namespace quintet
