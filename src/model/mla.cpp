// model.attention = mla: Multi-head Latent Attention (DeepSeek-V2; the model, maths and
// cache derivation in docs/math.md §7.2). Per token:
//     q      = q_b(RMSNorm(q_a(x)))  (or q_proj(x))          per head [q_nope | q_rope]
//     [c|kr] = kv_a_proj_with_mqa(x)                          c: the latent, kr: one shared k_rope
//     [kn|v] = kv_b(RMSNorm(c))                               per head
//     key    = [kn | RoPE(kr)], query = [q_nope | RoPE(q_rope)], scale 1/sqrt(nope+rope) * mscale²
// Training materialises per-head K and V and runs the general attention operation with
// Dqk = nope + rope and Dv = v_head_dim. Generation caches only [RMSNorm(c) | RoPE(kr)] per token
// and absorbs kv_b into the query and the output (MlaLatentCache).
//
// Tensor parallelism (docs/parallelism.md): q_b (or q_proj) and kv_b are column-parallel by head,
// o_proj row-parallel; q_a, kv_a and their norms are replicated over tp. Their gradients on a tp
// rank are the share of its heads (every step of their backward is linear in the incoming
// gradient), so they are summed over tp (GradSync::tp), and dx is reduced over tp once at the end.
//
// Context parallelism: parallel.cp_mla_kv = ring sends per-head K|V round the ring (as MHA);
// latent all-gathers the compressed rows [c | RoPE(kr)] (kv_lora_rank + qk_rope_dim numbers per
// token instead of n_heads * (nope + rope + v)) and every rank expands all of them with kv_b.
#include <algorithm>
#include <cmath>

#include "quintet/core/profile.hpp"
#include "quintet/core/error.hpp"
#include "quintet/model/block.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".self_attn."; }

struct MlaShape {
    int C, NH, NHl, h0, dn, dr, dv, rq, rkv;
    int Dqk() const { return dn + dr; }
    int Qw() const { return NHl * Dqk(); }        // q (and the assembled K) columns on this rank
    int KVBw() const { return NHl * (dn + dv); }  // kv_b output columns on this rank
    int Aw() const { return NHl * dv; }           // V and the attention output columns
    int Lw() const { return rkv + dr; }           // the latent row [c | k_rope]
};

MlaShape mla_shape(const ModelConfig& m, const ModelDims& d) {
    return {d.C, d.NH, d.NHl, d.tp_rank * d.NHl, m.qk_nope_dim, m.qk_rope_dim, m.v_head_dim,
            m.q_lora_rank, m.kv_lora_rank};
}

// The compressed cache of generation: per past token [RMSNorm(c) | RoPE(kr)], Lw floats. (The
// uncompressed alternative, quintet generate --kv-cache full, is a KvRowsCache of per-head K|V.)
// It also holds the absorbed query and output of the rows being added (generation only).
struct MlaLatentCache final : PositionedCache {
    float* lat = nullptr;   // [max_len, Lw]
    float* qlat = nullptr;  // [rows, NHl, Lw] the query in latent space
    float* olat = nullptr;  // [rows, NHl * rkv] the output in latent space
    int width = 0, rows = 0;
    size_t q_row = 0, o_row = 0;  // floats per row of qlat, olat
    MlaLatentCache(Backend& b, int max_len_, int width_, int rows_, size_t q_row_, size_t o_row_)
        : PositionedCache(b, max_len_), width(width_), rows(rows_), q_row(q_row_), o_row(o_row_) {
        lat = be.alloc(size_t(max_len) * width);
        qlat = be.alloc(size_t(rows) * q_row);
        olat = be.alloc(size_t(rows) * o_row);
    }
    // The scratch for n new rows at once (a prompt in one forward: Decoder::prefill).
    void reserve_rows(int n) {
        if (n <= rows) return;
        be.release(qlat);
        be.release(olat);
        rows = n;
        qlat = be.alloc(size_t(rows) * q_row);
        olat = be.alloc(size_t(rows) * o_row);
    }
    ~MlaLatentCache() override {
        be.release(lat);
        be.release(qlat);
        be.release(olat);
    }
    size_t bytes_per_token() const override { return size_t(width) * sizeof(float); }
};

class MlaAttention final : public AttentionBlock {
    struct Saved {
        float* qa = nullptr;      // [N, rq] q_a(x), the q norm's input (q_lora_rank > 0)
        float* qa_rstd = nullptr; // [N]
        Act qan;                  // [N, rq] RMSNorm(qa), q_b's input
        float* q = nullptr;       // [N, Qw] per head [q_nope | RoPE(q_rope)]
        float* c = nullptr;       // [R, rkv] the latent before its norm (R = N, or cp*N latent)
        float* c_rstd = nullptr;  // [R]
        Act cn;                   // [R, rkv] RMSNorm(c), kv_b's input
        float* k = nullptr;       // [R, Qw] per head [k_nope | RoPE(kr)]
        float* v = nullptr;       // [R, Aw]
        Act att;                  // [N, Aw] attention output
        float* lse = nullptr;     // [B, NHl, T]
    };

public:
    MlaAttention(BlockContext& ctx, const ModelConfig& m, const ParamTable& table, int layer)
        : c_(ctx), s_(mla_shape(m, ctx.d)), eps_(float(m.norm_eps)) {
        const std::string p = prefix(layer);
        if (s_.rq > 0) {
            wqa_ = table.offset_of(p + "q_a_proj.weight");
            wqan_ = table.offset_of(p + "q_a_layernorm.weight");
            wq_ = table.offset_of(p + "q_b_proj.weight");
        } else {
            wq_ = table.offset_of(p + "q_proj.weight");
        }
        wkva_ = table.offset_of(p + "kv_a_proj_with_mqa.weight");
        wkvan_ = table.offset_of(p + "kv_a_layernorm.weight");
        wkvb_ = table.offset_of(p + "kv_b_proj.weight");
        wo_ = table.offset_of(p + "o_proj.weight");
        latent_ = c_.cp && c_.cp->size() > 1 && c_.cp->mla_kv == MlaKv::latent;
        R_ = latent_ ? c_.cp->size() * c_.N : c_.N;
        // RoPE on the rope dims only; YaRN's mscale² multiplies the softmax scale (cos/sin plain).
        rope_ = c_.rope_table(s_.dr, 1.0);
        const double ms = rope_mscale(c_.rope);
        scale_ = float(ms * ms / std::sqrt(double(s_.Dqk())));
        const BufferViews& sh = c_.shared();
        kr_ = sh.f32("mla.kr");
        kvb_ = sh.f32("mla.kvb");
        stage_ = sh.f32("mla.stage");
        datt_ = sh.f32("mla.datt");
        dq_ = sh.f32("mla.dq");
        dk_ = sh.f32("mla.dk");
        dv_ = sh.f32("mla.dv");
        dkr_ = sh.f32("mla.dkr");
        dc_ = sh.f32("mla.dc");
        dcn_ = sh.f32("mla.dcn");
        lse_scratch_ = sh.f32("mla.lse");
        if (latent_) {
            lat_ = sh.f32("mla.latent");
            lat_all_ = sh.f32("mla.latent_all");
        }
        if (c_.bf16()) att32_ = sh.f32("mla.att_fp32");
        if (c_.recompute == Recompute::selective) {
            att_ws_ = sh.act("mla.recomputed_out");
            lse_ws_ = sh.f32("mla.recomputed_lse");
        }
    }

    // What the kind keeps (mla_declare_buffers below says how large).
    void add_slot(const BufferViews& v) override {
        Saved s;
        if (s_.rq > 0) {
            s.qa = v.f32("mla.qa");
            s.qa_rstd = v.f32("mla.qa_rstd");
            s.qan = v.act("mla.qa_normed");
        }
        s.q = v.f32("mla.q");
        s.c = v.f32("mla.c");
        s.c_rstd = v.f32("mla.c_rstd");
        s.cn = v.act("mla.c_normed");
        s.k = v.f32("mla.k");
        s.v = v.f32("mla.v");
        if (c_.recompute == Recompute::selective) {
            s.att = att_ws_;
            s.lse = lse_ws_;
        } else {
            s.att = v.act("mla.out");
            s.lse = v.f32("mla.lse");
        }
        slots_.push_back(s);
    }

    void add_deferred(const BufferViews& w) override {
        Deferred d;
        d.dh = w.act("w.mla.dh");
        d.dkvb = w.act("w.mla.dkvb");
        d.dcn = w.f32("w.mla.dcn");
        d.dc = w.act("w.mla.dc");
        d.dkr = w.act("w.mla.dkr");
        d.dq = w.act("w.mla.dq");
        if (s_.rq > 0) {
            d.dqan = w.f32("w.mla.dqan");
            d.dqa = w.act("w.mla.dqa");
        }
        wslots_.push_back(d);
    }

    void forward(int slot, const TokenInfo& tok, const float* params, const Act& xn, const float* x,
                 float* h, KvCache* cache) override {
        const int N = c_.N, C = s_.C;
        Saved& s = slots_[size_t(slot)];
        auto role = c_.role("gemm.mla");
        const Mat X = c_.gathered(xn, N, C);
        // q = q_b(RMSNorm(q_a(x))) or q_proj(x); RoPE on each head's q_rope.
        if (s_.rq > 0) {
            c_.mm(false, true, N, s_.rq, C, X, C, c_.weight(params + wqa_), C, 0.0f, s.qa, s_.rq);
            float* qan = c_.produce(s.qan, stage_);
            c_.be.rmsnorm_forward(qan, s.qa_rstd, s.qa, params + wqan_, N, s_.rq, eps_);
            c_.keep(s.qan, qan, size_t(N) * s_.rq);
            c_.mm(false, true, N, s_.Qw(), s_.rq, c_.local(s.qan), s_.rq, c_.weight(params + wq_), s_.rq,
                  0.0f, s.q, s_.Qw());
        } else {
            c_.mm(false, true, N, s_.Qw(), C, X, C, c_.weight(params + wq_), C, 0.0f, s.q, s_.Qw());
        }
        c_.be.rope_forward(s.q, rope_.cos, rope_.sin, tok.rope_pos, q_rope_args(N));
        // The latent c and the shared k_rope: the two row blocks of kv_a_proj_with_mqa.
        float* c_local = latent_ ? dc_ : s.c;  // latent mode: gathered into s.c below
        c_.mm(false, true, N, s_.rkv, C, X, C, c_.weight(params + wkva_), C, 0.0f, c_local, s_.rkv);
        c_.mm(false, true, N, s_.dr, C, X, C, c_.weight(params + wkva_ + size_t(s_.rkv) * C), C, 0.0f, kr_,
              s_.dr);
        c_.be.rope_forward(kr_, rope_.cos, rope_.sin, tok.rope_pos, kr_rope_args(N));
        if (cache) {
            forward_cached(s, tok, params, cache);
            c_.row_parallel_residual(h, x, c_.local(s.att), s_.Aw(), params + wo_);
            return;
        }
        if (latent_) {  // every rank's [c | RoPE(kr)]: all-gather, then unpack rank-major rows
            c_.be.copy_2d(lat_, s_.Lw(), c_local, s_.rkv, N, s_.rkv, false);
            c_.be.copy_2d(lat_ + s_.rkv, s_.Lw(), kr_, s_.dr, N, s_.dr, false);
            c_.cp->gather_rows(lat_, lat_all_, size_t(N) * s_.Lw());
            c_.be.copy_2d(s.c, s_.rkv, lat_all_, s_.Lw(), R_, s_.rkv, false);
            c_.be.copy_2d(kr_, s_.dr, lat_all_ + s_.rkv, s_.Lw(), R_, s_.dr, false);
        }
        expand(s, params, R_);
        core_forward(s, tok);
        c_.row_parallel_residual(h, x, c_.local(s.att), s_.Aw(), params + wo_);
    }

    // B: every input gradient, from o_proj back through the attention core, kv_b, the latent's
    // norm (and the cp exchange of the latent rows), kv_a and the query path; keeps each linear
    // layer's output gradient (and the two norms' incoming gradients) for W.
    const float* backward_input(int slot, int wslot, const TokenInfo& tok, const float* params, const Act& xn,
                                const float* dh) override {
        (void)xn;
        const int N = c_.N, C = s_.C, R = R_;
        const int Qw = s_.Qw(), Aw = s_.Aw(), KVBw = s_.KVBw(), Dqk = s_.Dqk();
        Saved& s = slots_[size_t(slot)];
        Deferred& w = wslots_[size_t(wslot)];
        auto role = c_.role("gemm.mla");
        if (c_.recompute == Recompute::selective) core_forward(s, tok);  // the same bits again
        // o_proj (row-parallel): datt = dh Wo.
        const Mat Dh = c_.save(w.dh, c_.tp.gather(dh, c_.produce(w.dh, c_.full_a), N, C), size_t(N) * C);
        c_.mm(false, false, N, Aw, C, Dh, C, c_.weight(params + wo_), Aw, 0.0f, datt_, Aw);
        const float* att = s.att.f;
        if (c_.bf16()) {  // rowsum(dO * O) reads the stored (bf16) output, widened
            c_.be.from_bf16(att32_, s.att.b, size_t(N) * Aw);
            att = att32_;
        }
        c_.be.zero(dq_, size_t(N) * Qw);
        c_.be.zero(dk_, size_t(R) * Qw);
        c_.be.zero(dv_, size_t(R) * Aw);
        const AttentionArgs a = args(tok);
        {
            QUINTET_PROFILE("attention.bwd");
            if (latent_)
                c_.cp->attention_backward_gathered(dq_, dk_, dv_, datt_, att, s.lse, s.q, s.k, s.v, a, tok.pos_all,
                                                   tok.doc_all);
            else if (c_.cp)
                c_.cp->attention_backward(dq_, dk_, dv_, datt_, att, s.lse, s.q, s.k, s.v, a, tok.pos_all,
                                          tok.doc_all);
            else
                c_.be.attention_backward(dq_, dk_, dv_, datt_, att, s.lse, s.q, s.k, s.v, a);
        }
        // dK, dV back into kv_b's layout; d(RoPE(kr)) = the sum over heads of dK's rope columns.
        const size_t rh = size_t(R) * s_.NHl;
        float* kvb = c_.produce(w.dkvb, kvb_);
        c_.be.copy_2d(kvb, s_.dn + s_.dv, dk_, Dqk, rh, s_.dn, false);
        c_.be.copy_2d(kvb + s_.dn, s_.dn + s_.dv, dv_, s_.dv, rh, s_.dv, false);
        for (int hh = 0; hh < s_.NHl; ++hh)
            c_.be.copy_2d(dkr_, s_.dr, dk_ + size_t(hh) * Dqk + s_.dn, Qw, R, s_.dr, hh > 0);
        // kv_b: dcn = dkvb W; then the latent's norm (its input gradient; the weight's is W's).
        const Mat Dkvb = c_.save(w.dkvb, kvb, size_t(R) * KVBw);
        c_.mm(false, false, R, s_.rkv, KVBw, Dkvb, KVBw, c_.weight(params + wkvb_), s_.rkv, 0.0f, w.dcn, s_.rkv);
        c_.be.zero(dc_, size_t(R) * s_.rkv);
        c_.be.rmsnorm_backward(dc_, nullptr, w.dcn, s.c, params + wkvan_, s.c_rstd, R, s_.rkv);
        const float* dc = dc_;
        if (latent_) {  // every rank's share of this rank's latent rows comes home
            c_.be.copy_2d(lat_all_, s_.Lw(), dc_, s_.rkv, R, s_.rkv, false);
            c_.be.copy_2d(lat_all_ + s_.rkv, s_.Lw(), dkr_, s_.dr, R, s_.dr, false);
            c_.cp->reduce_scatter_rows(lat_all_, lat_, size_t(N) * s_.Lw());
            c_.be.copy_2d(dcn_, s_.rkv, lat_, s_.Lw(), N, s_.rkv, false);
            c_.be.copy_2d(dkr_, s_.dr, lat_ + s_.rkv, s_.Lw(), N, s_.dr, false);
            dc = dcn_;
        }
        c_.be.rope_backward(dkr_, rope_.cos, rope_.sin, tok.rope_pos, kr_rope_args(N));
        // kv_a_proj_with_mqa: its two row blocks; dx = dc W_c + dkr W_kr (+ the q path below).
        const Mat Dc = c_.save(w.dc, dc, size_t(N) * s_.rkv);
        c_.mm(false, false, N, C, s_.rkv, Dc, s_.rkv, c_.weight(params + wkva_), C, 0.0f, c_.full_b, C);
        const Mat Dkr = c_.save(w.dkr, dkr_, size_t(N) * s_.dr);
        c_.mm(false, false, N, C, s_.dr, Dkr, s_.dr, c_.weight(params + wkva_ + size_t(s_.rkv) * C), C, 1.0f,
              c_.full_b, C);
        // The query path.
        c_.be.rope_backward(dq_, rope_.cos, rope_.sin, tok.rope_pos, q_rope_args(N));
        const Mat Dq = c_.save(w.dq, dq_, size_t(N) * Qw);
        if (s_.rq > 0) {
            c_.mm(false, false, N, s_.rq, Qw, Dq, Qw, c_.weight(params + wq_), s_.rq, 0.0f, w.dqan, s_.rq);
            float* dqa = stage_;
            c_.be.zero(dqa, size_t(N) * s_.rq);
            c_.be.rmsnorm_backward(dqa, nullptr, w.dqan, s.qa, params + wqan_, s.qa_rstd, N, s_.rq);
            const Mat Dqa = c_.save(w.dqa, dqa, size_t(N) * s_.rq);
            c_.mm(false, false, N, C, s_.rq, Dqa, s_.rq, c_.weight(params + wqa_), C, 1.0f, c_.full_b, C);
        } else {
            c_.mm(false, false, N, C, Qw, Dq, Qw, c_.weight(params + wq_), C, 1.0f, c_.full_b, C);
        }
        return c_.tp.reduce(c_.full_b, c_.dshard, N, C);
    }

    // W: every weight gradient from what B kept -- o_proj, kv_b, the latent's norm, kv_a's two
    // row blocks, the query path (q_b, its norm and q_a, or q_proj).
    void backward_weight(int slot, int wslot, const TokenInfo& tok, float* grads, const Act& xn,
                         bool later) override {
        const int N = c_.N, C = s_.C, R = R_;
        const int Qw = s_.Qw(), Aw = s_.Aw(), KVBw = s_.KVBw();
        Saved& s = slots_[size_t(slot)];
        Deferred& w = wslots_[size_t(wslot)];
        auto role = c_.role("gemm.mla");
        if (later && c_.recompute == Recompute::selective) core_forward(s, tok);  // o_proj's input again
        c_.mm(true, false, C, Aw, N, c_.deferred(w.dh), C, c_.local(s.att), Aw, 1.0f, grads + wo_, Aw);
        c_.mm(true, false, KVBw, s_.rkv, R, c_.deferred(w.dkvb), KVBw, c_.local(s.cn), s_.rkv, 1.0f, grads + wkvb_, s_.rkv);
        c_.be.rmsnorm_backward(nullptr, grads + wkvan_, w.dcn, s.c, nullptr, s.c_rstd, R, s_.rkv);
        const Mat X = c_.gathered(xn, N, C);
        c_.mm(true, false, s_.rkv, C, N, c_.deferred(w.dc), s_.rkv, X, C, 1.0f, grads + wkva_, C);
        c_.mm(true, false, s_.dr, C, N, c_.deferred(w.dkr), s_.dr, X, C, 1.0f, grads + wkva_ + size_t(s_.rkv) * C, C);
        if (s_.rq > 0) {
            c_.mm(true, false, Qw, s_.rq, N, c_.deferred(w.dq), Qw, c_.local(s.qan), s_.rq, 1.0f, grads + wq_, s_.rq);
            c_.be.rmsnorm_backward(nullptr, grads + wqan_, w.dqan, s.qa, nullptr, s.qa_rstd, N, s_.rq);
            c_.mm(true, false, s_.rq, C, N, c_.deferred(w.dqa), s_.rq, X, C, 1.0f, grads + wqa_, C);
        } else {
            c_.mm(true, false, Qw, C, N, c_.deferred(w.dq), Qw, X, C, 1.0f, grads + wq_, C);
        }
        c_.done(grads + wo_, size_t(C) * Aw);
        c_.done(grads + wkvb_, size_t(KVBw) * s_.rkv);
        c_.done(grads + wkvan_, size_t(s_.rkv));
        c_.done(grads + wkva_, size_t(s_.Lw()) * C);
        c_.done(grads + wq_, size_t(Qw) * (s_.rq > 0 ? s_.rq : C));
        if (s_.rq > 0) {
            c_.done(grads + wqan_, size_t(s_.rq));
            c_.done(grads + wqa_, size_t(s_.rq) * C);
        }
    }

    std::unique_ptr<KvCache> make_cache(int max_len, bool full_kv) const override {
        QUINTET_CHECK(c_.d.tp == 1, "generation runs on one rank (tp = 1)");
        if (full_kv) return std::make_unique<KvRowsCache>(c_.be, max_len, s_.Qw(), s_.Aw());
        return std::make_unique<MlaLatentCache>(c_.be, max_len, s_.Lw(), c_.N, size_t(s_.NHl) * s_.Lw(),
                                                size_t(s_.NHl) * s_.rkv);
    }

private:
    RopeArgs q_rope_args(int N) const { return {N, s_.NHl, s_.Dqk(), s_.dn, s_.dr, s_.Qw()}; }
    RopeArgs kr_rope_args(int N) const { return {N, 1, s_.dr, 0, s_.dr, s_.dr}; }

    AttentionArgs args(const TokenInfo& tok) const {
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

    // rows [0, R) of s.c (and kr_) -> RMSNorm -> kv_b -> per-head K = [k_nope | RoPE(kr)], V.
    void expand(Saved& s, const float* params, int R) {
        float* cn = c_.produce(s.cn, stage_);
        c_.be.rmsnorm_forward(cn, s.c_rstd, s.c, params + wkvan_, R, s_.rkv, eps_);
        c_.keep(s.cn, cn, size_t(R) * s_.rkv);
        c_.mm(false, true, R, s_.KVBw(), s_.rkv, c_.local(s.cn), s_.rkv, c_.weight(params + wkvb_), s_.rkv,
              0.0f, kvb_, s_.KVBw());
        assemble_kv(s.k, s.v, kvb_, kr_, R);
    }

    void assemble_kv(float* k, float* v, const float* kvb, const float* kr, int R) {
        const size_t rh = size_t(R) * s_.NHl;  // (row, head) pairs: kv_b's rows are head-major per token
        c_.be.copy_2d(k, s_.Dqk(), kvb, s_.dn + s_.dv, rh, s_.dn, false);
        c_.be.copy_2d(v, s_.dv, kvb + s_.dn, s_.dn + s_.dv, rh, s_.dv, false);
        for (int hh = 0; hh < s_.NHl; ++hh)
            c_.be.copy_2d(k + size_t(hh) * s_.Dqk() + s_.dn, s_.Qw(), kr, s_.dr, R, s_.dr, false);
    }

    // The attention core over the local keys, the ring, or every rank's gathered keys.
    void core_forward(Saved& s, const TokenInfo& tok) {
        QUINTET_PROFILE("attention.fwd");
        const int N = c_.N;
        float* att = c_.produce(s.att, datt_);
        const AttentionArgs a = args(tok);
        if (latent_)
            c_.cp->attention_forward_gathered(att, s.lse, s.q, s.k, s.v, a, tok.pos_all, tok.doc_all);
        else if (c_.cp)
            c_.cp->attention_forward(att, s.lse, s.q, s.k, s.v, a, tok.pos_all, tok.doc_all);
        else
            c_.be.attention_forward(att, s.lse, s.q, s.k, s.v, a);
        c_.keep(s.att, att, size_t(N) * s_.Aw());
    }

    // Generation: the new rows (B = 1) join the cache, then attend to all of it.
    void forward_cached(Saved& s, const TokenInfo& tok, const float* params, KvCache* cache) {
        const int N = c_.N;
        QUINTET_CHECK(c_.B == 1 && !c_.bf16(), "MLA generation: one sequence, fp32");
        float* att = c_.produce(s.att, datt_);
        if (auto* fc = dynamic_cast<KvRowsCache*>(cache)) {  // per-head K|V, as training
            QUINTET_CHECK(fc->len + N <= fc->max_len, "KV cache: within max_len");
            expand(s, params, N);
            c_.be.copy(fc->k + size_t(fc->len) * fc->kw, s.k, size_t(N) * fc->kw);
            c_.be.copy(fc->v + size_t(fc->len) * fc->vw, s.v, size_t(N) * fc->vw);
            fc->len += N;
            AttentionArgs a = args(tok);
            a.Tk = fc->len;
            a.k_pos = fc->pos;
            a.q_doc = a.k_doc = nullptr;
            c_.be.attention_forward(att, lse_scratch_, s.q, fc->k, fc->v, a);
            c_.keep(s.att, att, size_t(N) * s_.Aw());
            return;
        }
        auto& lc = static_cast<MlaLatentCache&>(*cache);
        QUINTET_CHECK(lc.len + N <= lc.max_len, "KV cache: within max_len");
        lc.reserve_rows(N);
        const int Lw = s_.Lw(), rkv = s_.rkv, dn = s_.dn, dv = s_.dv, NHl = s_.NHl;
        // The cache row: [RMSNorm(c) | RoPE(kr)].
        float* row = lc.lat + size_t(lc.len) * Lw;
        c_.be.rmsnorm_forward(stage_, s.c_rstd, s.c, params + wkvan_, N, rkv, eps_);
        c_.be.copy_2d(row, Lw, stage_, rkv, N, rkv, false);
        c_.be.copy_2d(row + rkv, Lw, kr_, s_.dr, N, s_.dr, false);
        lc.len += N;
        // Absorb kv_b's key half into the query: q_lat[h] = [q_nope[h] W_kb[h] | RoPE(q_rope[h])],
        // so that q_lat[h] . [cn | kr] = q_nope[h] . (W_kb[h] cn) + q_rope[h] . kr.
        const float* wkvb = params + wkvb_;
        float* qlat = lc.qlat;  // [N, NHl, Lw]
        for (int hh = 0; hh < NHl; ++hh) {
            const float* wkb = wkvb + size_t(hh) * (dn + dv) * rkv;  // rows [h(dn+dv), h(dn+dv)+dn)
            c_.be.gemm(false, false, N, rkv, dn, 1.0f, s.q + size_t(hh) * s_.Dqk(), s_.Qw(), wkb, rkv, 0.0f,
                       qlat + size_t(hh) * Lw, NHl * Lw);
            c_.be.copy_2d(qlat + size_t(hh) * Lw + rkv, size_t(NHl) * Lw, s.q + size_t(hh) * s_.Dqk() + dn,
                          s_.Qw(), N, s_.dr, false);
        }
        // One latent "kv head" shared by every query head (MQA over [cn | kr], values cn).
        AttentionArgs a;
        a.B = 1, a.Tq = N, a.Tk = lc.len;
        a.NH = NHl, a.NKV = 1;
        a.Dqk = Lw, a.Dv = rkv;
        a.q_stride = NHl * Lw, a.k_stride = a.v_stride = Lw, a.o_stride = NHl * rkv;
        a.scale = scale_;  // the scale of the uncompressed head dims, 1/sqrt(nope + rope)
        a.causal = true;
        a.q_pos = tok.pos, a.k_pos = lc.pos;
        float* olat = lc.olat;  // [N, NHl * rkv]
        c_.be.attention_forward(olat, lse_scratch_, qlat, lc.lat, lc.lat, a);
        // Absorb kv_b's value half into the output: out[h] = o_lat[h] W_vb[h]^T.
        for (int hh = 0; hh < NHl; ++hh) {
            const float* wvb = wkvb + (size_t(hh) * (dn + dv) + dn) * rkv;  // [dv, rkv]
            c_.be.gemm(false, true, N, dv, rkv, 1.0f, olat + size_t(hh) * rkv, NHl * rkv, wvb, rkv, 0.0f,
                       att + size_t(hh) * dv, s_.Aw());
        }
        c_.keep(s.att, att, size_t(N) * s_.Aw());
    }

    BlockContext& c_;
    const MlaShape s_;
    const float eps_;
    bool latent_ = false;
    int R_ = 0;  // key rows this rank expands: N, or cp * N in latent mode
    float scale_ = 1.0f;
    size_t wqa_ = 0, wqan_ = 0, wq_ = 0, wkva_ = 0, wkvan_ = 0, wkvb_ = 0, wo_ = 0;
    BlockContext::RopeTable rope_{};
    float *kr_, *kvb_, *stage_, *datt_, *dq_, *dk_, *dv_, *dkr_, *dc_, *dcn_, *lse_scratch_;
    float *lat_ = nullptr, *lat_all_ = nullptr, *att32_ = nullptr;
    Act att_ws_;
    float* lse_ws_ = nullptr;
    struct Deferred {  // B -> W
        Act dh;                 // [N, C] dL/dh gathered over tp: o_proj's output gradient
        Act dkvb;               // [R, KVBw] kv_b's output gradient
        float* dcn = nullptr;   // [R, rkv] the latent norm's output gradient (fp32)
        Act dc, dkr;            // [N, rkv], [N, dr] kv_a's two row blocks' output gradients
        Act dq;                 // [N, Qw] q_b's (or q_proj's) output gradient
        float* dqan = nullptr;  // [N, rq] the q norm's output gradient (q_lora_rank > 0)
        Act dqa;                // [N, rq] q_a's output gradient
    };
    std::vector<Saved> slots_;
    std::vector<Deferred> wslots_;
};

}  // namespace

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
    if (s.rq > 0) {
        replicated(ParamBuilder::whole(p + "q_a_proj.weight", s.rq, s.C, InitRule::normal), true);
        replicated(ParamBuilder::vector(p + "q_a_layernorm.weight", s.rq, InitRule::ones), false);
        b.add(ParamBuilder::row_shard(p + "q_b_proj.weight", s.NH * s.Dqk(), s.rq, s.Qw(), s.h0 * s.Dqk(),
                                      InitRule::normal),
              held, true);
    } else {
        b.add(ParamBuilder::row_shard(p + "q_proj.weight", s.NH * s.Dqk(), s.C, s.Qw(), s.h0 * s.Dqk(),
                                      InitRule::normal),
              held, true);
    }
    replicated(ParamBuilder::whole(p + "kv_a_proj_with_mqa.weight", s.Lw(), s.C, InitRule::normal), true);
    replicated(ParamBuilder::vector(p + "kv_a_layernorm.weight", s.rkv, InitRule::ones), false);
    b.add(ParamBuilder::row_shard(p + "kv_b_proj.weight", s.NH * (s.dn + s.dv), s.rkv, s.KVBw(),
                                  s.h0 * (s.dn + s.dv), InitRule::normal),
          held, true);
    b.add(ParamBuilder::col_shard(p + "o_proj.weight", s.C, s.NH * s.dv, s.Aw(), s.h0 * s.dv,
                                  InitRule::out_proj),
          held, true);
}

void mla_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, BufferDecl& out) {
    const MlaShape sh = mla_shape(m, d);
    const bool latent = s.mla_latent && s.cp > 1;
    const size_t N = size_t(s.N), R = latent ? size_t(s.cp) * N : N;  // key rows expanded on this rank
    const size_t lse = size_t(s.B) * sh.NHl * s.T;
    if (sh.rq > 0) {
        out.save("mla.qa", N * sh.rq);  // q_a(x), the q norm's input
        out.save("mla.qa_rstd", N);
        out.save("mla.qa_normed", N * sh.rq, Elem::act);  // q_b's input
    }
    out.save("mla.c", R * sh.rkv);        // the latent before its norm
    out.save("mla.c_rstd", R);
    out.save("mla.c_normed", R * sh.rkv, Elem::act);  // kv_b's input
    // q, k, v and the log-sum-exp, side by side: only B's attention backward reads them, unless
    // W recomputes the core from them (selective); then what B keeps for W may live there.
    const bool b_only = s.recompute != Recompute::selective;
    out.save("mla.q", N * sh.Qw(), Elem::f32, b_only);  // per head [q_nope | RoPE(q_rope)]
    out.save("mla.k", R * sh.Qw(), Elem::f32, b_only);  // per head [k_nope | RoPE(kr)]
    out.save("mla.v", R * sh.Aw(), Elem::f32, b_only);
    if (s.recompute != Recompute::selective) {
        out.save("mla.lse", lse, Elem::f32, true);
        out.save("mla.out", N * sh.Aw(), Elem::act);  // o_proj's input
    } else {
        out.scratch("mla.recomputed_out", N * sh.Aw(), Elem::act);
        out.scratch("mla.recomputed_lse", lse);
    }
    out.scratch("mla.kr", R * sh.dr);
    out.scratch("mla.kvb", R * sh.KVBw());  // bf16 staging of w.mla.dkvb; the forward's kv_b output
    out.defer("w.mla.dh", N * size_t(sh.C));  // written before the core's backward
    // Written after the attention core's backward has read q, k and v.
    const std::vector<std::string> qkv = {"mla.q"};
    out.defer("w.mla.dkvb", R * sh.KVBw(), Elem::act, qkv);
    out.defer("w.mla.dcn", R * sh.rkv, Elem::f32, qkv);
    out.defer("w.mla.dc", N * sh.rkv, Elem::act, qkv);
    out.defer("w.mla.dkr", N * sh.dr, Elem::act, qkv);
    out.defer("w.mla.dq", N * sh.Qw(), Elem::act, qkv);
    if (sh.rq > 0) {
        out.defer("w.mla.dqan", N * sh.rq, Elem::f32, qkv);
        out.defer("w.mla.dqa", N * sh.rq, Elem::act, qkv);
    }
    out.scratch("mla.stage", std::max(R * sh.rkv, N * size_t(std::max(sh.rq, sh.Aw()))));
    out.scratch("mla.datt", N * sh.Aw());
    out.scratch("mla.dq", N * sh.Qw());
    out.scratch("mla.dk", R * sh.Qw());
    out.scratch("mla.dv", R * sh.Aw());
    out.scratch("mla.dkr", R * sh.dr);
    out.scratch("mla.dc", R * sh.rkv);
    out.scratch("mla.dcn", R * size_t(std::max(sh.rkv, sh.rq)));
    out.scratch("mla.lse", lse);
    if (latent) {
        out.scratch("mla.latent", N * sh.Lw());
        out.scratch("mla.latent_all", R * sh.Lw());
    }
    if (s.bf16) out.scratch("mla.att_fp32", N * sh.Aw());
    BlockContext::declare_rope_table(out, sh.dr, s.max_positions);
    if (s.cp > 1) {  // ring: per-head K|V blocks (ring mode); partial results (both modes)
        if (!latent) out.ring_kv = size_t(s.B) * s.T * sh.NHl * size_t(sh.Dqk() + sh.dv);
        out.ring_out = N * sh.Aw();
        out.ring_lse = lse;
    }
}

std::unique_ptr<AttentionBlock> make_mla_attention(BlockContext& ctx, const ModelConfig& m,
                                                   const ParamTable& table, int layer) {
    return std::make_unique<MlaAttention>(ctx, m, table, layer);
}

}  // namespace quintet
