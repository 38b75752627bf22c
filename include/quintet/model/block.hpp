// The two blocks of a decoder layer as modules (docs/architecture.md, "The seams"): an attention
// block (model.attention: mha = GQA in model/mha.cpp; mla in model/mla.cpp) and a feed-forward block
// (SwiGLU in model/swiglu.cpp; MoE in model/moe.cpp). Each block kind adds its own tensors to the parameter
// table, allocates its own saved activations per microbatch slot, and owns an explicit forward
// and backward with its collectives. ModelChunk (model/transformer.hpp) composes them per layer
// from the deck, with the RMSNorms and the residual stream around them:
//     h = x + Attention(RMSNorm(x)),   y = h + FeedForward(RMSNorm(h)).
//
// BlockContext is what the blocks of one chunk share: the backend, the tensor-parallel
// communicator, the precision (fp32, or bf16 GEMM operands), scratch that one microbatch at a
// time uses, and the hook told of finished gradients. Row counts: N = B*T tokens of a microbatch;
// Nr = N/tp rows of the residual stream under sequence parallelism, else N.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/buffers.hpp"
#include "quintet/model/moe_counts.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/context_parallel.hpp"
#include "quintet/parallel/expert_parallel.hpp"
#include "quintet/parallel/grad_ready.hpp"
#include "quintet/parallel/tensor_parallel.hpp"

namespace quintet {

// fp32: everything in fp32. bf16 (docs/cuda.md "bf16"): every linear layer multiplies bf16
// operands with fp32 accumulation -- a bf16 shadow of the fp32 master weights, and bf16
// activations: the saved inputs of the linear layers are stored only in bf16; the residual
// stream, norms' statistics, attention's softmax and the loss stay fp32; gradients are fp32.
enum class Precision { fp32, bf16 };

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
    BlockContext(Backend& be, TensorParallel& tp, const ModelDims& d, int B, int T, Precision p,
                 const RopeConfig& rope, int rope_seq_len, int max_positions,
                 ContextParallel* cp = nullptr, Recompute recompute = Recompute::none, bool split_bw = false);
    BlockContext(const BlockContext&) = delete;
    BlockContext& operator=(const BlockContext&) = delete;

    Backend& be;
    TensorParallel& tp;
    const ModelDims d;
    const int B, T, N, Nr;
    const RopeConfig rope;
    const int rope_seq_len, max_positions;
    ContextParallel* const cp;  // null without context parallelism
    ExpertParallel* ep = nullptr;  // MoE's token exchange; null without expert parallelism
    const Recompute recompute;
    // The schedule runs each backward's W later than its B (BufferShape::split_bw).
    const bool split_bw;
    bool bf16() const { return bf16_; }

    // What the context itself uses of the chunk's shared arena (declare), and where it is once
    // the chunk has laid it out (bind; before any block is made). `operand_n`: the elements of the
    // bf16 operand staging, the widest any block declared.
    static void declare(const ModelDims& d, const BufferShape& s, BufferDecl& out);
    void bind(const BufferViews& shared, size_t operand_n);
    const BufferViews& shared() const { return shared_; }  // every block's named scratch

    // RoPE cos/sin tables [max_positions, dim/2] over `dim` rotated columns, shared by the
    // blocks; `amplitude` multiplies both (MHA folds YaRN's mscale in here). A block declares
    // the tables it will ask for with declare_rope_table.
    struct RopeTable {
        const float* cos;
        const float* sin;
    };
    RopeTable rope_table(int dim, double amplitude);
    static void declare_rope_table(BufferDecl& out, int dim, int max_positions);

    // Shared scratch: one microbatch computes at a time, so blocks reuse these.
    float* full_a = nullptr;  // [N, C] gathered rows (SP), fp32 staging of a saved value
    float* full_b = nullptr;  // [N, C] partial sums before the tp reduction
    float* dshard = nullptr;  // [Nr, C] reduce-scatter output

    // ---- GEMMs in the chunk's precision ----
    // Where a kernel writes a value to be saved as `a`: a.f, or fp32 scratch to be kept by keep().
    float* produce(const Act& a, float* staging) const { return bf16_ ? staging : a.f; }
    void keep(const Act& a, const float* staging, size_t n);
    Mat local(const Act& a) const { return {a.f, a.b}; }
    Mat gathered(const Act& a, size_t rows, size_t C);  // tp.gather in the stored precision
    Mat lowp(const float* x, size_t n);                 // x, as a GEMM operand (bf16: into lowp_)
    // x[n] kept in `w` (a deferred buffer, Elem::act) as the GEMM operand lowp(x) would be -- the
    // same bits -- for B now and W later. No copy when x is already w.f (see produce()).
    // Without a split schedule W follows B at once, so in fp32 save() copies nothing: it notes x
    // as w's stand-in, and W reads through deferred(w) (w itself otherwise).
    Mat save(const Act& w, const float* x, size_t n);
    Mat deferred(const Act& w) const;
    Mat weight(const float* w) const { return {w, bf16_ ? shadow_ + (w - master_) : nullptr}; }
    // C[M,N] = op(A) op(B) + beta * C in the chunk's precision.
    // The role the next GEMMs are profiled under (`train.profile`): "gemm.<role>.fwd|dx|dw" by
    // the transposes (X W^T, dY W, dY^T X). Role r = c.role("gemm.attn_qkv") sets it for a scope.
    const char* gemm_role = "gemm.other";
    struct Role {
        BlockContext& c;
        const char* before;
        Role(BlockContext& ctx, const char* r) : c(ctx), before(ctx.gemm_role) { c.gemm_role = r; }
        ~Role() { c.gemm_role = before; }
    };
    Role role(const char* r) { return Role(*this, r); }
    void mm(bool ta, bool tb, int M, int N, int K, Mat A, int lda, Mat B, int ldb, float beta,
            float* C, int ldc);
    // out[Nr,C] = res[Nr,C] + (X[N,K] W[C,K]^T summed over tp): a row-parallel block + residual.
    // collective over tp
    void row_parallel_residual(float* out, const float* res, Mat X, int K, const float* W);

    // bf16 only: the GEMMs read shadow[i] = bf16(master[i]) for the arena `master`.
    void set_bf16_weights(const float* master, const bf16_bits* shadow);
    const float* master() const { return master_; }

    // MoE's load-balancing loss: d(step loss)/d(this microbatch's aux) = aux_coef * aux_scale
    // (1 / the step's microbatches over all replicas; the trainer sets it). recomputing: the
    // forward being run is train.recompute = full's second one (count nothing twice).
    double aux_scale = 1.0;
    bool recomputing = false;

    // The hook of the current backward (or null), told of each finished gradient.
    GradReadyHook* hook = nullptr;
    void done(float* g, size_t n) {
        if (hook) hook->ready(g, n);
    }

private:
    bool bf16_ = false;
    const float* master_ = nullptr;  // bf16: the fp32 arena the shadow mirrors
    const bf16_bits* shadow_ = nullptr;
    BufferViews shared_;
    bf16_bits *lowp_ = nullptr, *gather_bf16_ = nullptr;  // bf16 scratch: operands, SP gathers
    size_t lowp_n_ = 0;
    // save()'s stand-ins (deferred buffer -> B's own buffer); more than fit fall back to a copy.
    std::array<std::pair<const float*, const float*>, 32> stand_in_{};
    int n_stand_in_ = 0;
    std::vector<std::pair<int, double>> rope_filled_;  // tables filled so far: width, amplitude
};

// A generation cache for one attention block (quintet generate): what the block keeps of every
// past token so that each new token costs one row of work. Each attention kind has its own.
struct KvCache {
    virtual ~KvCache() = default;
    virtual size_t bytes_per_token() const = 0;
};

// What every cache keeps beside its rows: the positions 0, 1, ... of the cached tokens (backend
// memory: the keys' positions the causal mask reads) and how many tokens are cached.
struct PositionedCache : KvCache {
    PositionedCache(Backend& be, int max_len);
    ~PositionedCache() override;
    PositionedCache(const PositionedCache&) = delete;
    PositionedCache& operator=(const PositionedCache&) = delete;
    Backend& be;
    int32_t* pos = nullptr;  // [max_len]
    int len = 0, max_len = 0;
};

// Per token, the keys [kw] and the values [vw] that attention reads (MHA's K|V of its kv
// heads; MLA's uncompressed per-head K|V).
struct KvRowsCache final : PositionedCache {
    KvRowsCache(Backend& be, int max_len, int kw, int vw);
    ~KvRowsCache() override;
    size_t bytes_per_token() const override { return size_t(kw + vw) * sizeof(float); }
    float *k = nullptr, *v = nullptr;  // [max_len, kw], [max_len, vw]
    int kw = 0, vw = 0;
};

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
    virtual void add_deferred(const BufferViews& w) = 0;
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
    // compressed form (MLA's latent); for measuring what the compression saves.
    virtual std::unique_ptr<KvCache> make_cache(int max_len, bool full_kv = false) const = 0;
};

// y[Nr, C] = h[Nr, C] + FeedForward(hn) for layer `layer`.
class FeedForwardBlock {
public:
    virtual ~FeedForwardBlock() = default;
    virtual void add_slot(const BufferViews& saved) = 0;
    virtual void add_deferred(const BufferViews& w) = 0;  // as AttentionBlock's
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
