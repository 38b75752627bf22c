#include "quintet/model/transformer.hpp"

#include <cmath>

#include "quintet/model/rope.hpp"

namespace quintet {

Transformer::Transformer(Backend& be, const ModelConfig& m, const RopeConfig& rope,
                         const ParamTable& table, int B, int T)
    : be_(be), d_(model_dims(m)), table_(table), B_(B), T_(T), N_(B * T) {
    eps_ = float(m.norm_eps);
    attn_scale_ = float(1.0 / std::sqrt(double(d_.HD)));
    // MHA/GQA rotate every q/k dim, so YaRN's mscale^2 on the logits = mscale on cos and sin.
    std::vector<float> c, s;
    rope_tables(c, s, T, rope_inv_freq(rope, d_.HD, T), rope_mscale(rope));
    auto buf = [&](size_t n, bool counted = true) {
        float* p = be_.alloc(n);
        owned_.push_back(p);
        if (counted) act_floats_ += n;
        return p;
    };
    cos_ = buf(c.size(), false);
    sin_ = buf(s.size(), false);
    be_.from_host(cos_, c.data(), c.size());
    be_.from_host(sin_, s.data(), s.size());
    ids_ = be_.alloc_i32(N_);
    tgt_ = be_.alloc_i32(N_);
    losses_.resize(N_);
    const size_t N = N_, C = d_.C, F = d_.F, QKV = d_.qkv();
    saved_.resize(d_.L);
    for (auto& sv : saved_) {
        sv.res = buf(N * C);
        sv.rstd1 = buf(N);
        sv.xn1 = buf(N * C);
        sv.qkv = buf(N * QKV);
        sv.att = buf(N * d_.NH * d_.HD);
        sv.lse = buf(size_t(B) * d_.NH * T);
        sv.h = buf(N * C);
        sv.rstd2 = buf(N);
        sv.xn2 = buf(N * C);
        sv.gu = buf(N * 2 * F);
        sv.act = buf(N * F);
    }
    res_final_ = buf(N * C);
    rstd_f_ = buf(N);
    xf_ = buf(N * C);
    logits_ = buf(N * d_.V);
    dres_ = buf(N * C);
    dxn_ = buf(N * C);
    datt_ = buf(N * d_.NH * d_.HD);
    dqkv_ = buf(N * QKV);
    dgu_ = buf(N * 2 * F);
    dact_ = buf(N * F);
}

Transformer::~Transformer() {
    for (float* p : owned_) be_.release(p);
    be_.release_i32(ids_);
    be_.release_i32(tgt_);
}

void Transformer::forward(const ModelView& w, bool) {
    const int N = N_, C = d_.C, F = d_.F, QKV = d_.qkv(), NH = d_.NH, NKV = d_.NKV, HD = d_.HD;
    const int A = NH * HD;  // attention output width
    be_.embedding_forward(saved_[0].res, ids_, w.wte, N, C);
    for (int l = 0; l < d_.L; ++l) {
        const LayerView& p = w.layers[l];
        Saved& s = saved_[l];
        float* out = l + 1 < d_.L ? saved_[l + 1].res : res_final_;
        // h = x + o_proj(attention(rope(q, k), v)) on RMSNorm(x)
        be_.rmsnorm_forward(s.xn1, s.rstd1, s.res, p.ln1, N, C, eps_);
        be_.gemm(false, true, N, QKV, C, 1.0f, s.xn1, C, p.wqkv, C, 0.0f, s.qkv, QKV);
        be_.rope_forward(s.qkv, cos_, sin_, N, T_, NH + NKV, HD, QKV);
        be_.attention_forward(s.att, s.lse, s.qkv, s.qkv + NH * HD, s.qkv + (NH + NKV) * HD, B_,
                              T_, NH, NKV, HD, QKV, QKV, attn_scale_);
        be_.copy(s.h, s.res, size_t(N) * C);
        be_.gemm(false, true, N, C, A, 1.0f, s.att, A, p.wo, A, 1.0f, s.h, C);
        // y = h + down(silu(gate(z)) * up(z)), z = RMSNorm(h)
        be_.rmsnorm_forward(s.xn2, s.rstd2, s.h, p.ln2, N, C, eps_);
        be_.gemm(false, true, N, 2 * F, C, 1.0f, s.xn2, C, p.wgu, C, 0.0f, s.gu, 2 * F);
        be_.swiglu_forward(s.act, s.gu, N, F);
        be_.copy(out, s.h, size_t(N) * C);
        be_.gemm(false, true, N, C, F, 1.0f, s.act, F, p.wdown, F, 1.0f, out, C);
    }
    be_.rmsnorm_forward(xf_, rstd_f_, res_final_, w.norm, N, C, eps_);
    be_.gemm(false, true, N, d_.V, C, 1.0f, xf_, C, w.head, C, 0.0f, logits_, d_.V);
}

void Transformer::backward(const ModelView& w, const ModelView& g) {
    const int N = N_, C = d_.C, F = d_.F, QKV = d_.qkv(), NH = d_.NH, NKV = d_.NKV, HD = d_.HD;
    const int V = d_.V, A = NH * HD;
    // logits_ holds dL/dlogits (written by the fused cross-entropy).
    be_.gemm(true, false, V, C, N, 1.0f, logits_, V, xf_, C, 1.0f, g.head, C);
    be_.gemm(false, false, N, C, V, 1.0f, logits_, V, w.head, C, 0.0f, dxn_, C);
    be_.zero(dres_, size_t(N) * C);
    be_.rmsnorm_backward(dres_, g.norm, dxn_, res_final_, w.norm, rstd_f_, N, C);
    for (int l = d_.L - 1; l >= 0; --l) {
        const LayerView& p = w.layers[l];
        const LayerView& gp = g.layers[l];
        Saved& s = saved_[l];
        // MLP branch; dres_ is dL/d(layer output) and flows straight through the residual.
        be_.gemm(false, false, N, F, C, 1.0f, dres_, C, p.wdown, F, 0.0f, dact_, F);
        be_.gemm(true, false, C, F, N, 1.0f, dres_, C, s.act, F, 1.0f, gp.wdown, F);
        be_.swiglu_backward(dgu_, dact_, s.gu, N, F);
        be_.gemm(true, false, 2 * F, C, N, 1.0f, dgu_, 2 * F, s.xn2, C, 1.0f, gp.wgu, C);
        be_.gemm(false, false, N, C, 2 * F, 1.0f, dgu_, 2 * F, p.wgu, C, 0.0f, dxn_, C);
        be_.rmsnorm_backward(dres_, gp.ln2, dxn_, s.h, p.ln2, s.rstd2, N, C);  // dres_ = dL/dh
        // Attention branch.
        be_.gemm(false, false, N, A, C, 1.0f, dres_, C, p.wo, A, 0.0f, datt_, A);
        be_.gemm(true, false, C, A, N, 1.0f, dres_, C, s.att, A, 1.0f, gp.wo, A);
        be_.attention_backward(dqkv_, dqkv_ + NH * HD, dqkv_ + (NH + NKV) * HD, datt_, s.att,
                               s.lse, s.qkv, s.qkv + NH * HD, s.qkv + (NH + NKV) * HD, B_, T_, NH,
                               NKV, HD, QKV, QKV, attn_scale_);
        be_.rope_backward(dqkv_, cos_, sin_, N, T_, NH + NKV, HD, QKV);
        be_.gemm(true, false, QKV, C, N, 1.0f, dqkv_, QKV, s.xn1, C, 1.0f, gp.wqkv, C);
        be_.gemm(false, false, N, C, QKV, 1.0f, dqkv_, QKV, p.wqkv, C, 0.0f, dxn_, C);
        be_.rmsnorm_backward(dres_, gp.ln1, dxn_, s.res, p.ln1, s.rstd1, N, C);  // dL/dx
    }
    be_.embedding_backward(g.wte, dres_, ids_, N, C, V);
}

double Transformer::forward_backward(const float* params, float* grads, const int32_t* ids,
                                     const int32_t* targets, float grad_scale) {
    be_.from_host_i32(ids_, ids, N_);
    be_.from_host_i32(tgt_, targets, N_);
    ModelView w = model_view(table_, d_, const_cast<float*>(params));
    ModelView g = model_view(table_, d_, grads);
    forward(w, true);
    be_.xent_forward_backward(logits_, losses_.data(), tgt_, N_, d_.V, grad_scale);
    backward(w, g);
    double sum = 0.0;
    for (float x : losses_) sum += x;
    return sum;
}

double Transformer::forward_loss(const float* params, const int32_t* ids, const int32_t* targets) {
    be_.from_host_i32(ids_, ids, N_);
    be_.from_host_i32(tgt_, targets, N_);
    ModelView w = model_view(table_, d_, const_cast<float*>(params));
    forward(w, false);
    be_.xent_forward(losses_.data(), logits_, tgt_, N_, d_.V);
    double sum = 0.0;
    for (float x : losses_) sum += x;
    return sum;
}

}  // namespace quintet
