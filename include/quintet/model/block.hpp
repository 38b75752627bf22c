// The two blocks of a decoder layer as modules (docs/architecture.md, "The seams"): an attention
// block (model.attention: mha = GQA in model/mha.cpp; mla in model/mla.cpp) and a feed-forward block
// (SwiGLU in model/swiglu.cpp; MoE in model/moe.cpp). Each block kind adds its own tensors to the parameter
// table, allocates its own saved activations per microbatch slot, and owns an explicit forward
// and backward with its collectives. ModelChunk (model/transformer.hpp) composes them per layer
// from the deck, with the RMSNorms and the residual stream around them:
//     h = x + Attention(RMSNorm(x)),   y = h + FeedForward(RMSNorm(h)).
//
// Each block kind is its linear layers (model/linear.hpp: they own the GEMMs, the precision, the
// tensor-parallel collectives and what W needs of B) around its core operation (attention and
// RoPE, the SwiGLU, the router and the token dispatch): its backward is the core's backward
// between its linears' B, and its W is its linears' (and norms') W.
//
// BlockContext is what the blocks of one chunk share: the linear layers' context, the backend,
// the axes, the dimensions and the RoPE tables. Row counts: N = B*T tokens of a microbatch;
// Nr = N/tp rows of the residual stream under sequence parallelism, else N.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/buffers.hpp"
#include "quintet/model/kv_cache.hpp"
#include "quintet/model/linear.hpp"
#include "quintet/model/probe.hpp"
#include "quintet/model/moe_counts.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/context_parallel.hpp"
#include "quintet/parallel/expert_parallel.hpp"
#include "quintet/parallel/grad_ready.hpp"
#include "quintet/parallel/tensor_parallel.hpp"

namespace quintet {

// The tokens of one microbatch as the blocks see them (backend int32 memory). Under context
// parallelism a rank holds N = B * T/cp rows; the *_all arrays hold every cp rank's rows,
// rank-major [cp][N] (the keys of the ring), and equal the local ones when cp = 1.
struct TokenInfo {
    const int32_t* pos = nullptr;       // [N] each row's index in its sample: the causal mask
    const int32_t* rope_pos = nullptr;  // [N] the position RoPE rotates by (restarts per document
                                        //     under rope.document_positions)
    const int32_t* doc = nullptr;       // [N] document id of each row, or null: no document mask
    const int32_t* pos_all = nullptr;   // [cp][N]
    const int32_t* doc_all = nullptr;   // [cp][N] or null
};

class BlockContext {
public:
    // T: rows per sample on this rank (seq_len / cp). max_positions: RoPE tables cover
    // positions [0, max_positions); rope_seq_len stands in for rope.original_max_position when
    // that is 0. cp: the context-parallel ring (null: cp = 1).
    BlockContext(LinearContext& lin, const ModelDims& d, int B, int T, const RopeConfig& rope, int rope_seq_len,
                 int max_positions, ContextParallel* cp = nullptr, Recompute recompute = Recompute::none);
    BlockContext(const BlockContext&) = delete;
    BlockContext& operator=(const BlockContext&) = delete;

    LinearContext& lin;  // what the blocks' linear layers share (precision, tp, scratch, hook)
    Backend& be;
    TensorParallel& tp;
    const ModelDims d;
    const int B, T, N, Nr;
    const RopeConfig rope;
    const int rope_seq_len, max_positions;
    ContextParallel* const cp;  // null without context parallelism
    ExpertParallel* ep = nullptr;  // MoE's token exchange; null without expert parallelism
    double attn_mult = 1.0;        // the attention score scale's multiplier (µP; ModelConfig::attn_mult)
    const Recompute recompute;
    bool bf16() const { return lin.bf16(); }
    const BufferViews& shared() const { return lin.shared(); }  // every block's named scratch

    // RoPE cos/sin tables [max_positions, dim/2] over `dim` rotated columns, shared by the
    // blocks; `amplitude` multiplies both (MHA folds YaRN's mscale in here). A block declares
    // the tables it will ask for with declare_rope_table.
    struct RopeTable {
        const float* cos;
        const float* sin;
    };
    RopeTable rope_table(int dim, double amplitude);
    static void declare_rope_table(BufferDecl& out, int dim, int max_positions);

    // MoE's load-balancing loss: d(step loss)/d(this microbatch's aux) = aux_coef * aux_scale
    // (1 / the step's microbatches over all replicas; the trainer sets it). recomputing: the
    // forward being run is train.recompute = full's second one (count nothing twice).
    double aux_scale = 1.0;
    bool recomputing = false;

private:
    std::vector<std::pair<int, double>> rope_filled_;  // tables filled so far: width, amplitude
};

// The squares of q.k x scale over the causal pairs of each sample and head (rows of q and k in
// backend memory at the strides given; kv head of query head h: h / (NH / NKV)): the attention
// blocks' probe_logits.
void probe_scores(Backend& be, const AttentionArgs& a, const float* q, const float* k, const int32_t* pos,
                  RmsProbe& out);

// h[Nr, C] = x[Nr, C] + Attention(xn) for layer `layer`.
class AttentionBlock {
public:
    virtual ~AttentionBlock() = default;
    // The saved activations of one more microbatch in flight: views of what the kind declared.
    virtual void add_slot(const BufferViews& saved) = 0;
    // xn: RMSNorm(x), this rank's rows, saved in the chunk's precision. With `cache` the rows
    // are new tokens of one sequence (B = 1) at positions tok.pos, which are appended to the
    // cache and attend to everything cached so far (no backward follows).
    virtual void forward(int slot, const TokenInfo& tok, const float* params, const Act& xn,
                         const float* x, float* h, KvCache* cache = nullptr) = 0;
    // What the block's W needs of its B for one more microbatch: views of what the kind declared
    // deferred (per slot under a split schedule, else the chunk's shared scratch). The n-th call
    // is `wslot` n below.
    virtual void add_w_slot(const BufferViews& w) = 0;
    // The backward in two parts (docs/parallelism.md, "Zero-bubble schedules"). B, from
    // dh[Nr, C] = dL/dh: returns dL/dxn [Nr, C] (this rank's rows; scratch valid until the next
    // call) and keeps what W needs in deferred slot `wslot`; writes no parameter gradient.
    virtual const float* backward_input(int slot, int wslot, const TokenInfo& tok, const float* params,
                                        const Act& xn, const float* dh) = 0;
    // W: the parameter gradients, accumulated into `grads` (and reported to ctx.done), from what
    // B kept and the forward's saved values. `later`: other work ran since B (a split schedule),
    // so what selective recomputation shares is recomputed first. B then W at once is the whole
    // backward, bit for bit.
    virtual void backward_weight(int slot, int wslot, const TokenInfo& tok, float* grads, const Act& xn,
                                 bool later) = 0;
    // full_kv: cache what training attends to (per-head K and V) even where the kind has a
    // compressed form (MLA's latent); for measuring what the compression saves. `sequences`:
    // how many sequences it holds (decoded together).
    virtual std::unique_ptr<KvCache> make_cache(int max_len, bool full_kv = false, int sequences = 1) const = 0;
    // train.probe_rms: the squares of the scores q.k x scale of slot's last forward, over this
    // rank's causal (query, key) pairs of each sample and head (host work: a diagnostic).
    virtual void probe_logits(int slot, const TokenInfo& tok, RmsProbe& out) const = 0;
};

// y[Nr, C] = h[Nr, C] + FeedForward(hn) for layer `layer`.
class FeedForwardBlock {
public:
    virtual ~FeedForwardBlock() = default;
    virtual void add_slot(const BufferViews& saved) = 0;
    virtual void add_w_slot(const BufferViews& w) = 0;  // as AttentionBlock's
    virtual void forward(int slot, const float* params, const Act& hn, const float* h, float* y) = 0;
    // The backward in two parts, as AttentionBlock's: B returns dL/dhn, W the weight gradients.
    virtual const float* backward_input(int slot, int wslot, const float* params, const Act& hn,
                                        const float* dy) = 0;
    virtual void backward_weight(int slot, int wslot, float* grads, const Act& hn) = 0;
    // This microbatch's auxiliary loss (MoE load balancing), already weighted; 0 for dense.
    virtual double aux_loss(int slot) const { (void)slot; return 0.0; }
    // MoE: experts (0 for dense); what the block counted since it was last asked, added to
    // layer `layer` of `out` (and reset); the aux-free bias moved from the global batch's loads
    // (`step`, summed over every rank).
    virtual int experts() const { return 0; }
    virtual void take_counts(MoeCounts& out, int layer) { (void)out, (void)layer; }
    virtual void update_bias(float* params, const MoeCounts& step, int layer) { (void)params, (void)step, (void)layer; }
};

// The block kinds: their tensors (ParamBuilder), their activation buffers (BufferDecl) and
// their instances for one chunk (which read their shared scratch from ctx.shared()).
void attention_add_params(const ModelConfig& m, ParamBuilder& b, int layer);
void feed_forward_add_params(const ModelConfig& m, ParamBuilder& b, int layer);
void attention_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, int layer,
                               BufferDecl& out);
void feed_forward_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, int layer,
                                  BufferDecl& out);
std::unique_ptr<AttentionBlock> make_attention_block(BlockContext& ctx, const ModelConfig& m,
                                                     const ParamTable& table, int layer);
std::unique_ptr<FeedForwardBlock> make_feed_forward_block(BlockContext& ctx,
                                                          const ModelConfig& m,
                                                          const ParamTable& table, int layer);

}  // namespace quintet
