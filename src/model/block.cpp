#include "quintet/model/block.hpp"

#include <cstdio>
#include <cstring>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

BlockContext::BlockContext(Backend& be_, TensorParallel& tp_, const ModelDims& d_, int B_, int T_,
                           Precision p, const RopeConfig& rope_, int rope_seq_len_,
                           int max_positions_, ContextParallel* cp_, Recompute recompute_, bool split_bw_)
    : be(be_), tp(tp_), d(d_), B(B_), T(T_), N(B_ * T_), Nr(tp_.sp() ? B_ * T_ / tp_.size() : B_ * T_),
      rope(rope_), rope_seq_len(rope_seq_len_), max_positions(max_positions_), cp(cp_),
      recompute(recompute_), split_bw(split_bw_),
      bf16_(p == Precision::bf16) {}

void BlockContext::declare(const ModelDims& d, const BufferShape& s, BufferDecl& out) {
    const size_t N = size_t(s.N), C = size_t(d.C);
    out.scratch("ctx.full_a", N * C);
    out.scratch("ctx.full_b", N * C);
    out.scratch("ctx.dshard", size_t(s.Nr) * C);
    if (s.bf16) {
        out.operands(N * C);
        if (s.sp) out.scratch("ctx.gather_bf16", N * C, Elem::bf16);
    }
}

void BlockContext::bind(const BufferViews& shared, size_t operand_n) {
    shared_ = shared;
    full_a = shared.f32("ctx.full_a");
    full_b = shared.f32("ctx.full_b");
    dshard = shared.f32("ctx.dshard");
    if (bf16_) {
        lowp_ = shared.bf16("ctx.lowp");
        lowp_n_ = operand_n;
        if (tp.sp()) gather_bf16_ = shared.bf16("ctx.gather_bf16");
    }
}

void BlockContext::keep(const Act& a, const float* staging, size_t n) {
    if (bf16_) be.to_bf16(a.b, staging, n);
}

Mat BlockContext::gathered(const Act& a, size_t rows, size_t C) {
    if (bf16_) return {nullptr, tp.gather(a.b, gather_bf16_, rows, C)};
    return {tp.gather(a.f, full_a, rows, C), nullptr};
}

Mat BlockContext::lowp(const float* x, size_t n) {
    if (!bf16_) return {x, nullptr};
    QUINTET_CHECK(n <= lowp_n_, "bf16 operand scratch too small (reserve_lowp)");
    be.to_bf16(lowp_, x, n);
    return {nullptr, lowp_};
}

Mat BlockContext::save(const Act& w, const float* x, size_t n) {
    if (bf16_) {
        be.to_bf16(w.b, x, n);
        return {nullptr, w.b};
    }
    if (!split_bw) {
        int i = 0;
        while (i < n_stand_in_ && stand_in_[size_t(i)].first != w.f) ++i;
        if (i < int(stand_in_.size())) {
            stand_in_[size_t(i)] = {w.f, x};
            n_stand_in_ = std::max(n_stand_in_, i + 1);
            return {x, nullptr};
        }
    }
    if (w.f != x) be.copy(w.f, x, n);
    return {w.f, nullptr};
}

Mat BlockContext::deferred(const Act& w) const {
    if (bf16_ || split_bw) return {w.f, w.b};
    for (int i = 0; i < n_stand_in_; ++i)
        if (stand_in_[size_t(i)].first == w.f) return {stand_in_[size_t(i)].second, nullptr};
    return {w.f, nullptr};
}

void BlockContext::mm(bool ta, bool tb, int M, int Nn, int K, Mat A, int lda, Mat Bm, int ldb,
                      float beta, float* Cm, int ldc) {
    profile::Scope scope(profile::enabled() ? std::string(gemm_role) + (ta ? ".dw" : tb ? ".fwd" : ".dx") : std::string());
    if (bf16_) be.gemm_bf16(ta, tb, M, Nn, K, 1.0f, A.b, lda, Bm.b, ldb, beta, Cm, ldc);
    else be.gemm(ta, tb, M, Nn, K, 1.0f, A.f, lda, Bm.f, ldb, beta, Cm, ldc);
}

void BlockContext::row_parallel_residual(float* out, const float* res, Mat X, int K, const float* W) {
    const int C = d.C;
    be.copy(out, res, size_t(Nr) * C);
    if (tp.size() == 1) {
        mm(false, true, N, C, K, X, K, weight(W), K, 1.0f, out, C);
        return;
    }
    mm(false, true, N, C, K, X, K, weight(W), K, 0.0f, full_b, C);
    be.add_inplace(out, tp.reduce(full_b, dshard, N, C), size_t(Nr) * C);
}

void BlockContext::set_bf16_weights(const float* master, const bf16_bits* shadow) {
    QUINTET_CHECK(bf16_, "set_bf16_weights on an fp32 chunk");
    master_ = master;
    shadow_ = shadow;
}

PositionedCache::PositionedCache(Backend& b, int max_len_) : be(b), max_len(max_len_) {
    pos = be.alloc_i32(size_t(max_len));
    std::vector<int32_t> p(static_cast<size_t>(max_len));
    for (int i = 0; i < max_len; ++i) p[size_t(i)] = i;
    be.from_host_i32(pos, p.data(), p.size());
}

PositionedCache::~PositionedCache() { be.release_i32(pos); }

KvRowsCache::KvRowsCache(Backend& b, int max_len_, int kw_, int vw_)
    : PositionedCache(b, max_len_), kw(kw_), vw(vw_) {
    k = be.alloc(size_t(max_len) * kw);
    v = be.alloc(size_t(max_len) * vw);
}

KvRowsCache::~KvRowsCache() {
    be.release(k);
    be.release(v);
}

namespace {
// One table per rotated width: a chunk's attention kind uses one amplitude for it.
std::string rope_name(int dim, const char* part) { return "rope." + std::to_string(dim) + "." + part; }
}  // namespace

void BlockContext::declare_rope_table(BufferDecl& out, int dim, int max_positions) {
    const size_t n = size_t(max_positions) * size_t(dim / 2);
    out.scratch(rope_name(dim, "cos"), n);
    out.scratch(rope_name(dim, "sin"), n);
}

BlockContext::RopeTable BlockContext::rope_table(int dim, double amplitude) {
    float* cs = shared_.f32(rope_name(dim, "cos"));
    float* sn = shared_.f32(rope_name(dim, "sin"));
    for (const auto& [d, a] : rope_filled_)
        if (d == dim) {
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

}  // namespace quintet
