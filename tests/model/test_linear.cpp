// The linear layers (model/linear.hpp) on their own: for every kind, in fp32 and bf16, B then W
// -- with another microbatch's whole forward and backward run between them, as a zero-bubble
// schedule does -- gives the input gradient and the weight gradient of the whole backward (B and
// W at once) bit for bit; and the whole backward is the product its maths says (checked against
// a float64 evaluation). Tensor-parallel kinds run on tp = 1 and on the 2-rank world, with and
// without sequence parallelism.
// ctest: labels=mpi ranks=2
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/linear.hpp"
#include "quintet/model/params.hpp"

using namespace quintet;

namespace {

enum class Kind { plain, column, row, grouped, head };
const char* name(Kind k) {
    switch (k) {
    case Kind::plain: return "Linear";
    case Kind::column: return "ColumnLinear";
    case Kind::row: return "RowLinear";
    case Kind::grouped: return "GroupedLinear";
    case Kind::head: return "VocabHead";
    }
    return "?";
}

constexpr int kExperts = 3;
const int kCount[kExperts] = {5, 0, 7}, kOffset[kExperts] = {0, 5, 5};  // grouped rows: 12 of them

// One microbatch's outcome: the input gradient and the weight gradient (host).
struct Outcome {
    std::vector<float> dx, dw;
};

// A chunk's worth of one linear layer: its table, its context and buffers, two slots.
class Rig {
public:
    Rig(Backend& be, const Communicator& comm, bool sp, Precision p, bool split, Kind kind)
        : be_(be), tp_(comm, sp), kind_(kind), lin_(be, tp_, N, C, p, split) {
        const int rank = comm.rank();
        // The weight(s): [out, in] as this rank holds them.
        ModelConfig m;
        ShardPlan plan;
        ParamBuilder b(model_dims(m), plan);
        if (kind == Kind::grouped)
            for (int e = 0; e < kExperts; ++e) b.add(ParamBuilder::whole("e" + std::to_string(e), Out, In, InitRule::normal), true, false);
        else
            b.add(ParamBuilder::whole("w", out_width(), kind == Kind::head ? C : In, InitRule::normal), true, false);
        table_ = b.finish();
        params_.resize(table_.total);
        std::mt19937 g(7 + unsigned(rank));
        std::normal_distribution<float> nd(0.0f, 0.5f);
        for (float& x : params_) x = nd(g);
        // The declarations, laid out as a chunk does (two slots; what W keeps per slot when split).
        const size_t rows = size_t(kind == Kind::grouped ? R : N);
        BufferShape s;
        s.N = N, s.Nr = lin_.Nr, s.bf16 = p == Precision::bf16, s.sp = tp_.sp(), s.split_bw = split;
        BufferDecl d;
        LinearContext::declare(C, s, d);
        decl_ = {"t", rows, size_t(kind == Kind::head ? C : In), size_t(out_width()),
                 kind == Kind::row || kind == Kind::grouped ? LinearInput::kept : LinearInput::given, {}, true};
        if (kind != Kind::head) {
            if (decl_.input == LinearInput::kept) declare_input(d, decl_);
            declare_grad(d, decl_, s);
        } else {
            d.operands(size_t(N) * V);
        }
        if (!split) merge_shared(d.shared, d.deferred, s.bf16);
        if (s.bf16) d.scratch(Bf16Buf{"ctx.lowp"}, d.operand);
        shared_ = BufferViews(d.shared, alloc(layout_bytes(d.shared, s.bf16)), s.bf16);
        lin_.bind(shared_, d.operand);
        if (s.bf16) {
            shadow_.resize(params_.size());
            shadow_mem_ = be.alloc(params_.size());
            be.to_bf16(reinterpret_cast<bf16_bits*>(shadow_mem_), params_.data(), params_.size());
            lin_.set_bf16_weights(params_.data(), reinterpret_cast<bf16_bits*>(shadow_mem_));
        }
        switch (kind) {
        case Kind::plain: plain_ = std::make_unique<Linear>(lin_, table_, decl_, "w", "gemm.test"); break;
        case Kind::column: column_ = std::make_unique<ColumnLinear>(lin_, table_, decl_, "w", "gemm.test"); break;
        case Kind::row: row_ = std::make_unique<RowLinear>(lin_, table_, decl_, "w", "gemm.test"); break;
        case Kind::grouped:
            grouped_ = std::make_unique<GroupedLinear>(lin_, table_, decl_, std::vector<std::string>{"e0", "e1", "e2"},
                                                       "gemm.test");
            break;
        case Kind::head: head_ = std::make_unique<VocabHead>(lin_, table_.offset_of("w"), V); break;
        }
        for (int slot = 0; slot < 2; ++slot) {
            const BufferViews saved(d.saved, alloc(layout_bytes(d.saved, s.bf16)), s.bf16);
            const BufferViews w = split ? BufferViews(d.deferred, alloc(layout_bytes(d.deferred, s.bf16)), s.bf16) : shared_;
            if (Linear* l = linear()) l->add_slot(saved), l->add_w_slot(w);
            if (grouped_) grouped_->add_slot(saved), grouped_->add_w_slot(w);
            // The microbatch's own values: its input (the block's, in the activation precision),
            // its output gradient, its logits.
            x_[slot] = Act{static_cast<float*>(alloc(size_t(N) * C * 4)), nullptr};
            if (s.bf16) x_[slot] = Act{nullptr, static_cast<bf16_bits*>(alloc(size_t(N) * C * 2))};
            dy_[slot] = static_cast<float*>(alloc(size_t(N) * V * 4));
            y_[slot] = static_cast<float*>(alloc(size_t(N) * V * 4));
            dx_[slot] = static_cast<float*>(alloc(size_t(N) * C * 4));
        }
        grads_.assign(2, std::vector<float>(table_.total, 0.0f));
        gmem_ = static_cast<float*>(alloc(table_.total * 4));
    }
    ~Rig() {
        for (void* p : mem_) be_.release(static_cast<float*>(p));
        if (shadow_mem_) be_.release(shadow_mem_);
    }

    static constexpr int N = 12, C = 8, In = 8, Out = 10, V = 11, R = 12;

    // The microbatch `mb` into slot `slot`: its random input and output gradient, the forward.
    void forward(int slot, int mb) {
        std::mt19937 g(100 + unsigned(mb) + 1000u * unsigned(tp_.rank()));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(size_t(N) * C), dy(size_t(N) * V);
        for (float& v : x) v = nd(g);
        for (float& v : dy) v = nd(g);
        be_.from_host(dy_[slot], dy.data(), dy.size());
        const int rows_in = kind_ == Kind::column || kind_ == Kind::head ? lin_.Nr : (kind_ == Kind::grouped ? R : N);
        if (lin_.bf16()) {
            std::vector<float> tmp(x);
            float* f = static_cast<float*>(alloc(tmp.size() * 4));
            be_.from_host(f, tmp.data(), tmp.size());
            be_.to_bf16(x_[slot].b, f, size_t(rows_in) * In);
        } else {
            be_.from_host(x_[slot].f, x.data(), size_t(rows_in) * In);
        }
        const float* P = params_.data();
        switch (kind_) {
        case Kind::plain: plain_->forward(lin_.local(x_[slot]), N, y_[slot], P); break;
        case Kind::column: column_->forward(x_[slot], y_[slot], P); break;
        case Kind::row: {
            float* in = row_->input(slot, lin_.full_a);
            be_.from_host(in, x.data(), size_t(N) * In);
            row_->input_written(slot, in, size_t(N));
            std::vector<float> res(size_t(lin_.Nr) * C, 0.5f);
            be_.from_host(dx_[slot], res.data(), res.size());  // the residual, here in dx's buffer
            row_->forward(slot, dx_[slot], y_[slot], P);
            break;
        }
        case Kind::grouped: {
            float* in = grouped_->input(slot, lin_.full_a);
            be_.from_host(in, x.data(), size_t(R) * In);
            grouped_->input_written(slot, in, size_t(R));
            grouped_->forward(slot, {kCount, kOffset}, y_[slot], P);
            break;
        }
        case Kind::head: {
            head_->forward(x_[slot], y_[slot], P);
            std::vector<int32_t> tgt(static_cast<size_t>(N));
            // (tp = 2: every target on rank 0's vocabulary rows.)
            for (int n = 0; n < N; ++n) tgt[size_t(n)] = tp_.rank() == 0 ? (n * 5 + mb) % V : -1;
            int32_t* t = static_cast<int32_t*>(alloc(size_t(N) * 4));
            be_.from_host_i32(t, tgt.data(), tgt.size());
            std::vector<float> losses(static_cast<size_t>(N));
            head_->loss(y_[slot], losses.data(), t, 0.25f, true, xent_);  // logits -> dlogits
            break;
        }
        }
    }
    // B; W into mb's own gradient array (the gradient window starts zeroed).
    void backward_input(int slot) {
        const float* P = params_.data();
        switch (kind_) {
        case Kind::plain: plain_->backward_input(slot, dy_[slot], N, dx_[slot], P); break;
        case Kind::column: copy_dx(slot, column_->backward_input(slot, dy_[slot], P), size_t(lin_.Nr) * In); break;
        case Kind::row: row_->backward_input(slot, dy_[slot], dx_[slot], P); break;
        case Kind::grouped: grouped_->backward_input(slot, {kCount, kOffset}, dy_[slot], R, dx_[slot], P); break;
        case Kind::head: copy_dx(slot, head_->backward_input(y_[slot], P), size_t(lin_.Nr) * C); break;
        }
    }
    void backward_weight(int slot, int mb) {
        be_.zero(gmem_, table_.total);
        switch (kind_) {
        case Kind::plain: plain_->backward_weight(slot, lin_.local(x_[slot]), N, gmem_); break;
        case Kind::column: column_->backward_weight(slot, x_[slot], gmem_); break;
        case Kind::row: row_->backward_weight(slot, slot, gmem_); break;
        case Kind::grouped: grouped_->backward_weight(slot, slot, {kCount, kOffset}, gmem_); break;
        case Kind::head: head_->backward_weight(y_[slot], x_[slot], gmem_); break;
        }
        be_.to_host(grads_[size_t(mb)].data(), gmem_, table_.total);
    }
    // The whole backward (the head's in one call, as the decoder's last chunk runs it).
    void backward(int slot, int mb) {
        if (kind_ != Kind::head) {
            backward_input(slot);
            backward_weight(slot, mb);
            return;
        }
        be_.zero(gmem_, table_.total);
        copy_dx(slot, head_->backward(y_[slot], x_[slot], params_.data(), gmem_), size_t(lin_.Nr) * C);
        be_.to_host(grads_[size_t(mb)].data(), gmem_, table_.total);
    }
    Outcome outcome(int slot, int mb) const {
        Outcome o;
        const size_t n = kind_ == Kind::column || kind_ == Kind::head ? size_t(lin_.Nr) * C : size_t(kind_ == Kind::grouped ? R : N) * In;
        o.dx.resize(n);
        be_.to_host(o.dx.data(), dx_[slot], n);
        o.dw = grads_[size_t(mb)];
        return o;
    }

private:
    // A row-parallel layer's output is the residual stream's width.
    int out_width() const { return kind_ == Kind::head ? V : kind_ == Kind::row ? C : Out; }
    void* alloc(size_t bytes) {
        void* p = be_.alloc((bytes + 3) / 4 + 16);
        mem_.push_back(p);
        return p;
    }
    void copy_dx(int slot, const float* dx, size_t n) { be_.copy(dx_[slot], dx, n); }
    Linear* linear() const {
        if (plain_) return plain_.get();
        if (column_) return column_.get();
        if (row_) return row_.get();
        return nullptr;
    }

    Backend& be_;
    TensorParallel tp_;
    Kind kind_;
    LinearContext lin_;
    ParamTable table_;
    LinearDecl decl_;
    std::vector<float> params_, shadow_;
    float* shadow_mem_ = nullptr;
    BufferViews shared_;
    std::unique_ptr<Linear> plain_;
    std::unique_ptr<ColumnLinear> column_;
    std::unique_ptr<RowLinear> row_;
    std::unique_ptr<GroupedLinear> grouped_;
    std::unique_ptr<VocabHead> head_;
    VocabParallelScratch xent_;
    Act x_[2];
    float *dy_[2] = {}, *y_[2] = {}, *dx_[2] = {}, *gmem_ = nullptr;
    std::vector<std::vector<float>> grads_;
    std::vector<void*> mem_;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Microbatch 0 whole, against microbatch 0 as B ... (microbatch 1 whole) ... W.
void check_split(const Communicator& comm, bool sp, Precision p, Kind kind) {
    auto be = make_cpu_backend(1);
    Rig whole(*be, comm, sp, p, false, kind);
    whole.forward(0, 0);
    whole.backward(0, 0);
    const Outcome want = whole.outcome(0, 0);
    Rig split(*be, comm, sp, p, true, kind);
    split.forward(0, 0);
    split.backward_input(0);
    split.forward(1, 1);  // another microbatch, all of it, between B and W
    split.backward_input(1);
    split.backward_weight(1, 1);
    split.backward_weight(0, 0);
    const Outcome got = split.outcome(0, 0);
    const std::string what = std::string(name(kind)) + (p == Precision::bf16 ? " bf16" : " fp32") + " tp " +
                             std::to_string(comm.size()) + (sp ? " sp" : "");
    double wmax = 0;
    for (float x : want.dw) wmax = std::max(wmax, double(std::abs(x)));
    EXPECT_GT(wmax, 0.0) << what << ": no weight gradient at all";
    EXPECT_TRUE(same_bits(got.dx, want.dx)) << what << ": B's input gradient differs from the whole backward's";
    EXPECT_TRUE(same_bits(got.dw, want.dw)) << what << ": W's weight gradient differs from the whole backward's";
}

TEST(Linear, BThenWIsTheWholeBackwardBitForBit) {
    MpiCommunicator self(MPI_COMM_SELF), world(MPI_COMM_WORLD);
    for (Precision p : {Precision::fp32, Precision::bf16})
        for (Kind k : {Kind::plain, Kind::column, Kind::row, Kind::grouped, Kind::head}) {
            check_split(self, false, p, k);
            if (k == Kind::column || k == Kind::row || k == Kind::head) {
                check_split(world, false, p, k);
                check_split(world, true, p, k);
            }
        }
}

// The maths of the kinds without a collective, against float64: y = x W^T, dx = dy W, dW = dy^T x
// (the grouped one per expert over its rows).
TEST(Linear, WholeBackwardIsTheProductsOfItsMaths) {
    MpiCommunicator self(MPI_COMM_SELF);
    auto be = make_cpu_backend(1);
    // A plain Linear through the public operations, on host-visible data.
    const int M = 5, In = 7, Out = 4;
    ModelConfig m;
    ShardPlan plan;
    ParamBuilder b(model_dims(m), plan);
    b.add(ParamBuilder::whole("w", Out, In, InitRule::normal), true, false);
    ParamTable t = b.finish();
    TensorParallel tp(self, false);
    LinearContext lin(*be, tp, M, In, Precision::fp32, false);
    BufferShape s;
    s.N = s.Nr = M;
    BufferDecl d;
    LinearContext::declare(In, s, d);
    const LinearDecl ld{"t", size_t(M), size_t(In), size_t(Out), LinearInput::given, {}, false};
    declare_grad(d, ld, s);
    merge_shared(d.shared, d.deferred, false);
    std::vector<float> arena(layout_bytes(d.shared, false) / 4 + 16);
    BufferViews shared(d.shared, arena.data(), false);
    lin.bind(shared, 0);
    Linear l(lin, t, ld, "w", "gemm.test");
    l.add_w_slot(shared);
    std::mt19937 g(3);
    std::normal_distribution<float> nd;
    std::vector<float> w(t.total), x(size_t(M) * In), dy(size_t(M) * Out), y(size_t(M) * Out), dx(size_t(M) * In),
        dw(t.total, 0.0f);
    for (auto* v : {&w, &x, &dy}) for (float& e : *v) e = nd(g);
    l.forward({x.data(), nullptr}, M, y.data(), w.data());
    l.backward_input(0, dy.data(), M, dx.data(), w.data());
    l.backward_weight(0, {x.data(), nullptr}, M, dw.data());
    const size_t o = t.offset_of("w");
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < Out; ++j) {
            double r = 0;
            for (int k = 0; k < In; ++k) r += double(x[size_t(i) * In + k]) * w[o + size_t(j) * In + k];
            EXPECT_NEAR(y[size_t(i) * Out + j], r, 1e-5 * (1 + std::abs(r)));
        }
    for (int i = 0; i < M; ++i)
        for (int k = 0; k < In; ++k) {
            double r = 0;
            for (int j = 0; j < Out; ++j) r += double(dy[size_t(i) * Out + j]) * w[o + size_t(j) * In + k];
            EXPECT_NEAR(dx[size_t(i) * In + k], r, 1e-5 * (1 + std::abs(r)));
        }
    for (int j = 0; j < Out; ++j)
        for (int k = 0; k < In; ++k) {
            double r = 0;
            for (int i = 0; i < M; ++i) r += double(dy[size_t(i) * Out + j]) * x[size_t(i) * In + k];
            EXPECT_NEAR(dw[o + size_t(j) * In + k], r, 1e-5 * (1 + std::abs(r)));
        }
}

}  // namespace
