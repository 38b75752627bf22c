// The dense feed-forward block: down(silu(gate(x)) * up(x)), one fused gate|up GEMM.
// Tensor parallelism (docs/parallelism.md): gate|up column-parallel, down_proj row-parallel.
#include "quintet/core/profile.hpp"
#include "quintet/core/error.hpp"
#include "quintet/model/block.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

class SwigluFeedForward final : public FeedForwardBlock {
public:
    SwigluFeedForward(BlockContext& ctx, const ParamTable& table, int layer) : c_(ctx) {
        F_ = c_.d.Fl;
        const std::string p = prefix(layer);
        wgu_ = table.offset_of(p + "gate_proj.weight");  // up_proj follows contiguously
        QUINTET_CHECK(table.offset_of(p + "up_proj.weight") == wgu_ + size_t(F_) * c_.d.C,
                      "gate_proj and up_proj are not adjacent in the arena");
        wdown_ = table.offset_of(p + "down_proj.weight");
        // fp32 without a split schedule: straight into the deferred buffer (under one, that may
        // be gate|up's own bytes, which the SwiGLU's backward reads).
        if (c_.bf16() || c_.split_bw) dgu_ = c_.shared().f32("ffn.dgu");
        dact_ = c_.shared().f32("ffn.dact");
    }

    void add_slot(const BufferViews& v) override {
        Saved s;
        s.gu = v.f32("ffn.gate_up");
        s.act = v.act("ffn.act");
        slots_.push_back(s);
    }

    void add_deferred(const BufferViews& w) override {
        Deferred d;
        d.dy = w.act("w.ffn.dy");
        d.dgu = w.act("w.ffn.dgu");
        wslots_.push_back(d);
    }

    void forward(int slot, const float* params, const Act& hn, const float* h, float* y) override {
        const int N = c_.N, C = c_.d.C, F = F_;
        Saved& s = slots_[size_t(slot)];
        {
            auto role = c_.role("gemm.ffn_gate_up");
            c_.mm(false, true, N, 2 * F, C, c_.gathered(hn, N, C), C, c_.weight(params + wgu_), C, 0.0f,
                  s.gu, 2 * F);
        }
        float* act = c_.produce(s.act, dact_);
        {
            QUINTET_PROFILE("swiglu");
            c_.be.swiglu_forward(act, s.gu, N, F);
            c_.keep(s.act, act, size_t(N) * F);
        }
        auto role = c_.role("gemm.ffn_down");
        c_.row_parallel_residual(y, h, c_.local(s.act), F, params + wdown_);
    }

    // B: d(act) = dy Wdown, through the SwiGLU, dhn = d(gate|up) Wgu; keeps dy (gathered) and
    // d(gate|up) for W.
    const float* backward_input(int slot, int wslot, const float* params, const Act& hn,
                                const float* dy) override {
        (void)hn;
        const int N = c_.N, C = c_.d.C, F = F_;
        Saved& s = slots_[size_t(slot)];
        Deferred& w = wslots_[size_t(wslot)];
        const Mat D = c_.save(w.dy, c_.tp.gather(dy, c_.produce(w.dy, c_.full_a), N, C), size_t(N) * C);
        {
            auto role = c_.role("gemm.ffn_down");
            c_.mm(false, false, N, F, C, D, C, c_.weight(params + wdown_), F, 0.0f, dact_, F);
        }
        float* dgu = c_.split_bw ? dgu_ : c_.produce(w.dgu, dgu_);
        {
            QUINTET_PROFILE("swiglu");
            c_.be.swiglu_backward(dgu, dact_, s.gu, N, F);
        }
        auto role = c_.role("gemm.ffn_gate_up");
        const Mat Dgu = c_.save(w.dgu, dgu, size_t(N) * 2 * F);
        c_.mm(false, false, N, C, 2 * F, Dgu, 2 * F, c_.weight(params + wgu_), C, 0.0f, c_.full_b, C);
        return c_.tp.reduce(c_.full_b, c_.dshard, N, C);
    }

    // W: dWdown += dy^T act, dWgu += d(gate|up)^T hn (hn re-gathered, not kept: SP saves memory).
    void backward_weight(int slot, int wslot, float* grads, const Act& hn) override {
        const int N = c_.N, C = c_.d.C, F = F_;
        Saved& s = slots_[size_t(slot)];
        Deferred& w = wslots_[size_t(wslot)];
        {
            auto role = c_.role("gemm.ffn_down");
            c_.mm(true, false, C, F, N, c_.deferred(w.dy), C, c_.local(s.act), F, 1.0f, grads + wdown_, F);
        }
        {
            auto role = c_.role("gemm.ffn_gate_up");
            c_.mm(true, false, 2 * F, C, N, c_.deferred(w.dgu), 2 * F, c_.gathered(hn, N, C), C, 1.0f, grads + wgu_, C);
        }
        c_.done(grads + wdown_, size_t(C) * F);
        c_.done(grads + wgu_, size_t(2) * F * C);
    }

private:
    struct Saved {
        float* gu;  // [N, 2F] gate | up
        Act act;    // [N, F] silu(gate) * up
    };
    struct Deferred {  // B -> W
        Act dy;   // [N, C] dL/dy gathered over tp: down_proj's output gradient
        Act dgu;  // [N, 2F] d(gate | up)
    };
    BlockContext& c_;
    int F_;
    size_t wgu_ = 0, wdown_ = 0;
    float *dgu_ = nullptr, *dact_;
    std::vector<Saved> slots_;
    std::vector<Deferred> wslots_;
};

}  // namespace

void swiglu_add_params(ParamBuilder& b, int layer) {
    const ModelDims& d = b.dims();
    const bool held = b.holds_layer(layer);
    const std::string p = prefix(layer);
    for (const char* gu : {"gate_proj", "up_proj"})
        b.add(ParamBuilder::row_shard(p + gu + ".weight", d.F, d.C, d.Fl, d.tp_rank * d.Fl,
                                      InitRule::normal),
              held, true);
    b.add(ParamBuilder::col_shard(p + "down_proj.weight", d.C, d.F, d.Fl, d.tp_rank * d.Fl,
                                  InitRule::out_proj),
          held, true);
}

void swiglu_declare_buffers(const ModelDims& d, const BufferShape& s, BufferDecl& out) {
    const size_t N = size_t(s.N), F = size_t(d.Fl);
    out.save("ffn.gate_up", N * 2 * F, Elem::f32, true);  // gate | up, the SwiGLU's input (B's only)
    out.save("ffn.act", N * F, Elem::act);                // silu(gate) * up, down_proj's input
    out.defer("w.ffn.dy", N * size_t(d.C));
    out.defer("w.ffn.dgu", N * 2 * F, Elem::act, {"ffn.gate_up"});  // written once gate|up is read
    // fp32 before it is rounded (bf16) or copied (a split schedule) into w.ffn.dgu
    if (s.bf16 || s.split_bw) out.scratch("ffn.dgu", N * 2 * F);
    out.scratch("ffn.dact", N * F);
}

std::unique_ptr<FeedForwardBlock> make_swiglu_feed_forward(BlockContext& ctx, const ParamTable& table,
                                                           int layer) {
    return std::make_unique<SwigluFeedForward>(ctx, table, layer);
}

}  // namespace quintet
