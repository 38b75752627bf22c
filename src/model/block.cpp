#include "quintet/model/block.hpp"

#include "quintet/core/error.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

BlockContext::BlockContext(LinearContext& lin_, const ModelDims& d_, int B_, int T_, const RopeConfig& rope_,
                           int rope_seq_len_, int max_positions_, ContextParallel* cp_, Recompute recompute_)
    : lin(lin_), be(lin_.be), tp(lin_.tp), d(d_), B(B_), T(T_), N(B_ * T_), Nr(lin_.Nr), rope(rope_),
      rope_seq_len(rope_seq_len_), max_positions(max_positions_), cp(cp_), recompute(recompute_) {
    QUINTET_CHECK(lin.N == N && lin.C == d.C, "the linear layers' context is another chunk's");
}

namespace {
// One table per rotated width: a chunk's attention kind uses one amplitude for it.
std::string rope_name(int dim, const char* part) { return "rope." + std::to_string(dim) + "." + part; }
}  // namespace

void BlockContext::declare_rope_table(BufferDecl& out, int dim, int max_positions) {
    const size_t n = size_t(max_positions) * size_t(dim / 2);
    out.scratch(F32Buf{rope_name(dim, "cos")}, n);
    out.scratch(F32Buf{rope_name(dim, "sin")}, n);
}

BlockContext::RopeTable BlockContext::rope_table(int dim, double amplitude) {
    float* cs = shared()[F32Buf{rope_name(dim, "cos")}];
    float* sn = shared()[F32Buf{rope_name(dim, "sin")}];
    for (const auto& [w, a] : rope_filled_)
        if (w == dim) {
            QUINTET_CHECK(a == amplitude, "two RoPE amplitudes for one rotated width in a chunk");
            return {cs, sn};
        }
    std::vector<float> c, s;
    rope_tables(c, s, max_positions, rope_inv_freq(rope, dim, rope_seq_len), amplitude);
    QUINTET_CHECK(c.size() == size_t(max_positions) * size_t(dim / 2), "RoPE table size differs from its declaration");
    be.from_host(cs, c.data(), c.size());
    be.from_host(sn, s.data(), s.size());
    rope_filled_.push_back({dim, amplitude});
    return {cs, sn};
}

void probe_scores(Backend& be, const AttentionArgs& a, const float* q, const float* k, const int32_t* pos,
                  RmsProbe& out) {
    const size_t rows = size_t(a.B) * a.Tq;
    std::vector<float> hq(rows * size_t(a.q_stride)), hk(rows * size_t(a.k_stride));
    std::vector<int32_t> hp(rows);
    be.to_host(hq.data(), q, hq.size());
    be.to_host(hk.data(), k, hk.size());
    be.to_host_i32(hp.data(), pos, rows);
    const int group = a.NH / a.NKV;
    double ss = 0, n = 0;
    for (int b = 0; b < a.B; ++b)
        for (int h = 0; h < a.NH; ++h)
            for (int i = 0; i < a.Tq; ++i)
                for (int j = 0; j < a.Tq; ++j) {
                    const size_t qi = size_t(b) * a.Tq + size_t(i), kj = size_t(b) * a.Tq + size_t(j);
                    if (hp[kj] > hp[qi]) continue;  // causal: keys at or before the query
                    double dot = 0;
                    const float* qr = hq.data() + qi * size_t(a.q_stride) + size_t(h) * a.Dqk;
                    const float* kr = hk.data() + kj * size_t(a.k_stride) + size_t(h / group) * a.Dqk;
                    for (int d = 0; d < a.Dqk; ++d) dot += double(qr[d]) * kr[d];
                    dot *= a.scale;
                    ss += dot * dot;
                    n += 1;
                }
    out.add(ProbeKind::attn_logits, ss, n);
}

}  // namespace quintet
