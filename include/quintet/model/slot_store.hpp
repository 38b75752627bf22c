// The activation memory of one pipeline chunk and the tokens it is fed (docs/architecture.md,
// "Activation buffers"). What a slot (one microbatch in flight), the full-recompute workspace and
// the blocks' shared scratch hold is declared by the block kinds and linear layers
// (model/buffers.hpp) and laid out by chunk_buffers(), which the planner calls too; SlotStore
// allocates those layouts -- the shared arena at once, a slot on first use, then reused, so the
// steady-state step allocates nothing -- places what W keeps of B under a split schedule, and
// stages each microbatch's tokens, targets, positions and document ids.
#pragma once
#include <cstdint>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/block.hpp"
#include "quintet/model/params.hpp"

namespace quintet {

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
    // The last chunk's MTP modules (model.mtp_depth; docs/math.md §11): per module, what its
    // norms, projection, decoder layer and head keep -- per slot always (never recomputed) --
    // and, split_bw, what their W needs of B.
    std::vector<std::vector<BufferSpec>> mtp;
    size_t mtp_bytes(size_t k) const { return layout_bytes(mtp[k], bf16); }
    std::vector<BufferSpec> shared;              // the blocks' scratch, the context's, operand staging
    size_t ring_kv = 0, ring_out = 0, ring_lse = 0, exchange = 0;  // the largest any layer needs
    size_t operand = 0;                          // bf16: elements of the GEMM operand staging
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

// The decoder's own values of one layer in one slot: its norms' statistics and outputs, the
// residual stream between its blocks.
struct LayerSaved {
    float *rstd1 = nullptr, *h = nullptr, *rstd2 = nullptr;
    Act xn1, xn2;
};

// A layer's saved values from its views, and the declarations of its norms' (the decoder layers'
// and the MTP modules' layers alike).
LayerSaved layer_saved(const BufferViews& v);
void declare_layer_norms(BufferDecl& layer, size_t Nr, size_t C);

// One microbatch in flight.
struct Slot {
    std::vector<float*> res;        // res[i]: input of layer i; res[n_layers]: chunk output
    std::vector<LayerSaved> layers; // (empty under full recompute: the workspace's)
    std::vector<BufferViews> deferred;  // split_bw: per layer, what W keeps of B
    float* dxf = nullptr;           // split_bw, last chunk: the final norm's incoming gradient
    float *rstd_f = nullptr, *logits = nullptr;  // last chunk
    Act xf;
    float *dout = nullptr, *dres = nullptr;
    std::vector<BufferViews> mtp;   // last chunk: each MTP module's values (ChunkBuffers::mtp)
    float* mtp_h0 = nullptr;        // [Nr, C] the final norm's output in fp32: the first module's input
    int32_t* ids = nullptr;         // [N] the microbatch's local ids (first chunk: the embedding backward)
    int32_t* pos_all = nullptr;     // [cp][N] mask positions (this rank's at cp_rank)
    int32_t* rope_pos = nullptr;    // [N] (= this rank's pos unless document_positions)
    int32_t* doc_all = nullptr;     // [cp][N] document ids (document_mask)
    TokenInfo tok;
};

// How the chunk's tokens are laid out on this rank.
struct TokenLayout {
    int B = 1, T = 1, T_local = 1;  // samples, their tokens, the rows of each on this rank
    ContextParallel* cp = nullptr;  // chunks r and 2cp-1-r of each sample (null: cp = 1)
    bool document_mask = false, document_positions = false;
    int eos_id = -1;
};

class SlotStore {
public:
    SlotStore(Backend& be, ChunkBuffers buffers, const TokenLayout& tokens, const ChunkPlan& plan);
    ~SlotStore();
    SlotStore(const SlotStore&) = delete;
    SlotStore& operator=(const SlotStore&) = delete;

    const ChunkBuffers& buffers() const { return buffers_; }
    const BufferViews& shared() const { return shared_; }

    // One more slot. Its layers' views (the workspace's, once, under full recompute), for the
    // blocks: `saved(i)` then the deferred ones in slot.deferred (or the shared scratch).
    struct Added {
        int index = 0;
        std::vector<BufferViews> saved;  // per layer; empty when nothing new (full recompute after the first)
    };
    Added add_slot();
    Slot& slot(int i) { return slots_[size_t(i)]; }
    int slots() const { return int(slots_.size()); }
    // The layer values of slot si, and the blocks' slot they use (full recompute: one, shared).
    LayerSaved& layer(int si, int i) { return full_recompute() ? ws_layers_[size_t(i)] : slots_[size_t(si)].layers[size_t(i)]; }
    int block_slot(int si) const { return full_recompute() ? 0 : si; }
    float* recompute_out() const { return recompute_out_; }

    // The microbatch's ids and targets (host [B*T]) as this rank's rows, the vocabulary shard
    // [v0, v1) local (-1 elsewhere); positions and documents from the ids (document masks).
    void set_tokens(Slot& s, const int32_t* ids, const int32_t* targets, int v0, int v1);
    void set_positions(Slot& s, const int32_t* ids);
    // Generation: the queries' positions pos0, pos0 + 1, ... (one sequence, no cp).
    void set_positions_from(Slot& s, int pos0);
    // Generation of several sequences: each query row's own position (host, B*T of them).
    void set_positions_at(Slot& s, const int32_t* positions);
    const int32_t* targets() const { return tgt_; }
    bool positions_from_ids() const { return tok_.document_mask || tok_.document_positions; }
    int global_position(int rank, int t) const;  // row t of a sample on cp rank `rank`

private:
    bool full_recompute() const { return buffers_.full_recompute; }
    void* arena(size_t bytes);  // backend memory owned here (zeroed, 64-byte aligned)

    Backend& be_;
    ChunkBuffers buffers_;
    TokenLayout tok_;
    ChunkPlan plan_;
    int cp_rank_ = 0, cp_size_ = 1;
    std::vector<float*> arenas_;          // the shared arena, the workspace, one per slot
    BufferViews shared_;
    std::vector<Slot> slots_;
    std::vector<LayerSaved> ws_layers_;   // full recompute: every layer's (shared) values
    float* recompute_out_ = nullptr;      // full recompute: the recomputed layer's output [Nr, C]
    int32_t* tgt_ = nullptr;              // [N] vocabulary-shard-local targets (-1: elsewhere)
    struct HostStaging {
        std::vector<int32_t> ids, tgt, pos, rope, doc;
    } host_;
};

}  // namespace quintet
