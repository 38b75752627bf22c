// One pipeline chunk of the Llama-style decoder on this rank: the embedding (first chunk),
// layers [layer_begin, layer_end), and the final norm + LM head + loss (last chunk). Each layer
// is an attention block and a feed-forward block (model/block.hpp), of the kinds the deck names,
// with the RMSNorms and the residual stream around them; tensor-parallel over `tp`. No autograd
// tape: every block has an explicit backward.
//
// Activations saved for backward live in slots, one per microbatch in flight (the pipeline
// schedule decides how many); slots are allocated on first use and reused, so the steady-state
// step allocates nothing. What a slot, the full-recompute workspace and the blocks' shared
// scratch hold is declared by the block kinds (model/buffers.hpp) and laid out by
// chunk_buffers() below, which the planner calls too. Parameters and gradients live in the
// caller's arenas.
//
// The same chunk generates text (quintet generate): forward_cached runs the same blocks on new
// tokens with a KV cache per attention block.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/block.hpp"
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
};

// One chunk's activation memory, laid out from its blocks' declarations (no backend: the
// planner counts it without building the model).
struct ChunkBuffers {
    bool bf16 = false, full_recompute = false, split_bw = false;
    std::vector<BufferSpec> own;                 // per slot: the residual stream, head, tokens
    std::vector<std::vector<BufferSpec>> layer;  // per layer: what its norms and blocks keep
    // split_bw: per layer and slot, what its W needs of its B (the blocks' deferred buffers and
    // the norms' incoming gradients), kept even under full recomputation.
    std::vector<std::vector<BufferSpec>> deferred;
    // split_bw without full recomputation: the deferred buffers that live in a saved buffer B
    // has read (BufferSpec::over), per layer; they take no bytes of their own.
    std::vector<std::vector<PlacedBuffer>> placed;
    std::vector<BufferSpec> workspace_own;       // full recompute: the recomputed layer's output
    std::vector<BufferSpec> shared;              // the blocks' scratch, the context's, operand staging
    size_t ring_kv = 0, ring_out = 0, ring_lse = 0, exchange = 0;  // the largest any layer needs
    size_t layer_bytes(size_t i) const { return layout_bytes(layer[i], bf16); }
    size_t deferred_bytes(size_t i) const { return split_bw ? layout_bytes(deferred[i], bf16) : 0; }
    size_t largest_layer_bytes() const;
    // One slot (one microbatch in flight): the chunk's own values and, unless full recompute,
    // every layer's (and, split_bw, every layer's deferred ones).
    size_t slot_bytes() const;
    // Full recompute: one layer's values, which every layer reuses in turn, and its output.
    size_t workspace_bytes() const;
    size_t shared_bytes() const { return layout_bytes(shared, bf16); }
};
// `documents`: data.document_mask (per-slot document ids for the attention mask).
ChunkBuffers chunk_buffers(const ModelConfig& m, const ModelDims& d, const ChunkPlan& plan, const BufferShape& s,
                           bool documents);

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
    // MoE: the largest expert count of this chunk's layers (0: dense); the counts of this step
    // added into `counts` by layer (and reset); the aux-free biases moved from the global
    // batch's loads (the same on every rank); d(loss)/d(aux) per microbatch.
    int moe_experts() const;
    void take_moe_counts(MoeCounts& counts);
    void update_balance_bias(float* params, const MoeCounts& step);
    void set_aux_scale(double s) { ctx_.aux_scale = s; }
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

    // Generation (whole model, tp = 1, B = 1): caches[l] is layer l's cache. Feeds the T rows
    // of `ids` (host [T]) at positions pos0, pos0+1, ... and returns the logits of the last row
    // (host [V], valid until the next call).
    std::vector<std::unique_ptr<KvCache>> make_caches(int max_len, bool full_kv = false) const;
    const std::vector<float>& forward_cached(const float* params, const int32_t* ids, int pos0,
                                             std::vector<std::unique_ptr<KvCache>>& caches);

    // bf16 only: the weights the GEMMs read are shadow[i] = bf16(master[i]) for the arena
    // `master` (the caller refreshes the shadow after every optimizer step). forward/backward
    // must then be given params == master.
    void set_bf16_weights(const float* master, const bf16_bits* shadow);
    Precision precision() const { return ctx_.bf16() ? Precision::bf16 : Precision::fp32; }

    int add_slot() override;  // allocates one more slot; returns its index
    int slots() const override { return int(slots_.size()); }
    float* input(int s) override { return slots_[s].res[0]; }        // [Nr, C] from the previous stage
    float* output(int s) override { return slots_[s].res.back(); }   // [Nr, C] to the next stage
    float* grad_output(int s) override { return slots_[s].dout; }    // [Nr, C] from the next stage
    float* grad_input(int s) override { return slots_[s].dres; }     // [Nr, C] to the previous stage
    size_t boundary_floats() const override { return size_t(ctx_.Nr) * ctx_.d.C; }
    size_t slot_bytes() const override { return buffers_.slot_bytes(); }
    // Activations kept once for all slots (full recompute: one layer's worth, shared).
    size_t workspace_bytes() const override { return buffers_.workspace_bytes(); }
    // Buffers kept once besides those: the blocks' shared scratch and operand staging.
    size_t scratch_bytes() const { return buffers_.shared_bytes(); }
    const ChunkBuffers& buffers() const { return buffers_; }
    bool needs_tokens() const override { return plan_.first || plan_.last || docs_; }
    // The last chunk's per-row cross-entropies of its last forward (host [N], this rank's rows),
    // and the position in its sample of local row n.
    const std::vector<float>& token_losses() const { return losses_; }
    int position_of_row(int n) const { return global_position(cp_rank_, n % ctx_.T); }
    const ChunkPlan& plan() const { return plan_; }
    const ModelDims& dims() const { return ctx_.d; }

private:
    struct Layer {
        std::unique_ptr<AttentionBlock> attn;
        std::unique_ptr<FeedForwardBlock> ffn;
        size_t ln1 = 0, ln2 = 0;  // norm weights' offsets in the arena
    };
    struct LayerSaved {  // per slot, per layer
        float *rstd1, *h, *rstd2;
        Act xn1, xn2;
    };
    struct LayerDeferred {  // per slot, per layer (split_bw): the norms' incoming gradients, B -> W
        float *dy1 = nullptr, *dy2 = nullptr;  // [Nr, C]
    };
    struct Slot {
        std::vector<float*> res;  // res[i]: input of layer i; res[n_layers]: chunk output
        std::vector<LayerSaved> layers;
        std::vector<LayerDeferred> deferred;         // split_bw
        float* dxf = nullptr;                        // split_bw, last chunk: the final norm's incoming gradient
        float *rstd_f = nullptr, *logits = nullptr;  // last chunk
        Act xf;
        float *dout = nullptr, *dres = nullptr;
        int32_t* ids = nullptr;  // [N] the microbatch's local ids (first chunk: the embedding backward)
        int32_t* pos_all = nullptr;   // [cp][N] mask positions (this rank's at cp_rank)
        int32_t* rope_pos = nullptr;  // [N] (= this rank's pos unless document_positions)
        int32_t* doc_all = nullptr;   // [cp][N] document ids (document_mask)
        TokenInfo tok;
    };
    // Row t of sample b on this rank <- position p of the sample (context parallelism).
    int global_position(int rank, int t) const;
    void set_positions(Slot& s, const int32_t* ids);
    void set_tokens(Slot& s, const int32_t* ids, const int32_t* targets);
    void run_layers(Slot& s, const float* params, std::vector<std::unique_ptr<KvCache>>* caches);
    // Layer i on input x into y: its blocks' slot `bslot`, the norms' saved values in `l`.
    void forward_layer(size_t i, int bslot, LayerSaved& l, const TokenInfo& tok, const float* params,
                       const float* x, float* y, KvCache* cache);
    static LayerSaved layer_saved(const BufferViews& v);
    void embedding_weight(Slot& s, float* grads);  // the first chunk's last backward step (W)
    void recompute_layer(size_t i, Slot& s, const float* params);  // full recompute: layer i's forward again
    // The last chunk's first backward step; weight: also the head's and norm's gradients.
    void head_input(Slot& s, const float* params, float* grads, bool weight);
    void head_done(float* grads);
    // Units (ZeRO >= 2), or the whole arenas: the parameters of `unit` (base pointer; bf16
    // weights set), the unit released, the next one prefetched; its gradient window, then
    // reduced. Without units these return the arenas and do nothing else.
    const float* use(int unit, const float* params);
    void release(int unit) { if (units_ && unit >= 0) units_->release(unit); }
    void prefetch(int unit) { if (units_ && unit >= 0) units_->prefetch(unit); }
    float* grads_of(int unit, float* grads) { return units_ ? units_->grads(unit) : grads; }
    void reduce(int unit) { if (units_ && unit >= 0) units_->reduce(unit); }
    void* arena(size_t bytes);  // backend memory owned by the chunk (64-byte aligned)
    double loss(Slot& s, const float* params, float grad_scale, bool need_grad);

    Backend& be_;
    TensorParallel& tp_;
    ContextParallel* cp_;
    int T_global_, cp_size_ = 1, cp_rank_ = 0;
    bool docs_ = false, doc_positions_ = false;
    int eos_id_ = -1;
    std::vector<int32_t> host_pos_, host_rope_, host_doc_;  // staging for set_positions
    BlockContext ctx_;
    ChunkPlan plan_;
    float eps_;
    ChunkBuffers buffers_;
    std::vector<float*> arenas_;            // the shared arena, the workspace, one per slot
    size_t wte_ = 0, norm_ = 0, head_ = 0;  // arena offsets (first / last chunk)
    std::vector<Layer> layers_;
    int32_t* tgt_;                      // [N] vocabulary-shard-local targets (-1: elsewhere)
    std::vector<int32_t> host_ids_, host_tgt_;
    std::vector<float> losses_;         // [N] host
    std::vector<float> logits_host_;    // [V] generation
    VocabParallelScratch xent_;
    std::vector<Slot> slots_;
    bool full_recompute_ = false;
    bool split_bw_ = false;
    // The head is this rank's own embedding (tied, and held here untied to any other stage):
    // its gradient completes only with the embedding's backward.
    bool head_is_local_embedding_ = false;
    ParamUnits* units_ = nullptr;
    int embed_unit_ = -1, norm_unit_ = -1, head_unit_ = -1;  // ZeRO >= 2: ParamTable::units indices
    std::vector<int> layer_unit_;                           // per layer of the chunk (-1 without units)
    std::vector<LayerSaved> ws_layers_;  // full recompute: every layer's (shared) saved values
    float* recompute_out_ = nullptr;     // full recompute: the recomputed layer's output [Nr, C]
};

}  // namespace quintet
