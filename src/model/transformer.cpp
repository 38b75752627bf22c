#include "quintet/model/transformer.hpp"

#include <algorithm>
#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

ModelChunk::ModelChunk(Backend& be, const ModelConfig& m, const RopeConfig& rope,
                       const ParamTable& table, const ChunkPlan& plan, TensorParallel& tp, int B,
                       int T, Precision precision)
    : be_(be), d_(model_dims(m, tp.size(), tp.rank())), table_(table), plan_(plan), tp_(tp), B_(B),
      T_(T), N_(B * T), Nr_(tp.sp() ? B * T / tp.size() : B * T) {
    eps_ = float(m.norm_eps);
    attn_scale_ = float(1.0 / std::sqrt(double(d_.HD)));
    // MHA/GQA rotate every q/k dim, so YaRN's mscale^2 on the logits = mscale on cos and sin.
    std::vector<float> c, s;
    rope_tables(c, s, T, rope_inv_freq(rope, d_.HD, T), rope_mscale(rope));
    cos_ = buf(c.size(), false);
    sin_ = buf(s.size(), false);
    be_.from_host(cos_, c.data(), c.size());
    be_.from_host(sin_, s.data(), s.size());
    tgt_ = be_.alloc_i32(N_);
    host_ids_.resize(N_);
    host_tgt_.resize(N_);
    losses_.resize(N_);
    const size_t N = N_, C = d_.C;
    full_a_ = buf(N * C, false);
    full_b_ = buf(N * C, false);
    dshard_ = buf(size_t(Nr_) * C, false);
    datt_ = buf(N * d_.NHl * d_.HD, false);
    dqkv_ = buf(N * d_.qkv_local(), false);
    dgu_ = buf(N * 2 * d_.Fl, false);
    dact_ = buf(N * d_.Fl, false);
    bf16_ = precision == Precision::bf16;
    if (bf16_) {
        size_t widest = std::max({N * C, N * 2 * d_.Fl, N * d_.qkv_local()});
        if (plan_.last) widest = std::max(widest, N * d_.Vl());
        lowp_ = buf_bf16(widest, false);
        if (tp_.sp()) gather_bf16_ = buf_bf16(N * C, false);
    }
}

ModelChunk::~ModelChunk() {
    for (float* p : owned_) be_.release(p);
    for (bf16_bits* p : owned_bf16_) be_.release_bf16(p);
    be_.release_i32(tgt_);
    for (auto& s : slots_)
        if (s.ids) be_.release_i32(s.ids);
}

float* ModelChunk::buf(size_t n, bool per_slot) {
    float* p = be_.alloc(n);
    owned_.push_back(p);
    if (per_slot) slot_floats_ += n;
    return p;
}

bf16_bits* ModelChunk::buf_bf16(size_t n, bool per_slot) {
    bf16_bits* p = be_.alloc_bf16(n);
    owned_bf16_.push_back(p);
    if (per_slot) slot_floats_ += (n + 1) / 2;
    return p;
}

ModelChunk::Act ModelChunk::act_buf(size_t n) {
    Act a;
    if (bf16_) a.b = buf_bf16(n, true);
    else a.f = buf(n, true);
    return a;
}

void ModelChunk::keep(const Act& a, const float* scratch, size_t n) {
    if (bf16_) be_.to_bf16(a.b, scratch, n);
}

ModelChunk::Mat ModelChunk::gathered(const Act& a, size_t rows, size_t C) {
    if (bf16_) return {nullptr, tp_.gather(a.b, gather_bf16_, rows, C)};
    return {tp_.gather(a.f, full_a_, rows, C), nullptr};
}

ModelChunk::Mat ModelChunk::lowp(const float* x, size_t n) {
    if (!bf16_) return {x, nullptr};
    be_.to_bf16(lowp_, x, n);
    return {nullptr, lowp_};
}

void ModelChunk::mm(bool ta, bool tb, int M, int N, int K, Mat A, int lda, Mat B, int ldb,
                    float beta, float* C, int ldc) {
    if (bf16_) be_.gemm_bf16(ta, tb, M, N, K, 1.0f, A.b, lda, B.b, ldb, beta, C, ldc);
    else be_.gemm(ta, tb, M, N, K, 1.0f, A.f, lda, B.f, ldb, beta, C, ldc);
}

void ModelChunk::set_bf16_weights(const float* master, const bf16_bits* shadow) {
    QUINTET_CHECK(bf16_, "set_bf16_weights on an fp32 chunk");
    master_ = master;
    shadow_ = shadow;
}

const ChunkView& ModelChunk::view(ChunkView& cache, const float*& cached_base, const float* base) {
    if (base != cached_base) {
        cache = chunk_view(table_, plan_, const_cast<float*>(base));
        cached_base = base;
    }
    return cache;
}

int ModelChunk::add_slot() {
    slot_floats_ = 0;
    const size_t N = N_, Nr = Nr_, C = d_.C, A = size_t(d_.NHl) * d_.HD;
    const int nl = plan_.layer_end - plan_.layer_begin;
    Slot s;
    for (int i = 0; i <= nl; ++i) s.res.push_back(buf(Nr * C, true));
    for (int i = 0; i < nl; ++i) {
        Layer l;
        l.rstd1 = buf(Nr, true);
        l.xn1 = act_buf(Nr * C);
        l.qkv = buf(N * d_.qkv_local(), true);
        l.att = act_buf(N * A);
        l.lse = buf(size_t(B_) * d_.NHl * T_, true);
        l.h = buf(Nr * C, true);
        l.rstd2 = buf(Nr, true);
        l.xn2 = act_buf(Nr * C);
        l.gu = buf(N * 2 * d_.Fl, true);
        l.act = act_buf(N * d_.Fl);
        s.layers.push_back(l);
    }
    if (plan_.last) {
        s.rstd_f = buf(Nr, true);
        s.xf = act_buf(Nr * C);
        s.logits = buf(N * d_.Vl(), true);
    } else {
        s.dout = buf(Nr * C, true);
    }
    s.dres = buf(Nr * C, true);
    if (plan_.first) s.ids = be_.alloc_i32(N);
    slots_.push_back(std::move(s));
    return int(slots_.size()) - 1;
}

void ModelChunk::set_tokens(Slot& s, const int32_t* ids, const int32_t* targets) {
    // Ids and targets relative to this rank's vocabulary rows; -1 where another tp rank owns them.
    auto local = [&](int32_t x) { return x >= d_.v0 && x < d_.v1 ? x - d_.v0 : -1; };
    if (ids) {
        for (int n = 0; n < N_; ++n) host_ids_[n] = local(ids[n]);
        be_.from_host_i32(s.ids, host_ids_.data(), N_);
    }
    if (targets) {
        for (int n = 0; n < N_; ++n) host_tgt_[n] = local(targets[n]);
        be_.from_host_i32(tgt_, host_tgt_.data(), N_);
    }
}

double ModelChunk::forward(int si, const float* params, const int32_t* ids, const int32_t* targets,
                           float grad_scale, bool need_grad) {
    const int N = N_, Nr = Nr_, C = d_.C, F = d_.Fl, QKV = d_.qkv_local(), NH = d_.NHl,
              NKV = d_.NKVl, HD = d_.HD;
    const int A = NH * HD;
    const bool tp1 = tp_.size() == 1;
    Slot& s = slots_[si];
    QUINTET_CHECK(!bf16_ || params == master_, "bf16 chunk: params are not the arena set_bf16_weights named");
    const ChunkView& w = view(wview_, wbase_, params);
    set_tokens(s, plan_.first ? ids : nullptr, plan_.last ? targets : nullptr);
    // out[Nr,C] = res[Nr,C] + (X[N,K] W[C,K]^T summed over tp): a row-parallel block + residual.
    auto row_parallel_residual = [&](float* out, const float* res, Mat X, int K, const float* W) {
        be_.copy(out, res, size_t(Nr) * C);
        if (tp1) {
            mm(false, true, N, C, K, X, K, weight(W), K, 1.0f, out, C);
            return;
        }
        mm(false, true, N, C, K, X, K, weight(W), K, 0.0f, full_b_, C);
        be_.add_inplace(out, tp_.reduce(full_b_, dshard_, N, C), size_t(Nr) * C);
    };
    if (plan_.first) {
        if (tp1) {
            be_.embedding_forward(s.res[0], s.ids, w.wte, N, C);
        } else {  // vocab-parallel: each rank looks up its rows, the sum over tp completes x
            be_.embedding_forward(full_b_, s.ids, w.wte, N, C);
            be_.copy(s.res[0], tp_.reduce(full_b_, dshard_, N, C), size_t(Nr) * C);
        }
    }
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const LayerView& p = w.layers[i];
        Layer& l = s.layers[i];
        // h = x + o_proj(attention(rope(q, k), v)) on RMSNorm(x). In bf16 mode the kernels
        // write fp32 into scratch that is free during the forward (full_a_, datt_, dact_) and
        // only the bf16 copy is kept.
        float* xn1 = produce(l.xn1, full_a_);
        be_.rmsnorm_forward(xn1, l.rstd1, s.res[i], p.ln1, Nr, C, eps_);
        keep(l.xn1, xn1, size_t(Nr) * C);
        mm(false, true, N, QKV, C, gathered(l.xn1, N, C), C, weight(p.wqkv), C, 0.0f, l.qkv, QKV);
        be_.rope_forward(l.qkv, cos_, sin_, N, T_, NH + NKV, HD, QKV);
        float* att = produce(l.att, datt_);
        be_.attention_forward(att, l.lse, l.qkv, l.qkv + NH * HD, l.qkv + (NH + NKV) * HD, B_, T_,
                              NH, NKV, HD, QKV, QKV, attn_scale_);
        keep(l.att, att, size_t(N) * A);
        row_parallel_residual(l.h, s.res[i], local(l.att), A, p.wo);
        // y = h + down(silu(gate(z)) * up(z)), z = RMSNorm(h)
        float* xn2 = produce(l.xn2, full_a_);
        be_.rmsnorm_forward(xn2, l.rstd2, l.h, p.ln2, Nr, C, eps_);
        keep(l.xn2, xn2, size_t(Nr) * C);
        mm(false, true, N, 2 * F, C, gathered(l.xn2, N, C), C, weight(p.wgu), C, 0.0f, l.gu, 2 * F);
        float* act = produce(l.act, dact_);
        be_.swiglu_forward(act, l.gu, N, F);
        keep(l.act, act, size_t(N) * F);
        row_parallel_residual(s.res[i + 1], l.h, local(l.act), F, p.wdown);
    }
    if (!plan_.last) return 0.0;
    const int Vl = d_.Vl();
    float* xf = produce(s.xf, full_a_);
    be_.rmsnorm_forward(xf, s.rstd_f, s.res.back(), w.norm, Nr, C, eps_);
    keep(s.xf, xf, size_t(Nr) * C);
    mm(false, true, N, Vl, C, gathered(s.xf, N, C), C, weight(w.head), C, 0.0f, s.logits, Vl);
    if (tp1) {
        if (need_grad) be_.xent_forward_backward(s.logits, losses_.data(), tgt_, N, Vl, grad_scale);
        else be_.xent_forward(losses_.data(), s.logits, tgt_, N, Vl);
    } else {
        vocab_parallel_xent(be_, tp_, s.logits, losses_.data(), tgt_, N, Vl, grad_scale, need_grad, xent_);
    }
    double sum = 0.0;
    for (float x : losses_) sum += x;
    return sum;
}

void ModelChunk::backward(int si, const float* params, float* grads, GradReadyHook* hook) {
    const int N = N_, Nr = Nr_, C = d_.C, F = d_.Fl, QKV = d_.qkv_local(), NH = d_.NHl,
              NKV = d_.NKVl, HD = d_.HD;
    const int A = NH * HD;
    Slot& s = slots_[si];
    QUINTET_CHECK(!bf16_ || params == master_, "bf16 chunk: params are not the arena set_bf16_weights named");
    const ChunkView& w = view(wview_, wbase_, params);
    const ChunkView& g = view(gview_, gbase_, grads);
    float* dres = s.dres;  // dL/d(residual stream), this rank's rows
    auto done = [&](float* gt, size_t n) {
        if (hook) hook->ready(gt, n);
    };
    if (plan_.last) {
        const int Vl = d_.Vl();
        // s.logits holds grad_scale * dL/dlogits (written by the loss).
        Mat dlogits = lowp(s.logits, size_t(N) * Vl);
        mm(true, false, Vl, C, N, dlogits, Vl, gathered(s.xf, N, C), C, 1.0f, g.head, C);
        mm(false, false, N, C, Vl, dlogits, Vl, weight(w.head), C, 0.0f, full_b_, C);
        const float* dxf = tp_.reduce(full_b_, dshard_, N, C);
        be_.zero(dres, size_t(Nr) * C);
        be_.rmsnorm_backward(dres, g.norm, dxf, s.res.back(), w.norm, s.rstd_f, Nr, C);
        // A head tied to this chunk's own embedding completes only with the embedding backward.
        if (!(d_.tied && plan_.first)) done(g.head, size_t(Vl) * C);
        done(g.norm, C);
    } else {
        be_.copy(dres, s.dout, size_t(Nr) * C);
    }
    for (int i = int(s.layers.size()) - 1; i >= 0; --i) {
        const LayerView& p = w.layers[i];
        const LayerView& gp = g.layers[i];
        Layer& l = s.layers[i];
        // MLP branch; dres flows straight through the residual. (bf16: an activation gradient
        // is rounded once, into lowp_, for the two GEMMs that read it.)
        Mat D = lowp(tp_.gather(dres, full_a_, N, C), size_t(N) * C);
        mm(false, false, N, F, C, D, C, weight(p.wdown), F, 0.0f, dact_, F);
        mm(true, false, C, F, N, D, C, local(l.act), F, 1.0f, gp.wdown, F);
        be_.swiglu_backward(dgu_, dact_, l.gu, N, F);
        Mat dgu = lowp(dgu_, size_t(N) * 2 * F);
        // xn2 re-gathered, not kept (SP saves memory)
        mm(true, false, 2 * F, C, N, dgu, 2 * F, gathered(l.xn2, N, C), C, 1.0f, gp.wgu, C);
        mm(false, false, N, C, 2 * F, dgu, 2 * F, weight(p.wgu), C, 0.0f, full_b_, C);
        be_.rmsnorm_backward(dres, gp.ln2, tp_.reduce(full_b_, dshard_, N, C), l.h, p.ln2, l.rstd2, Nr, C);
        done(gp.wdown, size_t(C) * F);
        done(gp.wgu, size_t(2) * F * C);
        done(gp.ln2, C);
        // Attention branch.
        Mat Dh = lowp(tp_.gather(dres, full_a_, N, C), size_t(N) * C);
        mm(false, false, N, A, C, Dh, C, weight(p.wo), A, 0.0f, datt_, A);
        mm(true, false, C, A, N, Dh, C, local(l.att), A, 1.0f, gp.wo, A);
        const float* att = l.att.f;
        if (bf16_) {  // the backward's rowsum(dO * O) reads the stored (bf16) output, widened
            be_.from_bf16(full_b_, l.att.b, size_t(N) * A);
            att = full_b_;
        }
        be_.attention_backward(dqkv_, dqkv_ + NH * HD, dqkv_ + (NH + NKV) * HD, datt_, att, l.lse,
                               l.qkv, l.qkv + NH * HD, l.qkv + (NH + NKV) * HD, B_, T_, NH, NKV, HD,
                               QKV, QKV, attn_scale_);
        be_.rope_backward(dqkv_, cos_, sin_, N, T_, NH + NKV, HD, QKV);
        Mat dqkv = lowp(dqkv_, size_t(N) * QKV);
        mm(true, false, QKV, C, N, dqkv, QKV, gathered(l.xn1, N, C), C, 1.0f, gp.wqkv, C);
        mm(false, false, N, C, QKV, dqkv, QKV, weight(p.wqkv), C, 0.0f, full_b_, C);
        be_.rmsnorm_backward(dres, gp.ln1, tp_.reduce(full_b_, dshard_, N, C), s.res[i], p.ln1,
                             l.rstd1, Nr, C);
        done(gp.wo, size_t(C) * A);
        done(gp.wqkv, size_t(QKV) * C);
        done(gp.ln1, C);
    }
    if (plan_.first) {
        const float* D = tp_.gather(dres, full_a_, N, C);
        be_.embedding_backward(g.wte, D, s.ids, N, C, d_.Vl());
        done(g.wte, size_t(d_.Vl()) * C);
    }
}

double ModelChunk::forward_backward(const float* params, float* grads, const int32_t* ids,
                                    const int32_t* targets, float grad_scale) {
    QUINTET_CHECK(plan_.first && plan_.last, "forward_backward needs the whole model in one chunk");
    if (slots_.empty()) add_slot();
    double loss = forward(0, params, ids, targets, grad_scale, true);
    backward(0, params, grads);
    return loss;
}

double ModelChunk::forward_loss(const float* params, const int32_t* ids, const int32_t* targets) {
    QUINTET_CHECK(plan_.first && plan_.last, "forward_loss needs the whole model in one chunk");
    if (slots_.empty()) add_slot();
    return forward(0, params, ids, targets, 1.0f, false);
}

}  // namespace quintet
