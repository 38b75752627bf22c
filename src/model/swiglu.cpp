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
        dgu_ = c_.shared().f32("ffn.dgu");
        dact_ = c_.shared().f32("ffn.dact");
    }

    void add_slot(const BufferViews& v) override {
        Saved s;
        s.gu = v.f32("ffn.gate_up");
        s.act = v.act("ffn.act");
        slots_.push_back(s);
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

    const float* backward(int slot, const float* params, float* grads, const Act& hn,
                          const float* dy) override {
        const int N = c_.N, C = c_.d.C, F = F_;
        Saved& s = slots_[size_t(slot)];
        Mat D = c_.lowp(c_.tp.gather(dy, c_.full_a, N, C), size_t(N) * C);
        {
            auto role = c_.role("gemm.ffn_down");
            c_.mm(false, false, N, F, C, D, C, c_.weight(params + wdown_), F, 0.0f, dact_, F);
            c_.mm(true, false, C, F, N, D, C, c_.local(s.act), F, 1.0f, grads + wdown_, F);
        }
        {
            QUINTET_PROFILE("swiglu");
            c_.be.swiglu_backward(dgu_, dact_, s.gu, N, F);
        }
        auto role = c_.role("gemm.ffn_gate_up");
        Mat dgu = c_.lowp(dgu_, size_t(N) * 2 * F);
        // hn re-gathered, not kept (SP saves memory)
        c_.mm(true, false, 2 * F, C, N, dgu, 2 * F, c_.gathered(hn, N, C), C, 1.0f, grads + wgu_, C);
        c_.mm(false, false, N, C, 2 * F, dgu, 2 * F, c_.weight(params + wgu_), C, 0.0f, c_.full_b, C);
        const float* dhn = c_.tp.reduce(c_.full_b, c_.dshard, N, C);
        c_.done(grads + wdown_, size_t(C) * F);
        c_.done(grads + wgu_, size_t(2) * F * C);
        return dhn;
    }

private:
    struct Saved {
        float* gu;  // [N, 2F] gate | up
        Act act;    // [N, F] silu(gate) * up
    };
    BlockContext& c_;
    int F_;
    size_t wgu_ = 0, wdown_ = 0;
    float *dgu_, *dact_;
    std::vector<Saved> slots_;
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
    out.save("ffn.gate_up", N * 2 * F);        // gate | up, the SwiGLU's input
    out.save("ffn.act", N * F, Elem::act);     // silu(gate) * up, down_proj's input
    out.scratch("ffn.dgu", N * 2 * F);
    out.scratch("ffn.dact", N * F);
    out.operands(N * 2 * F);
}

std::unique_ptr<FeedForwardBlock> make_swiglu_feed_forward(BlockContext& ctx, const ParamTable& table,
                                                           int layer) {
    return std::make_unique<SwigluFeedForward>(ctx, table, layer);
}

}  // namespace quintet
