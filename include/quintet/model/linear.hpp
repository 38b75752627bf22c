// The linear layers, the unit every block is built from (docs/architecture.md, "Linear layers"):
// y = x W^T with W one weight of the parameter table, [out, in] as this rank holds it. A linear
// layer owns everything about its matmuls that is not the block's maths:
//   - its weight's place in the arena, and the gradient-ready notification once W has run;
//   - the GEMM precision (fp32, or bf16 operands with fp32 accumulation from the bf16 shadow of
//     the fp32 master weights) and its profile role (gemm.<role>.fwd|dx|dw);
//   - what its weight gradient needs: its input (the block's input, or a value it keeps per
//     microbatch slot in the chunk's activation precision) and its output gradient, which B keeps
//     for W (per slot under a split schedule, where the declaration says it may live);
//   - for the tensor-parallel kinds, the collective at its edge (with sequence parallelism).
// Its backward is B (`backward_input`: the input's gradient, the output gradient kept) then W
// (`backward_weight`: dW += dY^T X); B then W at once is the whole backward, bit for bit.
//
// The kinds: Linear (no collective: the input is whole on this rank), ColumnLinear (Megatron's
// column-parallel layer: the input rows gathered over tp under sequence parallelism, the input
// gradient's partial sums reduced over tp), RowLinear (row-parallel: the output's partial sums
// reduced over tp and added to the residual stream), GroupedLinear (the MoE experts: one weight
// per local expert over its rows) and VocabHead (the vocabulary-parallel LM head and its loss).
#pragma once
#include <array>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/buffers.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/grad_ready.hpp"
#include "quintet/parallel/tensor_parallel.hpp"
#include "quintet/parallel/vocab_parallel.hpp"

namespace quintet {

// fp32: everything in fp32. bf16 (docs/cuda.md "bf16"): every linear layer multiplies bf16
// operands with fp32 accumulation -- a bf16 shadow of the fp32 master weights, and bf16
// activations: the saved inputs of the linear layers are stored only in bf16; the residual
// stream, norms' statistics, attention's softmax and the loss stay fp32; gradients are fp32.
enum class Precision { fp32, bf16 };

// What the linear layers of one chunk share: the backend, the tp group, the precision with its
// bf16 shadow and operand staging, the tp scratch, the gradient hook of the current backward.
class LinearContext {
public:
    // N rows per microbatch (Nr of them this rank's under sequence parallelism), width C.
    LinearContext(Backend& be, TensorParallel& tp, int N, int C, Precision p, bool split_bw);
    LinearContext(const LinearContext&) = delete;
    LinearContext& operator=(const LinearContext&) = delete;

    Backend& be;
    TensorParallel& tp;
    const int N, Nr, C;
    // The schedule runs each backward's W later than its B (BufferShape::split_bw).
    const bool split_bw;
    bool bf16() const { return bf16_; }
    const BufferViews& shared() const { return shared_; }  // the chunk's shared arena

    // What the linear layers use of the chunk's shared arena (declare), and where it is once the
    // chunk has laid it out (bind; before any linear layer is made). `operand_n`: the elements of
    // the bf16 operand staging, the widest any block declared.
    static void declare(int C, const BufferShape& s, BufferDecl& out);
    void bind(const BufferViews& shared, size_t operand_n);

    // Scratch one microbatch at a time uses: rows gathered over tp (SP) / staging, partial sums
    // before the tp reduction, the reduce-scatter output.
    float* full_a = nullptr;  // [N, C]
    float* full_b = nullptr;  // [N, C]
    float* dshard = nullptr;  // [Nr, C]

    // bf16 only: the GEMMs read shadow[i] = bf16(master[i]) for the arena `master`.
    void set_bf16_weights(const float* master, const bf16_bits* shadow);
    const float* master() const { return master_; }

    // The hook of the current backward (or null), told of each finished gradient.
    GradReadyHook* hook = nullptr;
    void done(float* g, size_t n) {
        if (hook) hook->ready(g, n);
    }

    // ---- what the linear layers (and the loss head) build on ----
    // C[M,N] = op(A) op(B) + beta * C in the chunk's precision, profiled as gemm.<role>.fwd|dx|dw.
    void mm(const char* role, bool ta, bool tb, int M, int N, int K, Mat A, int lda, Mat B, int ldb, float beta,
            float* C, int ldc, float alpha = 1.0f);
    Mat weight(const float* w) const { return {w, bf16_ ? shadow_ + (w - master_) : nullptr}; }
    Mat local(const Act& a) const { return {a.f, a.b}; }
    Mat gathered(const Act& a, size_t rows, size_t C);  // tp.gather in the stored precision
    Mat lowp(const float* x, size_t n);                 // x, as a GEMM operand (bf16: into staging)
    // A value kept in the activation precision: where its producer writes it in fp32 (a.f, or
    // fp32 staging), then the write is finished (bf16: rounded into a.b).
    float* produce(const Act& a, float* staging) const { return bf16_ ? staging : a.f; }
    void keep(const Act& a, const float* staging, size_t n);
    // x[n] kept in `w` (a deferred buffer) as the GEMM operand lowp(x) would be -- the same bits
    // -- for B now and W later. No copy when x is already w.f. Without a split schedule W follows
    // B at once, so in fp32 nothing is copied: x is noted as w's stand-in, and W reads it through
    // deferred(w).
    Mat save(const Act& w, const float* x, size_t n);
    Mat deferred(const Act& w) const;

private:
    bool bf16_ = false;
    BufferViews shared_;
    const float* master_ = nullptr;  // bf16: the fp32 arena the shadow mirrors
    const bf16_bits* shadow_ = nullptr;
    bf16_bits *lowp_ = nullptr, *gather_bf16_ = nullptr;  // bf16 scratch: operands, SP gathers
    size_t lowp_n_ = 0;
    // save()'s stand-ins (deferred buffer -> B's own buffer); more than fit fall back to a copy.
    std::array<std::pair<const float*, const float*>, 32> stand_in_{};
    int n_stand_in_ = 0;
};

// The names of a linear layer's buffers, from one id (e.g. "attn.qkv"): its kept output gradient
// `w.<id>.dy`, the fp32 staging of that gradient `<id>.dy32`, its kept input `<id>.in`.
struct LinearNames {
    std::string dy, dy32, in;
    explicit LinearNames(std::string_view id);
};

// What a linear layer's buffers depend on (its block kind's declarations; the planner lays them
// out too). Its input is the block's (kept by the block or the chunk) unless `input` says it keeps
// it: per slot (an Elem::act buffer), or, `recomputed`, in one buffer for all layers and slots
// (the block recomputes it before each use: train.recompute = selective).
enum class LinearInput { given, kept, recomputed };
struct LinearDecl {
    std::string_view id;
    size_t rows = 0;  // the most rows it is handed (N, Nr, R or the experts' worst case)
    size_t in = 0, out = 0;
    LinearInput input = LinearInput::given;
    // The b_only saved buffers of the block its kept output gradient may live in, once B has
    // read them (BufferSpec::over).
    std::vector<std::string_view> over = {};
    // B asks grad_target where to write its output gradient in fp32: an fp32 staging buffer is
    // declared for when that cannot be the kept buffer itself (bf16, or a split schedule).
    bool staged = false;
};
// The kept output gradient (and its staging) and the kept input, each where the block's list of
// declarations has it.
void declare_grad(BufferDecl& out, const LinearDecl& l, const BufferShape& s);
void declare_input(BufferDecl& out, const LinearDecl& l);

// The weight of a linear layer that is several tensors used as one (q|k|v, gate|up): each of
// `prefix + name + ".weight"` must follow the one before it in the arena (checked); the first's
// name is returned, the linear layer's weight starting there.
std::string fused_weight(const ParamTable& t, const std::string& prefix, std::initializer_list<const char*> names);

// y = x W^T with no collective: the input rows are whole on this rank (a replicated weight, the
// MoE router and shared experts, or rows a column-parallel block has already gathered).
class Linear {
public:
    // The weight is rows [row0, row0 + out) of `tensor` (as this rank holds it), `in` columns wide.
    // `done_n`: the floats reported to the gradient hook after W, from the weight's first row
    // (default out * in; 0 = none, when another linear of the same tensor reports it).
    Linear(LinearContext& c, const ParamTable& t, const LinearDecl& d, const std::string& tensor, const char* role,
           int row0 = 0, size_t done_n = size_t(-1));
    Linear(const Linear&) = delete;
    Linear& operator=(const Linear&) = delete;

    // One more microbatch in flight: the kept input (slot, when declared) and the kept output
    // gradient (wslot) among the chunk's views.
    void add_slot(const BufferViews& saved);
    void add_w_slot(const BufferViews& w);

    // ---- forward ----
    // y[rows, out] = X W^T (+ beta y).
    void forward(Mat X, int rows, float* y, const float* params, float beta = 0.0f);
    // The kept input: where its producer writes it in fp32 (`staging` in bf16), then written.
    float* input(int slot, float* staging) const;
    void input_written(int slot, const float* staging, size_t rows);
    const float* input_fp32(int slot, float* scratch, size_t rows) const;  // bf16: widened into scratch
    // y[rows, out] = (kept input) W^T (+ beta y).
    void forward_kept(int slot, int rows, float* y, const float* params, float beta = 0.0f);

    // ---- B ----
    // Where B may write its output gradient in fp32: the kept buffer itself where W reads it as
    // it is (fp32) and, under a split schedule, only once nothing it may live over is still read
    // (`in_place`); else this layer's staging, or `staging` when given.
    float* grad_target(int wslot, float* staging = nullptr, bool in_place = false) const;
    // Keeps dy[rows, out] for W; returns it as the operand of the input-gradient GEMM.
    Mat keep_grad(int wslot, const float* dy, int rows);
    // dx[rows, in] = dY W (+ beta dx), dY from keep_grad.
    void input_grad(Mat dY, int rows, float* dx, const float* params, float beta = 0.0f);
    // Both: dx = dy W, dy kept.
    void backward_input(int wslot, const float* dy, int rows, float* dx, const float* params, float beta = 0.0f);

    // ---- W ----
    // dW += dY^T X, X the given input (rows of it) or the kept one; then the hook is told.
    void backward_weight(int wslot, Mat X, int rows, float* grads);
    void backward_weight_kept(int slot, int wslot, int rows, float* grads);

    int in() const { return in_; }
    int out() const { return out_; }
    size_t offset() const { return w_; }  // the weight's arena offset

protected:
    LinearContext& c_;
    const LinearNames names_;
    const char* role_;
    size_t tensor_ = 0, w_ = 0, done_n_ = 0;  // arena offsets of the tensor and of the weight; floats reported
    int out_, in_;
    LinearInput input_;
    float* dy32_ = nullptr;  // the fp32 staging of the output gradient (staged)
    std::vector<Act> in_kept_, dy_kept_;  // per slot, per wslot
    friend class GroupedLinear;
};

// Megatron's column-parallel layer: x (this rank's rows of the residual stream, Nr of them) is
// gathered over tp under sequence parallelism (f: identity / all-gather forward, all-reduce /
// reduce-scatter backward); the output columns are this rank's share.
class ColumnLinear : public Linear {
public:
    using Linear::Linear;
    // y[N, out] = gather(x) W^T.
    void forward(const Act& x, float* y, const float* params);
    // B: keeps dy[N, out]; returns dL/dx, this rank's rows [Nr, in], the partial sums over tp
    // reduced (scratch, valid until the next linear layer's B).
    const float* backward_input(int wslot, const float* dy, const float* params);
    // W: dW += dY^T gather(x).
    void backward_weight(int wslot, const Act& x, float* grads);
    // For blocks whose several linear layers read one gathered input (MLA): the entry's gather
    // and, after their partial input gradients were summed into c.full_b, its reduction.
    static Mat gather(LinearContext& c, const Act& x);
    static const float* reduce_input_grad(LinearContext& c);
};

// Megatron's row-parallel layer: the input columns are this rank's share, the output's partial
// sums are reduced over tp (reduce-scattered to the rank's rows under SP: g) and added to the
// residual stream. Its input is the one it keeps (the block's core writes it through input()).
class RowLinear : public Linear {
public:
    using Linear::Linear;
    // out[Nr, C] = res[Nr, C] + sum over tp of (kept input) W^T.
    void forward(int slot, const float* res, float* out, const float* params);
    // B: dout[Nr, C] gathered over tp (SP) and kept for W; dx[N, in] = dout W.
    void backward_input(int wslot, const float* dout, float* dx, const float* params);
    // W: dW += dout^T (kept input).
    void backward_weight(int slot, int wslot, float* grads) { backward_weight_kept(slot, wslot, c_.N, grads); }
};

// The MoE experts' projection: one weight per local expert (the same tensor name in every expert),
// each over its contiguous rows of the sorted tokens (count and first row per expert). The input
// is the one it keeps (the sorted rows, or the experts' activations).
class GroupedLinear {
public:
    // Experts [e0, e0 + El): `tensor(e)` names expert e's weight, rows [0, out) of it.
    GroupedLinear(LinearContext& c, const ParamTable& t, const LinearDecl& d, const std::vector<std::string>& tensors,
                  const char* role);
    void add_slot(const BufferViews& saved) { one_.add_slot(saved); }
    void add_w_slot(const BufferViews& w) { one_.add_w_slot(w); }
    float* input(int slot, float* staging) const { return one_.input(slot, staging); }
    void input_written(int slot, const float* staging, size_t rows) { one_.input_written(slot, staging, rows); }
    struct Groups {
        const int* count;   // [El] rows of each local expert
        const int* offset;  // [El] its first row
    };
    // y[rows, out] = each row's expert applied to its kept input row.
    void forward(int slot, const Groups& g, float* y, const float* params);
    float* grad_target(int wslot) const { return one_.grad_target(wslot); }
    // B: keeps dy[rows, out]; dx[rows, in] = each row's dy times its expert's weight.
    void backward_input(int wslot, const Groups& g, const float* dy, int rows, float* dx, const float* params);
    // W: each expert's dW += dY^T X over its rows; then the hook is told of every expert.
    void backward_weight(int slot, int wslot, const Groups& g, float* grads);

private:
    LinearContext& c_;
    Linear one_;               // the kept input and output gradient (rows of all experts)
    std::vector<size_t> w_;    // [El] each expert's weight offset
    const char* role_;
};

// The LM head (vocabulary-parallel over tp: this rank's Vl rows of the vocabulary) and the
// cross-entropy, as ColumnLinear: the final norm's rows gathered (SP), the input gradient reduced.
// Its output gradient is grad_scale * dloss/dlogits, which the loss leaves in the logits buffer.
class VocabHead {
public:
    // logit_mult multiplies the logits (µP's readout multiplier, ModelConfig::logit_mult).
    VocabHead(LinearContext& c, size_t weight_offset, int Vl, double logit_mult = 1.0);
    // logits[N, Vl] = gather(x) W^T.
    void forward(const Act& x, float* logits, const float* params);
    // The per-row cross-entropies into losses[N] from logits (with need_grad, logits become
    // grad_scale * dloss/dlogits). collective over tp
    void loss(float* logits, float* losses, const int32_t* targets, float grad_scale, bool need_grad,
              VocabParallelScratch& scratch);
    // B: dL/dx of this rank's rows (scratch). W: dW += dlogits^T gather(x) into `grads` (a base
    // pointer; the hook is not told: the head's gradient may complete later, tied).
    const float* backward_input(const float* dlogits, const float* params);
    void backward_weight(const float* dlogits, const Act& x, float* grads);
    // Whole backward: W (into grads, when not null) then B with one rounding of dlogits.
    const float* backward(const float* dlogits, const Act& x, const float* params, float* grads);
    size_t offset() const { return w_; }
    size_t numel() const { return size_t(Vl_) * c_.C; }

private:
    LinearContext& c_;
    size_t w_;
    int Vl_;
    float mult_;
};

}  // namespace quintet
