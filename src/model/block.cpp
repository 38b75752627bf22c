#include "quintet/model/block.hpp"

#include <cstring>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

BlockContext::BlockContext(Backend& be_, TensorParallel& tp_, const ModelDims& d_, int B_, int T_,
                           Precision p, const RopeConfig& rope_, int rope_seq_len_,
                           int max_positions_, ContextParallel* cp_, Recompute recompute_)
    : be(be_), tp(tp_), d(d_), B(B_), T(T_), N(B_ * T_), Nr(tp_.sp() ? B_ * T_ / tp_.size() : B_ * T_),
      rope(rope_), rope_seq_len(rope_seq_len_), max_positions(max_positions_), cp(cp_),
      recompute(recompute_),
      bf16_(p == Precision::bf16) {
    const size_t C = size_t(d.C);
    full_a = buf(size_t(N) * C, false);
    full_b = buf(size_t(N) * C, false);
    dshard = buf(size_t(Nr) * C, false);
    if (bf16_) {
        reserve_lowp(size_t(N) * C);
        if (tp.sp()) gather_bf16_ = buf_bf16(size_t(N) * C, false);
    }
}

BlockContext::~BlockContext() {
    for (float* p : owned_)
        if (p) be.release(p);
    for (bf16_bits* p : owned_bf16_)
        if (p) be.release_bf16(p);
    for (int32_t* p : owned_i32_) be.release_i32(p);
}

void BlockContext::share_begin(bool record) {
    share_mode_ = record ? 1 : 2;
    share_at_ = 0;
}

void BlockContext::share_end() { share_mode_ = 0; }

void* BlockContext::shared_take(size_t bytes) {
    if (share_mode_ != 2 || share_at_ >= shared_.size() || shared_[share_at_].bytes < bytes) return nullptr;
    return shared_[share_at_++].p;
}

void BlockContext::shared_put(void* p, size_t bytes) {
    if (share_mode_ == 1) shared_.push_back({p, bytes});
}

float* BlockContext::buf(size_t n, bool per_slot) {
    if (per_slot)
        if (void* p = shared_take(n * sizeof(float))) return static_cast<float*>(p);
    float* p = be.alloc(n);
    owned_.push_back(p);
    if (!per_slot) work_floats += n;
    if (per_slot) {
        slot_floats += n;
        shared_put(p, n * sizeof(float));
    }
    return p;
}

bf16_bits* BlockContext::buf_bf16(size_t n, bool per_slot) {
    if (per_slot)
        if (void* p = shared_take(n * sizeof(bf16_bits))) return static_cast<bf16_bits*>(p);
    bf16_bits* p = be.alloc_bf16(n);
    owned_bf16_.push_back(p);
    if (!per_slot) work_floats += (n + 1) / 2;
    if (per_slot) {
        slot_floats += (n + 1) / 2;
        shared_put(p, n * sizeof(bf16_bits));
    }
    return p;
}

Act BlockContext::act_shared(const char* name, size_t n) {
    Act a;
    if (!bf16_) {
        a.f = scratch(name, n);
        return a;
    }
    for (auto& s : named_bf16_)
        if (s.name == name) {
            if (s.n < n) {  // as scratch(): the old buffer stays valid for whoever holds it
                s.p = buf_bf16(n, false);
                s.n = n;
            }
            a.b = s.p;
            return a;
        }
    named_bf16_.push_back({name, buf_bf16(n, false), n});
    a.b = named_bf16_.back().p;
    return a;
}

int32_t* BlockContext::buf_i32(size_t n) {
    int32_t* p = be.alloc_i32(n);
    owned_i32_.push_back(p);
    return p;
}

Act BlockContext::act(size_t n) {
    Act a;
    if (bf16_) a.b = buf_bf16(n, true);
    else a.f = buf(n, true);
    return a;
}

float* BlockContext::scratch(const char* name, size_t n) {
    for (auto& s : named_)
        if (s.name == name) {
            // A larger request gets a larger buffer; the old one stays (a block that asked for
            // it earlier may hold its pointer). Requests come while the chunk is built.
            if (s.n < n) {
                s.p = buf(n, false);
                s.n = n;
            }
            return s.p;
        }
    named_.push_back({name, buf(n, false), n});
    return named_.back().p;
}

void BlockContext::reserve_lowp(size_t n) {
    if (!bf16_ || n <= lowp_n_) return;
    if (lowp_) {
        be.release_bf16(lowp_);
        work_floats -= (lowp_n_ + 1) / 2;
        for (auto& o : owned_bf16_)
            if (o == lowp_) o = nullptr;
    }
    lowp_ = buf_bf16(n, false);
    lowp_n_ = n;
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

BlockContext::RopeTable BlockContext::rope_table(int dim, double amplitude) {
    for (const auto& t : tables_)
        if (t.dim == dim && t.amplitude == amplitude) return t.t;
    std::vector<float> c, s;
    rope_tables(c, s, max_positions, rope_inv_freq(rope, dim, rope_seq_len), amplitude);
    float* cs = buf(c.size(), false);
    float* sn = buf(s.size(), false);
    be.from_host(cs, c.data(), c.size());
    be.from_host(sn, s.data(), s.size());
    tables_.push_back({dim, amplitude, {cs, sn}});
    return tables_.back().t;
}

}  // namespace quintet
