#include "quintet/model/decoder.hpp"

#include <algorithm>
#include <cmath>

#include "quintet/model/rope.hpp"

namespace quintet {

const std::vector<float>& Decoder::step(int id, int pos) {
    const int C = d_.C, NH = d_.NH, NKV = d_.NKV, HD = d_.HD, F = d_.F, QKV = d_.qkv_local();
    const int group = NH / NKV;
    const float scale = 1.0f / std::sqrt(float(HD));
    float rstd;
    std::copy(w_.wte + size_t(id) * C, w_.wte + size_t(id + 1) * C, x_.begin());
    for (int l = 0; l < d_.L; ++l) {
        const LayerView& p = w_.layers[l];
        be_.rmsnorm_forward(xn_.data(), &rstd, x_.data(), p.ln1, 1, C, eps_);
        be_.gemm(false, true, 1, QKV, C, 1.0f, xn_.data(), C, p.wqkv, C, 0.0f, qkv_.data(), QKV);
        // rotate q and k of this one position (tables row `pos`)
        be_.rope_forward(qkv_.data(), cos_.data() + size_t(pos) * (HD / 2),
                         sin_.data() + size_t(pos) * (HD / 2), 1, 1, NH + NKV, HD, QKV);
        float* kc = kcache_.data() + size_t(l) * max_len_ * NKV * HD;
        float* vc = vcache_.data() + size_t(l) * max_len_ * NKV * HD;
        std::copy(qkv_.begin() + NH * HD, qkv_.begin() + (NH + NKV) * HD, kc + size_t(pos) * NKV * HD);
        std::copy(qkv_.begin() + (NH + NKV) * HD, qkv_.end(), vc + size_t(pos) * NKV * HD);
        for (int h = 0; h < NH; ++h) {
            int g = h / group;
            const float* q = qkv_.data() + h * HD;
            float mx = -INFINITY;
            for (int t = 0; t <= pos; ++t) {
                const float* k = kc + (size_t(t) * NKV + g) * HD;
                float s = 0.0f;
                for (int i = 0; i < HD; ++i) s += q[i] * k[i];
                scores_[t] = s * scale;
                mx = std::max(mx, scores_[t]);
            }
            float sum = 0.0f;
            for (int t = 0; t <= pos; ++t) sum += (scores_[t] = std::exp(scores_[t] - mx));
            float* o = att_.data() + h * HD;
            std::fill(o, o + HD, 0.0f);
            for (int t = 0; t <= pos; ++t) {
                const float* v = vc + (size_t(t) * NKV + g) * HD;
                float pr = scores_[t] / sum;
                for (int i = 0; i < HD; ++i) o[i] += pr * v[i];
            }
        }
        be_.gemm(false, true, 1, C, NH * HD, 1.0f, att_.data(), NH * HD, p.wo, NH * HD, 1.0f, x_.data(), C);
        be_.rmsnorm_forward(xn_.data(), &rstd, x_.data(), p.ln2, 1, C, eps_);
        be_.gemm(false, true, 1, 2 * F, C, 1.0f, xn_.data(), C, p.wgu, C, 0.0f, gu_.data(), 2 * F);
        be_.swiglu_forward(act_.data(), gu_.data(), 1, F);
        be_.gemm(false, true, 1, C, F, 1.0f, act_.data(), F, p.wdown, F, 1.0f, x_.data(), C);
    }
    be_.rmsnorm_forward(xn_.data(), &rstd, x_.data(), w_.norm, 1, C, eps_);
    be_.gemm(false, true, 1, d_.V, C, 1.0f, xn_.data(), C, w_.head, C, 0.0f, logits_.data(), d_.V);
    return logits_;
}

}  // namespace quintet
