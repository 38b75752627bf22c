// model.attention = mha: multi-head attention with grouped KV heads (GQA when n_kv_heads <
// n_heads), RoPE on every q/k dim (YaRN's mscale folded into cos/sin). Two linear layers around
// the attention core: q|k|v, one fused column-parallel GEMM (by head), and o_proj, row-parallel.
// With tp > n_kv_heads each kv head is replicated over the tp/n_kv_heads ranks that use it.
#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/block.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".self_attn."; }

constexpr F32Buf kQkv{"attention.qkv"};    // [N, QKV] q | k | v after RoPE
constexpr F32Buf kLse{"attention.lse"};    // [B, NH, T] per slot; and the decoder's scratch
constexpr F32Buf kDatt{"attention.datt"};  // [N, A] d(attention output); the output's bf16 staging
constexpr F32Buf kRecomputedLse{"attention.recomputed_lse"};  // selective: one for all layers and slots

// The two linear layers. QKV: this rank's q, k and v columns; A: its attention output columns.
LinearDecl qkv_decl(const ModelDims& d, size_t N) {
    return {"attn.qkv", N, size_t(d.C), size_t(d.qkv_local()), LinearInput::given, {kQkv.name}, true};
}
LinearDecl o_decl(const ModelDims& d, size_t N, Recompute r) {
    // Its input is the attention core's output, recomputed (one buffer) under selective.
    return {"attn.o", N, size_t(d.NHl) * d.HD, size_t(d.C),
            r == Recompute::selective ? LinearInput::recomputed : LinearInput::kept};
}

class MhaAttention final : public AttentionBlock {
public:
    MhaAttention(BlockContext& ctx, const ParamTable& t, int layer)
        : c_(ctx), NH_(ctx.d.NHl), NKV_(ctx.d.NKVl), HD_(ctx.d.HD), QKV_(ctx.d.qkv_local()), A_(NH_ * HD_),
          qkv_(ctx.lin, t, qkv_decl(ctx.d, size_t(ctx.N)), fused_weight(t, prefix(layer), {"q_proj", "k_proj", "v_proj"}),
               "gemm.attn_qkv"),
          o_(ctx.lin, t, o_decl(ctx.d, size_t(ctx.N), ctx.recompute), prefix(layer) + "o_proj.weight", "gemm.attn_out"),
          scale_(float(ctx.attn_mult * (1.0 / std::sqrt(double(HD_))))),
          // MHA/GQA rotate every q/k dim, so YaRN's logit factor m(mscale)^2 (mscale_all_dim
          // cancels: docs/math.md §4.4) is m(mscale) on cos and sin.
          rope_(c_.rope_table(HD_, rope_mscale(c_.rope))), datt_(c_.shared()[kDatt]), lse_scratch_(c_.shared()[kLse]) {
        if (c_.recompute == Recompute::selective) lse_ws_ = c_.shared()[kRecomputedLse];
    }

    void add_slot(const BufferViews& v) override {
        slots_.push_back({v[kQkv], c_.recompute == Recompute::selective ? lse_ws_ : v[kLse]});
        o_.add_slot(v);
    }
    void add_w_slot(const BufferViews& w) override { qkv_.add_w_slot(w), o_.add_w_slot(w); }

    void forward(int slot, const TokenInfo& tok, const float* params, const Act& xn, const float* x, float* h,
                 KvCache* cache) override {
        Saved& s = slots_[size_t(slot)];
        qkv_.forward(xn, s.qkv, params);
        rotate(s.qkv, tok, false);
        if (cache) {  // generation: the new rows join the cache, then attend to all of it
            float* att = o_.input(slot, datt_);
            const float* kv = s.qkv + A_;
            static_cast<KvRowsCache&>(*cache).attend(s.qkv, kv, QKV_, kv + NKV_ * HD_, QKV_, c_.N, args(tok), att, lse_scratch_);
            o_.input_written(slot, att, size_t(c_.N));
        } else {
            core_forward(slot, tok);
        }
        o_.forward(slot, x, h, params);
    }

    // B: d(att) = dh Wo, the attention core's backward, RoPE's; dxn = dqkv Wqkv.
    const float* backward_input(int slot, int wslot, const TokenInfo& tok, const float* params, const Act&,
                                const float* dh) override {
        const int N = c_.N;
        Saved& s = slots_[size_t(slot)];
        if (c_.recompute == Recompute::selective) core_forward(slot, tok);  // the same bits again
        o_.backward_input(wslot, dh, datt_, params);
        // rowsum(dO * O) reads the kept output (bf16: widened)
        const float* att = o_.input_fp32(slot, c_.lin.full_b, size_t(N));
        float* dq = qkv_.grad_target(wslot);
        float *dk = dq + A_, *dv = dk + NKV_ * HD_;
        const float *q = s.qkv, *k = q + A_, *v = k + NKV_ * HD_;
        c_.be.zero(dq, size_t(N) * QKV_);
        {
            QUINTET_PROFILE("attention.bwd");
            if (c_.cp) c_.cp->attention_backward(dq, dk, dv, datt_, att, s.lse, q, k, v, args(tok), tok.pos_all, tok.doc_all);
            else c_.be.attention_backward(dq, dk, dv, datt_, att, s.lse, q, k, v, args(tok));
        }
        rotate(dq, tok, true);
        return qkv_.backward_input(wslot, dq, params);
    }

    // W: o_proj's and q|k|v's (o_proj's input recomputed first when other work ran since B under
    // selective recomputation, which shares one buffer among the layers and slots).
    void backward_weight(int slot, int wslot, const TokenInfo& tok, float* grads, const Act& xn, bool later) override {
        if (later && c_.recompute == Recompute::selective) core_forward(slot, tok);
        o_.backward_weight(slot, wslot, grads);
        qkv_.backward_weight(wslot, xn, grads);
    }

    std::unique_ptr<KvCache> make_cache(int max_len, bool /*full_kv: MHA caches K|V anyway*/,
                                        int sequences) const override {
        QUINTET_CHECK(c_.d.tp == 1, "generation runs on one rank (tp = 1)");
        return std::make_unique<KvRowsCache>(c_.be, max_len, NKV_ * HD_, NKV_ * HD_, sequences);
    }

    void probe_logits(int slot, const TokenInfo& tok, RmsProbe& out) const override {
        const float* q = slots_[size_t(slot)].qkv;
        probe_scores(c_.be, args(tok), q, q + A_, tok.pos, out);
    }

private:
    struct Saved {
        float* qkv;  // [N, QKV] q | k | v after RoPE
        float* lse;  // [B, NH, T]
    };
    void rotate(float* qkv, const TokenInfo& tok, bool backward) {  // RoPE on q and k (or its backward)
        QUINTET_PROFILE("rope");
        const RopeArgs r{c_.N, NH_ + NKV_, HD_, 0, HD_, QKV_};
        if (backward) c_.be.rope_backward(qkv, rope_.cos, rope_.sin, tok.rope_pos, r);
        else c_.be.rope_forward(qkv, rope_.cos, rope_.sin, tok.rope_pos, r);
    }
    AttentionArgs args(const TokenInfo& tok) const {
        AttentionArgs a;
        a.B = c_.B, a.Tq = c_.T, a.Tk = c_.T;
        a.NH = NH_, a.NKV = NKV_, a.Dqk = HD_, a.Dv = HD_;
        a.q_stride = a.k_stride = a.v_stride = QKV_;
        a.o_stride = A_;
        a.scale = scale_;
        a.causal = true;
        a.q_pos = a.k_pos = tok.pos;
        a.q_doc = a.k_doc = tok.doc;
        return a;
    }

    // The attention core: out = softmax(q k^T) v over the (ring of) keys, into o_proj's input.
    void core_forward(int slot, const TokenInfo& tok) {
        QUINTET_PROFILE("attention.fwd");
        Saved& s = slots_[size_t(slot)];
        float* att = o_.input(slot, datt_);
        const float *q = s.qkv, *k = q + A_, *v = k + NKV_ * HD_;
        if (c_.cp) c_.cp->attention_forward(att, s.lse, q, k, v, args(tok), tok.pos_all, tok.doc_all);
        else c_.be.attention_forward(att, s.lse, q, k, v, args(tok));
        o_.input_written(slot, att, size_t(c_.N));
    }

    BlockContext& c_;
    const int NH_, NKV_, HD_, QKV_, A_;
    ColumnLinear qkv_;
    RowLinear o_;
    const float scale_;
    const BlockContext::RopeTable rope_;
    float *datt_, *lse_scratch_, *lse_ws_ = nullptr;
    std::vector<Saved> slots_;
};

}  // namespace

void mha_add_params(ParamBuilder& b, int layer) {
    const ModelDims& d = b.dims();
    const bool held = b.holds_layer(layer);
    const std::string p = prefix(layer);
    const int h0 = d.tp_rank * d.NHl * d.HD;
    b.add(ParamBuilder::row_shard(p + "q_proj.weight", d.NH * d.HD, d.C, d.NHl * d.HD, h0, InitRule::normal), held, true);
    for (const char* kv : {"k_proj", "v_proj"}) {
        ParamSpec s = ParamBuilder::row_shard(p + kv + ".weight", d.NKV * d.HD, d.C, d.NKVl * d.HD,
                                              d.kv_head0() * d.HD, InitRule::normal);
        if (d.tp > d.NKV) {  // one kv head shared by kv_group() tp ranks
            s.sync = GradSync::kv_group;
            s.writer = d.tp_rank % d.kv_group() == 0;
        }
        b.add(s, held, true);
    }
    b.add(ParamBuilder::col_shard(p + "o_proj.weight", d.C, d.NH * d.HD, d.NHl * d.HD, h0, InitRule::out_proj), held, true);
}

void mha_declare_buffers(const ModelDims& d, const BufferShape& s, BufferDecl& out) {
    const size_t N = size_t(s.N), QKV = size_t(d.qkv_local()), A = size_t(d.NHl) * d.HD;
    const size_t lse = size_t(s.B) * d.NHl * s.T;
    // q | k | v after RoPE; only B reads it, unless W recomputes the core from it (selective).
    const bool selective = s.recompute == Recompute::selective;
    out.per_slot(kQkv, N * QKV, !selective);
    if (!selective) out.per_slot(kLse, lse, true);
    else out.scratch(F32Buf{"attention.recomputed_lse"}, lse);
    declare_input(out, o_decl(d, N, s.recompute));  // the attention core's output, o_proj's input
    out.scratch(kDatt, N * A);
    declare_grad(out, o_decl(d, N, s.recompute), s);
    // (attention.qkv and attention.lse, side by side, are one B-only run: q|k|v's output gradient
    // is written there once the core's backward has read them.)
    declare_grad(out, qkv_decl(d, N), s);
    out.scratch(kLse, lse);
    BlockContext::declare_rope_table(out, d.HD, s.max_positions);
    if (s.cp > 1) {  // the ring's K|V blocks and partial results
        out.ring_kv = size_t(s.B) * s.T * d.NKVl * 2 * d.HD;
        out.ring_out = N * A;
        out.ring_lse = lse;
    }
}

std::unique_ptr<AttentionBlock> make_mha_attention(BlockContext& ctx, const ParamTable& t, int layer) {
    return std::make_unique<MhaAttention>(ctx, t, layer);
}

}  // namespace quintet
