#include "quintet/model/linear.hpp"

#include <algorithm>
#include <cstring>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"

namespace quintet {

namespace {
constexpr F32Buf kFullA{"ctx.full_a"}, kFullB{"ctx.full_b"}, kDshard{"ctx.dshard"};
constexpr Bf16Buf kLowp{"ctx.lowp"}, kGatherBf16{"ctx.gather_bf16"};

// A GEMM operand starting `off` elements into `m`.
Mat rows_of(Mat m, size_t off) { return {m.f ? m.f + off : nullptr, m.b ? m.b + off : nullptr}; }
}  // namespace

// ---- LinearContext ----

LinearContext::LinearContext(Backend& be_, TensorParallel& tp_, int N_, int C_, Precision p, bool split_bw_)
    : be(be_), tp(tp_), N(N_), Nr(tp_.sp() ? N_ / tp_.size() : N_), C(C_), split_bw(split_bw_),
      bf16_(p == Precision::bf16) {}

void LinearContext::declare(int C, const BufferShape& s, BufferDecl& out) {
    const size_t N = size_t(s.N), Cs = size_t(C);
    out.scratch(kFullA, N * Cs);
    out.scratch(kFullB, N * Cs);
    out.scratch(kDshard, size_t(s.Nr) * Cs);
    if (s.bf16) {
        out.operands(N * Cs);
        if (s.sp) out.scratch(kGatherBf16, N * Cs);
    }
}

void LinearContext::bind(const BufferViews& shared, size_t operand_n) {
    shared_ = shared;
    full_a = shared[kFullA];
    full_b = shared[kFullB];
    dshard = shared[kDshard];
    if (bf16_) {
        lowp_ = shared[kLowp];
        lowp_n_ = operand_n;
        if (tp.sp()) gather_bf16_ = shared[kGatherBf16];
    }
}

void LinearContext::set_bf16_weights(const float* master, const bf16_bits* shadow) {
    QUINTET_CHECK(bf16_, "set_bf16_weights on an fp32 chunk");
    master_ = master;
    shadow_ = shadow;
}

void LinearContext::mm(const char* role, bool ta, bool tb, int M, int Nn, int K, Mat A, int lda, Mat Bm, int ldb,
                       float beta, float* Cm, int ldc, float alpha) {
    static constexpr const char *kDw = ".dw", *kFwd = ".fwd", *kDx = ".dx";
    profile::Scope scope(profile::enabled() || trace::recording() ? profile::joined_name(role, ta ? kDw : tb ? kFwd : kDx)
                                                                  : "");
    if (bf16_) be.gemm_bf16(ta, tb, M, Nn, K, alpha, A.b, lda, Bm.b, ldb, beta, Cm, ldc);
    else be.gemm(ta, tb, M, Nn, K, alpha, A.f, lda, Bm.f, ldb, beta, Cm, ldc);
}

Mat LinearContext::gathered(const Act& a, size_t rows, size_t width) {
    if (bf16_) return {nullptr, tp.gather(a.b, gather_bf16_, rows, width)};
    return {tp.gather(a.f, full_a, rows, width), nullptr};
}

Mat LinearContext::lowp(const float* x, size_t n) {
    if (!bf16_) return {x, nullptr};
    QUINTET_CHECK(n <= lowp_n_, "bf16 operand scratch too small (BufferDecl::operands)");
    be.to_bf16(lowp_, x, n);
    return {nullptr, lowp_};
}

void LinearContext::keep(const Act& a, const float* staging, size_t n) {
    if (bf16_) be.to_bf16(a.b, staging, n);
}

Mat LinearContext::save(const Act& w, const float* x, size_t n) {
    if (bf16_) {
        be.to_bf16(w.b, x, n);
        return {nullptr, w.b};
    }
    if (!split_bw) {
        int i = 0;
        while (i < n_stand_in_ && stand_in_[size_t(i)].first != w.f) ++i;
        if (i < int(stand_in_.size())) {
            stand_in_[size_t(i)] = {w.f, x};
            n_stand_in_ = std::max(n_stand_in_, i + 1);
            return {x, nullptr};
        }
    }
    if (w.f != x) be.copy(w.f, x, n);
    return {w.f, nullptr};
}

Mat LinearContext::deferred(const Act& w) const {
    if (bf16_ || split_bw) return {w.f, w.b};
    for (int i = 0; i < n_stand_in_; ++i)
        if (stand_in_[size_t(i)].first == w.f) return {stand_in_[size_t(i)].second, nullptr};
    return {w.f, nullptr};
}

// ---- declarations ----

LinearNames::LinearNames(std::string_view id)
    : dy("w." + std::string(id) + ".dy"), dy32(std::string(id) + ".dy32"), in(std::string(id) + ".in") {}

void declare_grad(BufferDecl& out, const LinearDecl& l, const BufferShape& s) {
    const LinearNames n(l.id);
    out.defer(ActBuf{n.dy}, l.rows * l.out, l.over);
    if (l.staged && (s.bf16 || s.split_bw)) out.scratch(F32Buf{n.dy32}, l.rows * l.out);
}

void declare_input(BufferDecl& out, const LinearDecl& l) {
    const LinearNames n(l.id);
    QUINTET_CHECK(l.input != LinearInput::given, "declare_input: the linear layer keeps no input");
    if (l.input == LinearInput::kept) out.per_slot(ActBuf{n.in}, l.rows * l.in);
    else out.scratch(ActBuf{n.in}, l.rows * l.in);
}

// ---- Linear ----

std::string fused_weight(const ParamTable& t, const std::string& prefix, std::initializer_list<const char*> names) {
    const ParamSpec* prev = nullptr;
    for (const char* n : names) {
        const ParamSpec* spec = t.find(prefix + n + ".weight");
        QUINTET_CHECK(spec, "no tensor " + prefix + n + ".weight on this rank");
        QUINTET_CHECK(!prev || spec->offset == prev->offset + prev->numel(),
                      prefix + n + ".weight does not follow " + prev->name + " in the arena (they are one GEMM)");
        prev = spec;
    }
    return prefix + *names.begin() + ".weight";
}

Linear::Linear(LinearContext& c, const ParamTable& t, const LinearDecl& d, const std::string& tensor, const char* role,
               int row0, size_t done_n)
    : c_(c), names_(d.id), role_(role), out_(int(d.out)), in_(int(d.in)), input_(d.input) {
    tensor_ = t.offset_of(tensor);
    w_ = tensor_ + size_t(row0) * d.in;
    done_n_ = done_n == size_t(-1) ? d.out * d.in : done_n;
    if (d.staged && (c_.bf16() || c_.split_bw)) dy32_ = c_.shared()[F32Buf{names_.dy32}];
}

void Linear::add_slot(const BufferViews& saved) {
    if (input_ == LinearInput::kept) in_kept_.push_back(saved[ActBuf{names_.in}]);
    else if (input_ == LinearInput::recomputed) in_kept_.push_back(c_.shared()[ActBuf{names_.in}]);
}

void Linear::add_w_slot(const BufferViews& w) { dy_kept_.push_back(w[ActBuf{names_.dy}]); }

void Linear::forward(Mat X, int rows, float* y, const float* params, float beta) {
    c_.mm(role_, false, true, rows, out_, in_, X, in_, c_.weight(params + w_), in_, beta, y, out_);
}

float* Linear::input(int slot, float* staging) const { return c_.produce(in_kept_[size_t(slot)], staging); }

void Linear::input_written(int slot, const float* staging, size_t rows) {
    c_.keep(in_kept_[size_t(slot)], staging, rows * size_t(in_));
}

const float* Linear::input_fp32(int slot, float* scratch, size_t rows) const {
    const Act& a = in_kept_[size_t(slot)];
    if (!c_.bf16()) return a.f;
    c_.be.from_bf16(scratch, a.b, rows * size_t(in_));
    return scratch;
}

void Linear::forward_kept(int slot, int rows, float* y, const float* params, float beta) {
    forward(c_.local(in_kept_[size_t(slot)]), rows, y, params, beta);
}

float* Linear::grad_target(int wslot, float* staging, bool in_place) const {
    if (!c_.bf16() && (!c_.split_bw || in_place)) return dy_kept_[size_t(wslot)].f;
    return staging ? staging : dy32_;
}

Mat Linear::keep_grad(int wslot, const float* dy, int rows) {
    return c_.save(dy_kept_[size_t(wslot)], dy, size_t(rows) * out_);
}

void Linear::input_grad(Mat dY, int rows, float* dx, const float* params, float beta) {
    c_.mm(role_, false, false, rows, in_, out_, dY, out_, c_.weight(params + w_), in_, beta, dx, in_);
}

void Linear::backward_input(int wslot, const float* dy, int rows, float* dx, const float* params, float beta) {
    input_grad(keep_grad(wslot, dy, rows), rows, dx, params, beta);
}

void Linear::backward_weight(int wslot, Mat X, int rows, float* grads) {
    c_.mm(role_, true, false, out_, in_, rows, c_.deferred(dy_kept_[size_t(wslot)]), out_, X, in_, 1.0f,
          grads + w_, in_);
    if (done_n_ > 0) c_.done(grads + tensor_, done_n_);
}

void Linear::backward_weight_kept(int slot, int wslot, int rows, float* grads) {
    backward_weight(wslot, c_.local(in_kept_[size_t(slot)]), rows, grads);
}

// ---- ColumnLinear ----

void ColumnLinear::forward(const Act& x, float* y, const float* params) {
    Linear::forward(c_.gathered(x, size_t(c_.N), size_t(in_)), c_.N, y, params);
}

const float* ColumnLinear::backward_input(int wslot, const float* dy, const float* params) {
    Linear::backward_input(wslot, dy, c_.N, c_.full_b, params);
    return c_.tp.reduce(c_.full_b, c_.dshard, size_t(c_.N), size_t(in_));
}

void ColumnLinear::backward_weight(int wslot, const Act& x, float* grads) {
    Linear::backward_weight(wslot, c_.gathered(x, size_t(c_.N), size_t(in_)), c_.N, grads);
}

Mat ColumnLinear::gather(LinearContext& c, const Act& x) { return c.gathered(x, size_t(c.N), size_t(c.C)); }

const float* ColumnLinear::reduce_input_grad(LinearContext& c) {
    return c.tp.reduce(c.full_b, c.dshard, size_t(c.N), size_t(c.C));
}

// ---- RowLinear ----

void RowLinear::forward(int slot, const float* res, float* out, const float* params) {
    const size_t Nr = size_t(c_.Nr), C = size_t(out_);
    c_.be.copy(out, res, Nr * C);
    if (c_.tp.size() == 1) {
        forward_kept(slot, c_.N, out, params, 1.0f);
        return;
    }
    forward_kept(slot, c_.N, c_.full_b, params, 0.0f);
    c_.be.add_inplace(out, c_.tp.reduce(c_.full_b, c_.dshard, size_t(c_.N), C), Nr * C);
}

void RowLinear::backward_input(int wslot, const float* dout, float* dx, const float* params) {
    // (bf16: the gradient is rounded once, into the kept buffer, for the two GEMMs that read it.)
    const Act& w = dy_kept_[size_t(wslot)];
    const size_t N = size_t(c_.N), C = size_t(out_);
    const Mat D = c_.save(w, c_.tp.gather(dout, c_.produce(w, c_.full_a), N, C), N * C);
    input_grad(D, c_.N, dx, params);
}

// ---- GroupedLinear ----

GroupedLinear::GroupedLinear(LinearContext& c, const ParamTable& t, const LinearDecl& d,
                             const std::vector<std::string>& tensors, const char* role)
    : c_(c), one_(c, t, d, tensors.at(0), role, 0, 0), role_(role) {
    for (const auto& n : tensors) w_.push_back(t.offset_of(n));
}

void GroupedLinear::forward(int slot, const Groups& g, float* y, const float* params) {
    const int in = one_.in_, out = one_.out_;
    const Mat X = c_.local(one_.in_kept_[size_t(slot)]);
    for (size_t j = 0; j < w_.size(); ++j)
        if (g.count[j] > 0) {
            const size_t o = size_t(g.offset[j]);
            c_.mm(role_, false, true, g.count[j], out, in, rows_of(X, o * in), in, c_.weight(params + w_[j]), in, 0.0f,
                  y + o * out, out);
        }
}

void GroupedLinear::backward_input(int wslot, const Groups& g, const float* dy, int rows, float* dx,
                                   const float* params) {
    const int in = one_.in_, out = one_.out_;
    const Mat D = one_.keep_grad(wslot, dy, rows);
    for (size_t j = 0; j < w_.size(); ++j)
        if (g.count[j] > 0) {
            const size_t o = size_t(g.offset[j]);
            c_.mm(role_, false, false, g.count[j], in, out, rows_of(D, o * out), out, c_.weight(params + w_[j]), in,
                  0.0f, dx + o * in, in);
        }
}

void GroupedLinear::backward_weight(int slot, int wslot, const Groups& g, float* grads) {
    const int in = one_.in_, out = one_.out_;
    const Mat D = c_.deferred(one_.dy_kept_[size_t(wslot)]);
    const Mat X = c_.local(one_.in_kept_[size_t(slot)]);
    for (size_t j = 0; j < w_.size(); ++j)
        if (g.count[j] > 0) {
            const size_t o = size_t(g.offset[j]);
            c_.mm(role_, true, false, out, in, g.count[j], rows_of(D, o * out), out, rows_of(X, o * in), in, 1.0f,
                  grads + w_[j], in);
        }
    for (size_t j = 0; j < w_.size(); ++j) c_.done(grads + w_[j], size_t(out) * in);
}

// ---- VocabHead ----
// logits = mult * (x W^T): dX = mult * dlogits W and dW += mult * dlogits^T x, the multiplier as
// the GEMMs' alpha (1: the plain products, bit for bit).

VocabHead::VocabHead(LinearContext& c, size_t weight_offset, int Vl, double logit_mult)
    : c_(c), w_(weight_offset), Vl_(Vl), mult_(float(logit_mult)) {}

void VocabHead::forward(const Act& x, float* logits, const float* params) {
    const int N = c_.N, C = c_.C;
    c_.mm("gemm.lm_head", false, true, N, Vl_, C, c_.gathered(x, size_t(N), size_t(C)), C, c_.weight(params + w_), C,
          0.0f, logits, Vl_, mult_);
}

void VocabHead::loss(float* logits, float* losses, const int32_t* targets, float grad_scale, bool need_grad,
                     VocabParallelScratch& scratch) {
    QUINTET_PROFILE("loss");
    const int N = c_.N;
    if (c_.tp.size() == 1) {
        if (need_grad) c_.be.xent_forward_backward(logits, losses, targets, N, Vl_, grad_scale);
        else c_.be.xent_forward(losses, logits, targets, N, Vl_);
    } else {
        vocab_parallel_xent(c_.be, c_.tp, logits, losses, targets, N, Vl_, grad_scale, need_grad, scratch);
    }
}

const float* VocabHead::backward(const float* dlogits, const Act& x, const float* params, float* grads) {
    const int N = c_.N, C = c_.C;
    const Mat D = c_.lowp(dlogits, size_t(N) * Vl_);
    if (grads)
        c_.mm("gemm.lm_head", true, false, Vl_, C, N, D, Vl_, c_.gathered(x, size_t(N), size_t(C)), C, 1.0f, grads + w_,
              C, mult_);
    c_.mm("gemm.lm_head", false, false, N, C, Vl_, D, Vl_, c_.weight(params + w_), C, 0.0f, c_.full_b, C, mult_);
    return c_.tp.reduce(c_.full_b, c_.dshard, size_t(N), size_t(C));
}

const float* VocabHead::backward_input(const float* dlogits, const float* params) {
    return backward(dlogits, Act{}, params, nullptr);
}

void VocabHead::backward_weight(const float* dlogits, const Act& x, float* grads) {
    const int N = c_.N, C = c_.C;
    c_.mm("gemm.lm_head", true, false, Vl_, C, N, c_.lowp(dlogits, size_t(N) * Vl_), Vl_,
          c_.gathered(x, size_t(N), size_t(C)), C, 1.0f, grads + w_, C, mult_);
}

}  // namespace quintet
