// A naive double-precision attention (the definition of Backend::attention_forward, written
// plainly: every (query, key) pair, the mask from positions and documents, a full softmax), and
// helpers that make test cases of the general operation. Shared by the CPU, emulated and CUDA
// kernel tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "support/gradcheck.hpp"

namespace quintet::testing {

// One attention problem in host memory: q [B*Tq, q_stride], k/v [B*Tk, k/v_stride].
struct AttnProblem {
    AttentionArgs a;
    std::vector<float> q, k, v;
    std::vector<int32_t> qpos, kpos, qdoc, kdoc;
    // Fix the pointers after the vectors (and `a`) were filled or copied.
    void bind() {
        a.q_pos = qpos.data();
        a.k_pos = kpos.data();
        a.q_doc = qdoc.empty() ? nullptr : qdoc.data();
        a.k_doc = kdoc.empty() ? nullptr : kdoc.data();
    }
    size_t out_size() const { return size_t(a.B) * a.Tq * a.o_stride; }
    size_t lse_size() const { return size_t(a.B) * a.NH * a.Tq; }
};

// B sequences; keys at positions k0 .. k0+Tk-1, queries at q0 .. q0+Tq-1; strides padded by
// `pad` columns; documents of length doc_len (0: no document ids) counted from position 0.
inline AttnProblem make_problem(int B, int Tq, int Tk, int NH, int NKV, int Dqk, int Dv, int q0,
                                int k0, bool causal, int doc_len, uint32_t seed, int pad = 3) {
    AttnProblem p;
    AttentionArgs& a = p.a;
    a.B = B, a.Tq = Tq, a.Tk = Tk, a.NH = NH, a.NKV = NKV, a.Dqk = Dqk, a.Dv = Dv;
    a.q_stride = NH * Dqk + pad;
    a.k_stride = NKV * Dqk + pad;
    a.v_stride = NKV * Dv + pad;
    a.o_stride = NH * Dv + pad;
    a.scale = float(1.0 / std::sqrt(double(Dqk)));
    a.causal = causal;
    p.q = randn(size_t(B) * Tq * a.q_stride, seed);
    p.k = randn(size_t(B) * Tk * a.k_stride, seed + 1);
    p.v = randn(size_t(B) * Tk * a.v_stride, seed + 2);
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < Tq; ++t) {
            p.qpos.push_back(q0 + t);
            if (doc_len) p.qdoc.push_back((q0 + t + b) / doc_len);
        }
        for (int s = 0; s < Tk; ++s) {
            p.kpos.push_back(k0 + s);
            if (doc_len) p.kdoc.push_back((k0 + s + b) / doc_len);
        }
    }
    p.bind();
    return p;
}

inline bool ref_visible(const AttnProblem& p, size_t qr, size_t kr) {
    if (p.a.causal && p.kpos[kr] > p.qpos[qr]) return false;
    if (!p.qdoc.empty() && p.kdoc[kr] != p.qdoc[qr]) return false;
    return true;
}

// out [B*Tq, o_stride] (padding columns 0), lse [B, NH, Tq] in double.
inline void attention_reference(const AttnProblem& p, std::vector<double>& out,
                                std::vector<double>& lse) {
    const AttentionArgs& a = p.a;
    out.assign(p.out_size(), 0.0);
    lse.assign(p.lse_size(), -std::numeric_limits<double>::infinity());
    const int group = a.NH / a.NKV;
    for (int b = 0; b < a.B; ++b)
        for (int h = 0; h < a.NH; ++h) {
            const int g = h / group;
            for (int t = 0; t < a.Tq; ++t) {
                const size_t qr = size_t(b) * a.Tq + t;
                std::vector<double> s(size_t(a.Tk), 0.0);
                double mx = -std::numeric_limits<double>::infinity();
                for (int u = 0; u < a.Tk; ++u) {
                    const size_t kr = size_t(b) * a.Tk + u;
                    if (!ref_visible(p, qr, kr)) continue;
                    double d = 0;
                    for (int i = 0; i < a.Dqk; ++i)
                        d += double(p.q[qr * a.q_stride + h * a.Dqk + i]) * p.k[kr * a.k_stride + g * a.Dqk + i];
                    s[size_t(u)] = d * a.scale;
                    mx = std::max(mx, s[size_t(u)]);
                }
                if (mx == -std::numeric_limits<double>::infinity()) continue;
                double sum = 0;
                for (int u = 0; u < a.Tk; ++u)
                    if (ref_visible(p, qr, size_t(b) * a.Tk + u)) sum += std::exp(s[size_t(u)] - mx);
                lse[(size_t(b) * a.NH + h) * a.Tq + t] = mx + std::log(sum);
                for (int u = 0; u < a.Tk; ++u) {
                    const size_t kr = size_t(b) * a.Tk + u;
                    if (!ref_visible(p, qr, kr)) continue;
                    const double w = std::exp(s[size_t(u)] - mx) / sum;
                    for (int i = 0; i < a.Dv; ++i)
                        out[qr * a.o_stride + h * a.Dv + i] += w * p.v[kr * a.v_stride + g * a.Dv + i];
                }
            }
        }
}

// Largest |x - ref| over the non-padding columns of out, relative to max |ref|.
inline double out_rel_err(const AttnProblem& p, const std::vector<float>& x, const std::vector<double>& ref) {
    double err = 0, mx = 1e-12;
    for (size_t r = 0; r < size_t(p.a.B) * p.a.Tq; ++r)
        for (int c = 0; c < p.a.NH * p.a.Dv; ++c) {
            const size_t i = r * p.a.o_stride + c;
            err = std::max(err, std::abs(double(x[i]) - ref[i]));
            mx = std::max(mx, std::abs(ref[i]));
        }
    return err / mx;
}

inline double lse_err(const std::vector<float>& x, const std::vector<double>& ref) {
    double err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (std::isinf(ref[i])) {
            if (!(std::isinf(x[i]) && x[i] < 0)) return 1e30;
            continue;
        }
        err = std::max(err, std::abs(double(x[i]) - ref[i]));
    }
    return err;
}

}  // namespace quintet::testing
