// The dense feed-forward block: down(silu(gate(x)) * up(x)). Two linear layers around the
// SwiGLU: gate|up, one fused column-parallel GEMM, and down_proj, row-parallel.
#include "quintet/core/profile.hpp"
#include "quintet/model/block.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

// [N, 2F] gate | up, the SwiGLU's input (B's only); [N, F] d(silu(gate) * up), the activation's bf16 staging.
constexpr F32Buf kGateUp{"ffn.gate_up"}, kDact{"ffn.dact"};

LinearDecl gate_up_decl(const ModelDims& d, int N) {
    return {"ffn.gate_up", size_t(N), size_t(d.C), 2 * size_t(d.Fl), LinearInput::given, {kGateUp.name}, true};
}
LinearDecl down_decl(const ModelDims& d, int N) { return {"ffn.down", size_t(N), size_t(d.Fl), size_t(d.C), LinearInput::kept}; }

class SwigluFeedForward final : public FeedForwardBlock {
public:
    SwigluFeedForward(BlockContext& ctx, const ParamTable& t, int layer)
        : c_(ctx), gate_up_(ctx.lin, t, gate_up_decl(ctx.d, ctx.N), fused_weight(t, prefix(layer), {"gate_proj", "up_proj"}),
                            "gemm.ffn_gate_up"),
          down_(ctx.lin, t, down_decl(ctx.d, ctx.N), prefix(layer) + "down_proj.weight", "gemm.ffn_down"),
          dact_(ctx.shared()[kDact]) {}

    void add_slot(const BufferViews& v) override { gu_.push_back(v[kGateUp]), down_.add_slot(v); }
    void add_w_slot(const BufferViews& w) override { gate_up_.add_w_slot(w), down_.add_w_slot(w); }

    void forward(int slot, const float* params, const Act& hn, const float* h, float* y) override {
        gate_up_.forward(hn, gu_[size_t(slot)], params);
        float* act = down_.input(slot, dact_);
        {
            QUINTET_PROFILE("swiglu");
            c_.be.swiglu_forward(act, gu_[size_t(slot)], c_.N, c_.d.Fl);
        }
        down_.input_written(slot, act, size_t(c_.N));
        down_.forward(slot, h, y, params);
    }

    // B: d(act) = dy Wdown, through the SwiGLU, dhn = d(gate|up) Wgu.
    const float* backward_input(int slot, int wslot, const float* params, const Act&, const float* dy) override {
        down_.backward_input(wslot, dy, dact_, params);
        float* dgu = gate_up_.grad_target(wslot);
        {
            QUINTET_PROFILE("swiglu");
            c_.be.swiglu_backward(dgu, dact_, gu_[size_t(slot)], c_.N, c_.d.Fl);
        }
        return gate_up_.backward_input(wslot, dgu, params);
    }

    // W: down's and gate|up's (hn gathered again, not kept: SP saves memory).
    void backward_weight(int slot, int wslot, float* grads, const Act& hn) override {
        down_.backward_weight(slot, wslot, grads);
        gate_up_.backward_weight(wslot, hn, grads);
    }

private:
    BlockContext& c_;
    ColumnLinear gate_up_;
    RowLinear down_;
    float* dact_;
    std::vector<float*> gu_;  // per slot: gate | up
};

}  // namespace

void swiglu_add_params(ParamBuilder& b, int layer) {
    const ModelDims& d = b.dims();
    for (const char* gu : {"gate_proj", "up_proj"})
        b.add(ParamBuilder::row_shard(prefix(layer) + gu + ".weight", d.F, d.C, d.Fl, d.tp_rank * d.Fl, InitRule::normal),
              b.holds_layer(layer), true);
    b.add(ParamBuilder::col_shard(prefix(layer) + "down_proj.weight", d.C, d.F, d.Fl, d.tp_rank * d.Fl,
                                  InitRule::out_proj), b.holds_layer(layer), true);
}

void swiglu_declare_buffers(const ModelDims& d, const BufferShape& s, BufferDecl& out) {
    out.per_slot(kGateUp, size_t(s.N) * 2 * d.Fl, true);
    declare_input(out, down_decl(d, s.N));  // silu(gate) * up, down_proj's input
    declare_grad(out, down_decl(d, s.N), s);
    declare_grad(out, gate_up_decl(d, s.N), s);  // written once gate|up is read
    out.scratch(kDact, size_t(s.N) * d.Fl);
}

std::unique_ptr<FeedForwardBlock> make_swiglu_feed_forward(BlockContext& ctx, const ParamTable& t, int layer) {
    return std::make_unique<SwigluFeedForward>(ctx, t, layer);
}

}  // namespace quintet
