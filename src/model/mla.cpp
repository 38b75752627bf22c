// model.attention = mla: the training path (model/mla.hpp says what it computes).
#include "mla.hpp"

#include <algorithm>
#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".self_attn."; }

constexpr F32Buf kQa{"mla.qa"}, kQaRstd{"mla.qa_rstd"}, kC{"mla.c"}, kCRstd{"mla.c_rstd"};
constexpr F32Buf kQ{"mla.q"}, kK{"mla.k"}, kV{"mla.v"}, kLse{"mla.lse"}, kRecomputedLse{"mla.recomputed_lse"};
constexpr F32Buf kKr{"mla.kr"}, kKvb{"mla.kvb"}, kStage{"mla.stage"}, kDatt{"mla.datt"}, kDq{"mla.dq"};
constexpr F32Buf kDk{"mla.dk"}, kDv{"mla.dv"}, kDkr{"mla.dkr"}, kDc{"mla.dc"}, kDcn{"mla.dcn"};
constexpr F32Buf kLatent{"mla.latent"}, kLatentAll{"mla.latent_all"}, kAtt32{"mla.att_fp32"};

// The linear layers' declarations. N: query rows; R: key rows expanded (N, or cp*N latent). What
// B keeps for W is written after the attention core's backward has read q, k and v: it may live
// there (`over`).
struct MlaDecls {
    LinearDecl q_a, q, kv_c, kv_r, kv_b, o;
    MlaDecls(const MlaShape& s, size_t N, size_t R, Recompute r) {
        const std::vector<std::string_view> qkv = {kQ.name};
        const size_t C = size_t(s.C), rq = size_t(s.rq);
        q_a = {"mla.q_a", N, C, rq, LinearInput::given, qkv};
        q = s.rq > 0 ? LinearDecl{"mla.q_b", N, rq, size_t(s.Qw()), LinearInput::kept, qkv}
                     : LinearDecl{"mla.q_proj", N, C, size_t(s.Qw()), LinearInput::given, qkv};
        kv_c = {"mla.kv_c", N, C, size_t(s.rkv), LinearInput::given, qkv};
        kv_r = {"mla.kv_r", N, C, size_t(s.dr), LinearInput::given, qkv};
        kv_b = {"mla.kv_b", R, size_t(s.rkv), size_t(s.KVBw()), LinearInput::kept, qkv};
        o = {"mla.o", N, size_t(s.Aw()), C, r == Recompute::selective ? LinearInput::recomputed : LinearInput::kept};
    }
};
size_t key_rows(const BlockContext& c) {
    return size_t(c.cp && c.cp->size() > 1 && c.cp->mla_kv == MlaKv::latent ? c.cp->size() * c.N : c.N);
}

}  // namespace

MlaShape mla_shape(const ModelConfig& m, const ModelDims& d) {
    return {d.C, d.NH, d.NHl, d.tp_rank * d.NHl, m.qk_nope_dim, m.qk_rope_dim, m.v_head_dim, m.q_lora_rank,
            m.kv_lora_rank};
}

MlaAttention::MlaAttention(BlockContext& ctx, const ModelConfig& m, const ParamTable& table, int layer)
    : c_(ctx), s_(mla_shape(m, ctx.d)),
      q_(ctx.lin, table, MlaDecls(s_, size_t(ctx.N), key_rows(ctx), ctx.recompute).q,
         prefix(layer) + (s_.rq > 0 ? "q_b_proj.weight" : "q_proj.weight"), "gemm.mla"),
      kv_c_(ctx.lin, table, MlaDecls(s_, size_t(ctx.N), key_rows(ctx), ctx.recompute).kv_c,
            prefix(layer) + "kv_a_proj_with_mqa.weight", "gemm.mla", 0, 0),
      kv_r_(ctx.lin, table, MlaDecls(s_, size_t(ctx.N), key_rows(ctx), ctx.recompute).kv_r,
            prefix(layer) + "kv_a_proj_with_mqa.weight", "gemm.mla", s_.rkv, size_t(s_.Lw()) * s_.C),
      kv_norm_(ctx.lin, table, prefix(layer) + "kv_a_layernorm.weight", s_.rkv, float(m.norm_eps), "mla.kv_norm"),
      kv_b_(ctx.lin, table, MlaDecls(s_, size_t(ctx.N), key_rows(ctx), ctx.recompute).kv_b,
            prefix(layer) + "kv_b_proj.weight", "gemm.mla"),
      o_(ctx.lin, table, MlaDecls(s_, size_t(ctx.N), key_rows(ctx), ctx.recompute).o, prefix(layer) + "o_proj.weight",
         "gemm.mla") {
    const std::string p = prefix(layer);
    if (s_.rq > 0) {
        q_a_.emplace(ctx.lin, table, MlaDecls(s_, size_t(ctx.N), key_rows(ctx), ctx.recompute).q_a,
                     p + "q_a_proj.weight", "gemm.mla");
        q_norm_.emplace(ctx.lin, table, p + "q_a_layernorm.weight", s_.rq, float(m.norm_eps), "mla.q_norm");
    }
    latent_ = key_rows(ctx) != size_t(ctx.N);
    R_ = int(key_rows(ctx));
    // RoPE on the rope dims only; YaRN as DeepSeek applies it (docs/math.md §4.4): cos/sin times
    // m(mscale) / m(mscale_all_dim), the softmax scale times m(mscale_all_dim)^2.
    rope_ = c_.rope_table(s_.dr, rope_table_factor(c_.rope));
    scale_ = float(c_.attn_mult * (rope_softmax_factor(c_.rope) / std::sqrt(double(s_.Dqk()))));
    const BufferViews& sh = c_.shared();
    kr_ = sh[kKr], kvb_ = sh[kKvb], stage_ = sh[kStage], datt_ = sh[kDatt];
    dq_ = sh[kDq], dk_ = sh[kDk], dv_ = sh[kDv], dkr_ = sh[kDkr], dc_ = sh[kDc], dcn_ = sh[kDcn];
    lse_scratch_ = sh[kLse];
    if (latent_) lat_ = sh[kLatent], lat_all_ = sh[kLatentAll];
    if (c_.bf16()) att32_ = sh[kAtt32];
    if (c_.recompute == Recompute::selective) lse_ws_ = sh[kRecomputedLse];
}

void MlaAttention::add_slot(const BufferViews& v) {
    Saved s;
    if (s_.rq > 0) s.qa = v[kQa], s.qa_rstd = v[kQaRstd];
    s.q = v[kQ], s.c = v[kC], s.c_rstd = v[kCRstd], s.k = v[kK], s.v = v[kV];
    s.lse = c_.recompute == Recompute::selective ? lse_ws_ : v[kLse];
    slots_.push_back(s);
    q_.add_slot(v);
    kv_b_.add_slot(v);
    o_.add_slot(v);
}

void MlaAttention::add_w_slot(const BufferViews& w) {
    for (Linear* l : {static_cast<Linear*>(&o_), &kv_b_, &kv_c_, &kv_r_, &q_}) l->add_w_slot(w);
    kv_norm_.add_w_slot(w);
    if (s_.rq > 0) {
        q_norm_->add_w_slot(w);
        q_a_->add_w_slot(w);
    }
}

void MlaAttention::forward(int slot, const TokenInfo& tok, const float* params, const Act& xn, const float* x,
                           float* h, KvCache* cache) {
    const int N = c_.N;
    Saved& s = slots_[size_t(slot)];
    const Mat X = ColumnLinear::gather(c_.lin, xn);
    // q = q_b(RMSNorm(q_a(x))) or q_proj(x); RoPE on each head's q_rope.
    if (s_.rq > 0) {
        q_a_->forward(X, N, s.qa, params);
        float* qan = q_.input(slot, stage_);
        q_norm_->forward(qan, s.qa_rstd, s.qa, params, N);
        q_.input_written(slot, qan, size_t(N));
        q_.forward_kept(slot, N, s.q, params);
    } else {
        q_.forward(X, N, s.q, params);
    }
    c_.be.rope_forward(s.q, rope_.cos, rope_.sin, tok.rope_pos, q_rope_args(N));
    // The latent c and the shared k_rope: the two row blocks of kv_a_proj_with_mqa.
    float* c_local = latent_ ? dc_ : s.c;  // latent mode: gathered into s.c below
    kv_c_.forward(X, N, c_local, params);
    kv_r_.forward(X, N, kr_, params);
    c_.be.rope_forward(kr_, rope_.cos, rope_.sin, tok.rope_pos, kr_rope_args(N));
    if (cache) {
        cached_core(slot, tok, params, cache);
    } else {
        if (latent_) {  // every rank's [c | RoPE(kr)]: all-gather, then unpack rank-major rows
            const int Lw = s_.Lw(), rkv = s_.rkv, dr = s_.dr;
            c_.be.copy_2d(lat_, Lw, c_local, rkv, N, rkv, false);
            c_.be.copy_2d(lat_ + rkv, Lw, kr_, dr, N, dr, false);
            c_.cp->gather_rows(lat_, lat_all_, size_t(N) * Lw);
            c_.be.copy_2d(s.c, rkv, lat_all_, Lw, R_, rkv, false);
            c_.be.copy_2d(kr_, dr, lat_all_ + rkv, Lw, R_, dr, false);
        }
        expand(slot, params, R_);
        core_forward(slot, tok);
    }
    o_.forward(slot, x, h, params);
}

// B: every input gradient, from o_proj back through the attention core, kv_b, the latent's norm
// (and the cp exchange of the latent rows), kv_a and the query path.
const float* MlaAttention::backward_input(int slot, int wslot, const TokenInfo& tok, const float* params, const Act&,
                                          const float* dh) {
    const int N = c_.N, R = R_, Qw = s_.Qw(), Aw = s_.Aw(), Dqk = s_.Dqk();
    Saved& s = slots_[size_t(slot)];
    if (c_.recompute == Recompute::selective) core_forward(slot, tok);  // the same bits again
    o_.backward_input(wslot, dh, datt_, params);
    const float* att = o_.input_fp32(slot, att32_, size_t(N));  // rowsum(dO * O) reads the kept output
    c_.be.zero(dq_, size_t(N) * Qw);
    c_.be.zero(dk_, size_t(R) * Qw);
    c_.be.zero(dv_, size_t(R) * Aw);
    {
        QUINTET_PROFILE("attention.bwd");
        const AttentionArgs a = args(tok);
        if (latent_)
            c_.cp->attention_backward_gathered(dq_, dk_, dv_, datt_, att, s.lse, s.q, s.k, s.v, a, tok.pos_all,
                                               tok.doc_all);
        else if (c_.cp)
            c_.cp->attention_backward(dq_, dk_, dv_, datt_, att, s.lse, s.q, s.k, s.v, a, tok.pos_all, tok.doc_all);
        else
            c_.be.attention_backward(dq_, dk_, dv_, datt_, att, s.lse, s.q, s.k, s.v, a);
    }
    // dK, dV back into kv_b's layout; d(RoPE(kr)) = the sum over heads of dK's rope columns.
    const size_t rh = size_t(R) * s_.NHl;
    float* kvb = kv_b_.grad_target(wslot, kvb_, true);
    c_.be.copy_2d(kvb, s_.dn + s_.dv, dk_, Dqk, rh, s_.dn, false);
    c_.be.copy_2d(kvb + s_.dn, s_.dn + s_.dv, dv_, s_.dv, rh, s_.dv, false);
    for (int hh = 0; hh < s_.NHl; ++hh)
        c_.be.copy_2d(dkr_, s_.dr, dk_ + size_t(hh) * Dqk + s_.dn, Qw, R, s_.dr, hh > 0);
    // kv_b, then the latent's norm (its input gradient; the weight's is W's).
    kv_b_.backward_input(wslot, kvb, R, kv_norm_.grad_target(wslot), params);
    c_.be.zero(dc_, size_t(R) * s_.rkv);
    kv_norm_.backward_input(wslot, dc_, kv_norm_.grad_target(wslot), s.c, params, s.c_rstd, R);
    const float* dc = dc_;
    if (latent_) {  // every rank's share of this rank's latent rows comes home
        const int Lw = s_.Lw(), rkv = s_.rkv, dr = s_.dr;
        c_.be.copy_2d(lat_all_, Lw, dc_, rkv, R, rkv, false);
        c_.be.copy_2d(lat_all_ + rkv, Lw, dkr_, dr, R, dr, false);
        c_.cp->reduce_scatter_rows(lat_all_, lat_, size_t(N) * Lw);
        c_.be.copy_2d(dcn_, rkv, lat_, Lw, N, rkv, false);
        c_.be.copy_2d(dkr_, dr, lat_ + rkv, Lw, N, dr, false);
        dc = dcn_;
    }
    c_.be.rope_backward(dkr_, rope_.cos, rope_.sin, tok.rope_pos, kr_rope_args(N));
    // kv_a_proj_with_mqa's two row blocks, then the query path, summed into the entry's dx.
    float* dx = c_.lin.full_b;
    kv_c_.backward_input(wslot, dc, N, dx, params);
    kv_r_.backward_input(wslot, dkr_, N, dx, params, 1.0f);
    c_.be.rope_backward(dq_, rope_.cos, rope_.sin, tok.rope_pos, q_rope_args(N));
    if (s_.rq > 0) {
        q_.backward_input(wslot, dq_, N, q_norm_->grad_target(wslot), params);
        c_.be.zero(stage_, size_t(N) * s_.rq);
        q_norm_->backward_input(wslot, stage_, q_norm_->grad_target(wslot), s.qa, params, s.qa_rstd, N);
        q_a_->backward_input(wslot, stage_, N, dx, params, 1.0f);
    } else {
        q_.backward_input(wslot, dq_, N, dx, params, 1.0f);
    }
    return ColumnLinear::reduce_input_grad(c_.lin);
}

// W: every weight gradient from what B kept -- o_proj, kv_b, the latent's norm, kv_a's two row
// blocks, the query path (q_b, its norm and q_a, or q_proj).
void MlaAttention::backward_weight(int slot, int wslot, const TokenInfo& tok, float* grads, const Act& xn, bool later) {
    const int N = c_.N;
    Saved& s = slots_[size_t(slot)];
    if (later && c_.recompute == Recompute::selective) core_forward(slot, tok);  // o_proj's input again
    o_.backward_weight(slot, wslot, grads);
    kv_b_.backward_weight_kept(slot, wslot, R_, grads);
    kv_norm_.backward_weight(wslot, grads, s.c, s.c_rstd, R_);
    const Mat X = ColumnLinear::gather(c_.lin, xn);
    kv_c_.backward_weight(wslot, X, N, grads);
    kv_r_.backward_weight(wslot, X, N, grads);
    if (s_.rq > 0) {
        q_.backward_weight_kept(slot, wslot, N, grads);
        q_norm_->backward_weight(wslot, grads, s.qa, s.qa_rstd, N);
        q_a_->backward_weight(wslot, X, N, grads);
    } else {
        q_.backward_weight(wslot, X, N, grads);
    }
}

void MlaAttention::probe_logits(int slot, const TokenInfo& tok, RmsProbe& out) const {
    const Saved& s = slots_[size_t(slot)];
    // Latent mode expands every cp rank's keys (rank-major): this rank's are its block.
    const float* k = latent_ ? s.k + size_t(c_.cp->rank()) * c_.N * s_.Qw() : s.k;
    probe_scores(c_.be, args(tok), s.q, k, tok.pos, out);
}

AttentionArgs MlaAttention::args(const TokenInfo& tok) const {
    AttentionArgs a;
    a.B = c_.B, a.Tq = c_.T, a.Tk = c_.T;
    a.NH = a.NKV = s_.NHl;
    a.Dqk = s_.Dqk(), a.Dv = s_.dv;
    a.q_stride = a.k_stride = s_.Qw();
    a.v_stride = a.o_stride = s_.Aw();
    a.scale = scale_;
    a.causal = true;
    a.q_pos = a.k_pos = tok.pos;
    a.q_doc = a.k_doc = tok.doc;
    return a;
}

void MlaAttention::expand(int slot, const float* params, int R) {
    Saved& s = slots_[size_t(slot)];
    float* cn = kv_b_.input(slot, stage_);
    kv_norm_.forward(cn, s.c_rstd, s.c, params, R);
    kv_b_.input_written(slot, cn, size_t(R));
    kv_b_.forward_kept(slot, R, kvb_, params);
    assemble_kv(s.k, s.v, kvb_, kr_, R);
}

void MlaAttention::assemble_kv(float* k, float* v, const float* kvb, const float* kr, int R) {
    const size_t rh = size_t(R) * s_.NHl;  // (row, head) pairs: kv_b's rows are head-major per token
    c_.be.copy_2d(k, s_.Dqk(), kvb, s_.dn + s_.dv, rh, s_.dn, false);
    c_.be.copy_2d(v, s_.dv, kvb + s_.dn, s_.dn + s_.dv, rh, s_.dv, false);
    for (int hh = 0; hh < s_.NHl; ++hh)
        c_.be.copy_2d(k + size_t(hh) * s_.Dqk() + s_.dn, s_.Qw(), kr, s_.dr, R, s_.dr, false);
}

// The attention core over the local keys, the ring, or every rank's gathered keys.
void MlaAttention::core_forward(int slot, const TokenInfo& tok) {
    QUINTET_PROFILE("attention.fwd");
    Saved& s = slots_[size_t(slot)];
    float* att = o_.input(slot, datt_);
    const AttentionArgs a = args(tok);
    if (latent_) c_.cp->attention_forward_gathered(att, s.lse, s.q, s.k, s.v, a, tok.pos_all, tok.doc_all);
    else if (c_.cp) c_.cp->attention_forward(att, s.lse, s.q, s.k, s.v, a, tok.pos_all, tok.doc_all);
    else c_.be.attention_forward(att, s.lse, s.q, s.k, s.v, a);
    o_.input_written(slot, att, size_t(c_.N));
}

void mla_add_params(const ModelConfig& m, ParamBuilder& b, int layer) {
    const ModelDims& d = b.dims();
    const MlaShape s = mla_shape(m, d);
    const bool held = b.holds_layer(layer);
    const std::string p = prefix(layer);
    // Replicated over tp: each tp rank's gradient is its heads' share, summed over tp.
    auto replicated = [&](ParamSpec spec, bool matmul) {
        if (d.tp > 1) spec.sync = GradSync::tp;
        spec.writer = d.tp_rank == 0;
        b.add(spec, held, matmul);
    };
    auto heads = [&](const std::string& name, int per_head, int cols, InitRule init) {
        b.add(ParamBuilder::row_shard(p + name, s.NH * per_head, cols, s.NHl * per_head, s.h0 * per_head, init), held,
              true);
    };
    if (s.rq > 0) {
        replicated(ParamBuilder::whole(p + "q_a_proj.weight", s.rq, s.C, InitRule::normal), true);
        replicated(ParamBuilder::vector(p + "q_a_layernorm.weight", s.rq, InitRule::ones), false);
        heads("q_b_proj.weight", s.Dqk(), s.rq, InitRule::normal);
    } else {
        heads("q_proj.weight", s.Dqk(), s.C, InitRule::normal);
    }
    replicated(ParamBuilder::whole(p + "kv_a_proj_with_mqa.weight", s.Lw(), s.C, InitRule::normal), true);
    replicated(ParamBuilder::vector(p + "kv_a_layernorm.weight", s.rkv, InitRule::ones), false);
    heads("kv_b_proj.weight", s.dn + s.dv, s.rkv, InitRule::normal);
    b.add(ParamBuilder::col_shard(p + "o_proj.weight", s.C, s.NH * s.dv, s.Aw(), s.h0 * s.dv, InitRule::out_proj), held,
          true);
}

void mla_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, BufferDecl& out) {
    const MlaShape sh = mla_shape(m, d);
    const bool latent = s.mla_latent && s.cp > 1;
    const size_t N = size_t(s.N), R = latent ? size_t(s.cp) * N : N;  // key rows expanded on this rank
    const size_t lse = size_t(s.B) * sh.NHl * s.T;
    const MlaDecls l(sh, N, R, s.recompute);
    if (sh.rq > 0) {
        out.per_slot(kQa, N * sh.rq);  // q_a(x), the q norm's input
        out.per_slot(kQaRstd, N);
        declare_input(out, l.q);  // RMSNorm(qa), q_b's input
    }
    out.per_slot(kC, R * sh.rkv);  // the latent before its norm
    out.per_slot(kCRstd, R);
    declare_input(out, l.kv_b);  // RMSNorm(c), kv_b's input
    // q, k, v and the log-sum-exp, side by side: only B's attention backward reads them, unless
    // W recomputes the core from them (selective); then what B keeps for W may live there.
    const bool selective = s.recompute == Recompute::selective;
    out.per_slot(kQ, N * sh.Qw(), !selective);  // per head [q_nope | RoPE(q_rope)]
    out.per_slot(kK, R * sh.Qw(), !selective);  // per head [k_nope | RoPE(kr)]
    out.per_slot(kV, R * sh.Aw(), !selective);
    if (!selective) out.per_slot(kLse, lse, true);
    else out.scratch(kRecomputedLse, lse);
    declare_input(out, l.o);  // the attention output, o_proj's input
    out.scratch(kKr, R * sh.dr);
    out.scratch(kKvb, R * sh.KVBw());  // the forward's kv_b output; the bf16 staging of its gradient
    declare_grad(out, l.o, s);          // written before the core's backward
    declare_grad(out, l.kv_b, s);       // the rest once the core's backward has read q, k and v
    RmsNormLayer::declare_grad(out, "mla.kv_norm", R, size_t(sh.rkv), {kQ.name});
    declare_grad(out, l.kv_c, s);
    declare_grad(out, l.kv_r, s);
    declare_grad(out, l.q, s);
    if (sh.rq > 0) {
        RmsNormLayer::declare_grad(out, "mla.q_norm", N, size_t(sh.rq), {kQ.name});
        declare_grad(out, l.q_a, s);
    }
    out.scratch(kStage, std::max(R * sh.rkv, N * size_t(std::max(sh.rq, sh.Aw()))));
    out.scratch(kDatt, N * sh.Aw());
    out.scratch(kDq, N * sh.Qw());
    out.scratch(kDk, R * sh.Qw());
    out.scratch(kDv, R * sh.Aw());
    out.scratch(kDkr, R * sh.dr);
    out.scratch(kDc, R * sh.rkv);
    out.scratch(kDcn, R * size_t(std::max(sh.rkv, sh.rq)));
    out.scratch(kLse, lse);
    if (latent) {
        out.scratch(kLatent, N * sh.Lw());
        out.scratch(kLatentAll, R * sh.Lw());
    }
    if (s.bf16) out.scratch(kAtt32, N * sh.Aw());
    BlockContext::declare_rope_table(out, sh.dr, s.max_positions);
    if (s.cp > 1) {  // ring: per-head K|V blocks (ring mode); partial results (both modes)
        if (!latent) out.ring_kv = size_t(s.B) * s.T * sh.NHl * size_t(sh.Dqk() + sh.dv);
        out.ring_out = N * sh.Aw();
        out.ring_lse = lse;
    }
}

std::unique_ptr<AttentionBlock> make_mla_attention(BlockContext& ctx, const ModelConfig& m, const ParamTable& table,
                                                   int layer) {
    return std::make_unique<MlaAttention>(ctx, m, table, layer);
}

}  // namespace quintet
