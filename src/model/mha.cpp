// model.attention = mha: multi-head attention with grouped KV heads (GQA when n_kv_heads <
// n_heads), RoPE on every q/k dim (YaRN's mscale folded into cos/sin), one fused q|k|v GEMM.
// Tensor parallelism (docs/parallelism.md): q|k|v column-parallel by head, o_proj row-parallel;
// with tp > n_kv_heads each kv head is replicated over the tp/n_kv_heads ranks that use it.
#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/block.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".self_attn."; }

class MhaAttention final : public AttentionBlock {
    struct Saved {
        float* qkv;  // [N, QKV] q | k | v after RoPE
        Act att;     // [N, A] attention output
        float* lse;  // [B, NH, T]
    };

public:
    MhaAttention(BlockContext& ctx, const ParamTable& table, int layer) : c_(ctx) {
        const ModelDims& d = c_.d;
        NH_ = d.NHl, NKV_ = d.NKVl, HD_ = d.HD, QKV_ = d.qkv_local(), A_ = NH_ * HD_;
        scale_ = float(1.0 / std::sqrt(double(HD_)));
        const std::string p = prefix(layer);
        wqkv_ = table.offset_of(p + "q_proj.weight");  // k_proj, v_proj follow contiguously
        QUINTET_CHECK(table.offset_of(p + "k_proj.weight") == wqkv_ + size_t(A_) * d.C &&
                          table.offset_of(p + "v_proj.weight") == wqkv_ + size_t(QKV_ - NKV_ * HD_) * d.C,
                      "q_proj, k_proj, v_proj are not adjacent in the arena");
        wo_ = table.offset_of(p + "o_proj.weight");
        // MHA/GQA rotate every q/k dim, so YaRN's mscale^2 on the logits = mscale on cos and sin.
        rope_ = c_.rope_table(HD_, rope_mscale(c_.rope));
        const BufferViews& sh = c_.shared();
        datt_ = sh.f32("attention.datt");
        // fp32 without a split schedule: straight into the deferred buffer (under one, that may
        // be q|k|v's own bytes, which the attention backward still reads).
        if (c_.bf16() || c_.split_bw) dqkv_ = sh.f32("attention.dqkv");
        lse_scratch_ = sh.f32("attention.lse");
        if (c_.recompute == Recompute::selective) {  // one output and lse for all layers and slots
            att_ws_ = sh.act("attention.recomputed_out");
            lse_ws_ = sh.f32("attention.recomputed_lse");
        }
    }

    // What the kind keeps (mha_declare_buffers below says how large).
    void add_slot(const BufferViews& v) override {
        Saved s;
        s.qkv = v.f32("attention.qkv");
        if (c_.recompute == Recompute::selective) {  // the attention core is recomputed
            s.att = att_ws_;
            s.lse = lse_ws_;
        } else {
            s.att = v.act("attention.out");
            s.lse = v.f32("attention.lse");
        }
        slots_.push_back(s);
    }

    void add_deferred(const BufferViews& w) override {
        Deferred d;
        d.dh = w.act("w.attn.dh");
        d.dqkv = w.act("w.attn.dqkv");
        wslots_.push_back(d);
    }

    void forward(int slot, const TokenInfo& tok, const float* params, const Act& xn, const float* x,
                 float* h, KvCache* cache) override {
        const int N = c_.N, C = c_.d.C;
        Saved& s = slots_[size_t(slot)];
        {
            auto role = c_.role("gemm.attn_qkv");
            c_.mm(false, true, N, QKV_, C, c_.gathered(xn, N, C), C, c_.weight(params + wqkv_), C, 0.0f,
                  s.qkv, QKV_);
        }
        RopeArgs r{N, NH_ + NKV_, HD_, 0, HD_, QKV_};
        {
            QUINTET_PROFILE("rope");
            c_.be.rope_forward(s.qkv, rope_.cos, rope_.sin, tok.rope_pos, r);
        }
        auto out_role = c_.role("gemm.attn_out");
        AttentionArgs a = args(tok);
        if (!cache) {
            core_forward(s, tok);
            c_.row_parallel_residual(h, x, c_.local(s.att), A_, params + wo_);
            return;
        }
        float* att = c_.produce(s.att, datt_);
        {
            auto& kc = static_cast<KvRowsCache&>(*cache);
            QUINTET_CHECK(c_.B == 1 && kc.len + N <= kc.max_len, "KV cache: one sequence, within max_len");
            const int kvw = NKV_ * HD_;
            for (int n = 0; n < N; ++n) {
                c_.be.copy(kc.k + size_t(kc.len + n) * kvw, s.qkv + size_t(n) * QKV_ + A_, size_t(kvw));
                c_.be.copy(kc.v + size_t(kc.len + n) * kvw, s.qkv + size_t(n) * QKV_ + A_ + kvw, size_t(kvw));
            }
            kc.len += N;
            a.Tk = kc.len;
            a.k_stride = a.v_stride = kvw;
            a.k_pos = kc.pos;
            a.q_doc = a.k_doc = nullptr;
            c_.be.attention_forward(att, lse_scratch_, s.qkv, kc.k, kc.v, a);
        }
        c_.keep(s.att, att, size_t(N) * A_);
        c_.row_parallel_residual(h, x, c_.local(s.att), A_, params + wo_);
    }

    // The attention core: out = softmax(q k^T) v over the (ring of) keys, into s.att and s.lse.
    void core_forward(Saved& s, const TokenInfo& tok) {
        QUINTET_PROFILE("attention.fwd");
        const int N = c_.N;
        float* att = c_.produce(s.att, datt_);
        const AttentionArgs a = args(tok);
        if (c_.cp)  // ring attention over the cp group
            c_.cp->attention_forward(att, s.lse, s.qkv, s.qkv + A_, s.qkv + A_ + NKV_ * HD_, a,
                                     tok.pos_all, tok.doc_all);
        else
            c_.be.attention_forward(att, s.lse, s.qkv, s.qkv + A_, s.qkv + A_ + NKV_ * HD_, a);
        c_.keep(s.att, att, size_t(N) * A_);
    }

    // B: d(att) = dh Wo, the attention core's backward, RoPE's; dxn = dqkv Wqkv. Keeps dh
    // (gathered) and dqkv for W.
    const float* backward_input(int slot, int wslot, const TokenInfo& tok, const float* params, const Act& xn,
                                const float* dh) override {
        (void)xn;
        const int N = c_.N, C = c_.d.C;
        Saved& s = slots_[size_t(slot)];
        Deferred& w = wslots_[size_t(wslot)];
        if (c_.recompute == Recompute::selective) core_forward(s, tok);  // the same bits again
        // (bf16: an activation gradient is rounded once, into the deferred buffer, for the two
        // GEMMs that read it.)
        const Mat Dh = c_.save(w.dh, c_.tp.gather(dh, c_.produce(w.dh, c_.full_a), N, C), size_t(N) * C);
        {
            auto role = c_.role("gemm.attn_out");
            c_.mm(false, false, N, A_, C, Dh, C, c_.weight(params + wo_), A_, 0.0f, datt_, A_);
        }
        const float* att = s.att.f;
        if (c_.bf16()) {  // the backward's rowsum(dO * O) reads the stored (bf16) output, widened
            c_.be.from_bf16(c_.full_b, s.att.b, size_t(N) * A_);
            att = c_.full_b;
        }
        float* dqkv = c_.split_bw ? dqkv_ : c_.produce(w.dqkv, dqkv_);
        const float* q = s.qkv;
        const float* k = q + A_;
        const float* v = k + NKV_ * HD_;
        c_.be.zero(dqkv, size_t(N) * QKV_);
        {
        QUINTET_PROFILE("attention.bwd");
        if (c_.cp)
            c_.cp->attention_backward(dqkv, dqkv + A_, dqkv + A_ + NKV_ * HD_, datt_, att, s.lse,
                                      q, k, v, args(tok), tok.pos_all, tok.doc_all);
        else
            c_.be.attention_backward(dqkv, dqkv + A_, dqkv + A_ + NKV_ * HD_, datt_, att, s.lse,
                                     q, k, v, args(tok));
        }
        RopeArgs r{N, NH_ + NKV_, HD_, 0, HD_, QKV_};
        {
            QUINTET_PROFILE("rope");
            c_.be.rope_backward(dqkv, rope_.cos, rope_.sin, tok.rope_pos, r);
        }
        auto role = c_.role("gemm.attn_qkv");
        const Mat Dqkv = c_.save(w.dqkv, dqkv, size_t(N) * QKV_);
        c_.mm(false, false, N, C, QKV_, Dqkv, QKV_, c_.weight(params + wqkv_), C, 0.0f, c_.full_b, C);
        return c_.tp.reduce(c_.full_b, c_.dshard, N, C);
    }

    // W: dWo += dh^T att, dWqkv += dqkv^T xn (xn re-gathered).
    void backward_weight(int slot, int wslot, const TokenInfo& tok, float* grads, const Act& xn,
                         bool later) override {
        const int N = c_.N, C = c_.d.C;
        Saved& s = slots_[size_t(slot)];
        Deferred& w = wslots_[size_t(wslot)];
        // Selective recomputation shares one attention output among the layers and slots: o_proj's
        // input again, when another backward ran since B.
        if (later && c_.recompute == Recompute::selective) core_forward(s, tok);
        {
            auto role = c_.role("gemm.attn_out");
            c_.mm(true, false, C, A_, N, c_.deferred(w.dh), C, c_.local(s.att), A_, 1.0f, grads + wo_, A_);
        }
        {
            auto role = c_.role("gemm.attn_qkv");
            c_.mm(true, false, QKV_, C, N, c_.deferred(w.dqkv), QKV_, c_.gathered(xn, N, C), C, 1.0f, grads + wqkv_, C);
        }
        c_.done(grads + wo_, size_t(C) * A_);
        c_.done(grads + wqkv_, size_t(QKV_) * C);
    }

    std::unique_ptr<KvCache> make_cache(int max_len, bool /*full_kv: MHA caches K|V anyway*/) const override {
        QUINTET_CHECK(c_.d.tp == 1, "generation runs on one rank (tp = 1)");
        return std::make_unique<KvRowsCache>(c_.be, max_len, NKV_ * HD_, NKV_ * HD_);
    }

private:
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
    BlockContext& c_;
    int NH_, NKV_, HD_, QKV_, A_;
    float scale_;
    size_t wqkv_ = 0, wo_ = 0;
    BlockContext::RopeTable rope_{};
    float *datt_, *dqkv_ = nullptr, *lse_scratch_;
    Act att_ws_;                 // selective recompute: the shared attention output
    float* lse_ws_ = nullptr;    //                      and its log-sum-exp
    struct Deferred {  // B -> W
        Act dh;    // [N, C] dL/dh gathered over tp: o_proj's output gradient
        Act dqkv;  // [N, QKV] d(q | k | v) before RoPE
    };
    std::vector<Saved> slots_;
    std::vector<Deferred> wslots_;
};

}  // namespace

void mha_add_params(ParamBuilder& b, int layer) {
    const ModelDims& d = b.dims();
    const bool held = b.holds_layer(layer);
    const std::string p = prefix(layer);
    const int h0 = d.tp_rank * d.NHl;
    b.add(ParamBuilder::row_shard(p + "q_proj.weight", d.NH * d.HD, d.C, d.NHl * d.HD, h0 * d.HD,
                                  InitRule::normal),
          held, true);
    for (const char* kv : {"k_proj", "v_proj"}) {
        ParamSpec s = ParamBuilder::row_shard(p + kv + ".weight", d.NKV * d.HD, d.C, d.NKVl * d.HD,
                                              d.kv_head0() * d.HD, InitRule::normal);
        if (d.tp > d.NKV) {  // one kv head shared by kv_group() tp ranks
            s.sync = GradSync::kv_group;
            s.writer = d.tp_rank % d.kv_group() == 0;
        }
        b.add(s, held, true);
    }
    b.add(ParamBuilder::col_shard(p + "o_proj.weight", d.C, d.NH * d.HD, d.NHl * d.HD, h0 * d.HD,
                                  InitRule::out_proj),
          held, true);
}

void mha_declare_buffers(const ModelDims& d, const BufferShape& s, BufferDecl& out) {
    const size_t N = size_t(s.N), QKV = size_t(d.qkv_local()), A = size_t(d.NHl) * d.HD;
    const size_t lse = size_t(s.B) * d.NHl * s.T;
    // q | k | v after RoPE; only B reads it, unless W recomputes the core from it (selective).
    const bool b_only = s.recompute != Recompute::selective;
    out.save("attention.qkv", N * QKV, Elem::f32, b_only);
    if (s.recompute != Recompute::selective) {
        out.save("attention.lse", lse, Elem::f32, true);
        out.save("attention.out", N * A, Elem::act);  // the attention core's output, o_proj's input
    } else {  // recomputed before the backward: one for all layers and slots
        out.scratch("attention.recomputed_out", N * A, Elem::act);
        out.scratch("attention.recomputed_lse", lse);
    }
    out.scratch("attention.datt", N * A);
    out.defer("w.attn.dh", N * size_t(d.C));
    out.defer("w.attn.dqkv", N * QKV, Elem::act, {"attention.qkv"});  // written once q|k|v are read
    // (attention.qkv and attention.lse, side by side, are one B-only run.)
    // fp32 before it is rounded (bf16) or copied (a split schedule) into w.attn.dqkv
    if (s.bf16 || s.split_bw) out.scratch("attention.dqkv", N * QKV);
    out.scratch("attention.lse", lse);
    BlockContext::declare_rope_table(out, d.HD, s.max_positions);
    if (s.cp > 1) {  // the ring's K|V blocks and partial results
        out.ring_kv = size_t(s.B) * s.T * d.NKVl * 2 * d.HD;
        out.ring_out = N * A;
        out.ring_lse = lse;
    }
}

std::unique_ptr<AttentionBlock> make_mha_attention(BlockContext& ctx, const ParamTable& table, int layer) {
    return std::make_unique<MhaAttention>(ctx, table, layer);
}

}  // namespace quintet
