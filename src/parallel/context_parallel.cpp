#include "quintet/core/profile.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/parallel/context_parallel.hpp"

#include <chrono>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {
constexpr int kTagKv = 10, kTagDkv = 11;
}  // namespace

ContextParallel::ContextParallel(const Communicator& cp, Backend& be, int B, int T)
    : comm_(cp), be_(be), cp_(cp.size()), rank_(cp.rank()), B_(B), T_(T) {
    QUINTET_CHECK(T % (2 * cp_) == 0, "context parallelism needs seq_len divisible by 2*cp");
    Tc_ = T / (2 * cp_);
}

ContextParallel::~ContextParallel() {
    for (float* p : {kv_[0], kv_[1], dkv_[0], dkv_[1], part_out_, part_lse_})
        if (p) be_.release(p);
}

void ContextParallel::ensure(size_t floats) {
    if (floats <= cap_) return;  // grows on the first step only
    for (float*& p : {std::ref(kv_[0]), std::ref(kv_[1]), std::ref(dkv_[0]), std::ref(dkv_[1])}) {
        if (p) be_.release(p);
        p = be_.alloc(floats);
    }
    cap_ = floats;
}

void ContextParallel::reserve(size_t kv, size_t out, size_t lse) {
    if (kv > 0) ensure(kv);
    if (out > part_cap_) {
        if (part_out_) be_.release(part_out_);
        part_out_ = be_.alloc(out);
        part_cap_ = out;
    }
    if (lse > lse_cap_) {
        if (part_lse_) be_.release(part_lse_);
        part_lse_ = be_.alloc(lse);
        lse_cap_ = lse;
    }
}

void ContextParallel::pack(float* dst, const float* k, const float* v, const AttentionArgs& a,
                           int kw, int vw) {
    const size_t rows = size_t(a.B) * a.Tk, w = size_t(kw + vw);
    be_.copy_2d(dst, w, k, size_t(a.k_stride), rows, size_t(kw), false);
    be_.copy_2d(dst + kw, w, v, size_t(a.v_stride), rows, size_t(vw), false);
}

ContextParallel::Transfer ContextParallel::post_send(const float* buf, size_t n, int tag) {
    counters.bytes += double(n) * sizeof(float);
    return {comm_.isend(buf, n, (rank_ + 1) % cp_, tag), false, now_s()};
}

ContextParallel::Transfer ContextParallel::post_recv(float* buf, size_t n, int tag) {
    return {comm_.irecv(buf, n, (rank_ - 1 + cp_) % cp_, tag), true, now_s()};
}

void ContextParallel::wait(Transfer& t, const char* what) {
    QUINTET_PROFILE("comm.cp");
    if (t.handle < 0) return;
    const double t0 = now_s();
    if (t.recv) comm_.wait_recv(t.handle, what);
    else comm_.wait(t.handle);
    const double t1 = now_s();
    counters.exposed_s += t1 - t0;
    counters.seconds += t1 - t.posted;
    t.handle = -1;
}

void ContextParallel::ensure_partials(const AttentionArgs& a) {
    const size_t out_n = size_t(a.B) * a.Tq * a.o_stride, lse_n = size_t(a.B) * a.NH * a.Tq;
    if (out_n > part_cap_) {  // grows on the first step only
        if (part_out_) be_.release(part_out_);
        part_out_ = be_.alloc(out_n);
        part_cap_ = out_n;
    }
    if (lse_n > lse_cap_) {
        if (part_lse_) be_.release(part_lse_);
        part_lse_ = be_.alloc(lse_n);
        lse_cap_ = lse_n;
    }
}

AttentionArgs ContextParallel::block_args(const AttentionArgs& a, int j, const int32_t* k_pos_all,
                                          const int32_t* k_doc_all) const {
    const size_t rows = size_t(a.B) * a.Tk;
    AttentionArgs blk = a;
    blk.k_pos = k_pos_all + size_t(j) * rows;
    blk.k_doc = k_doc_all ? k_doc_all + size_t(j) * rows : nullptr;
    return blk;
}

void ContextParallel::gather_rows(const float* local, float* all, size_t n) {
    QUINTET_PROFILE("comm.cp");
    const double t0 = now_s();
    comm_.all_gather(local, all, n);
    // Blocking: none of it hides. Each rank's rows reach cp-1 others.
    counters.blocking(now_s() - t0, double(cp_ - 1) * double(n) * sizeof(float));
}

void ContextParallel::reduce_scatter_rows(const float* all, float* local, size_t n) {
    QUINTET_PROFILE("comm.cp");
    const double t0 = now_s();
    comm_.reduce_scatter_sum(all, local, n);
    counters.blocking(now_s() - t0, double(cp_ - 1) * double(n) * sizeof(float));
}

void ContextParallel::attention_forward_gathered(float* out, float* lse, const float* q,
                                                 const float* k_all, const float* v_all,
                                                 const AttentionArgs& a, const int32_t* k_pos_all,
                                                 const int32_t* k_doc_all) {
    const size_t rows = size_t(a.B) * a.Tk;
    ensure_partials(a);
    for (int step = 0; step < cp_; ++step) {  // the ring's order: own block first, then rank-1, ...
        const int j = (rank_ - step + cp_) % cp_;
        const AttentionArgs blk = block_args(a, j, k_pos_all, k_doc_all);
        const float* k = k_all + size_t(j) * rows * a.k_stride;
        const float* v = v_all + size_t(j) * rows * a.v_stride;
        if (step == 0) {
            be_.attention_forward(out, lse, q, k, v, blk);
        } else {
            be_.attention_forward(part_out_, part_lse_, q, k, v, blk);
            be_.attention_merge(out, lse, part_out_, part_lse_, a);
        }
    }
}

void ContextParallel::attention_backward_gathered(float* dq, float* dk_all, float* dv_all,
                                                  const float* dout, const float* out,
                                                  const float* lse, const float* q,
                                                  const float* k_all, const float* v_all,
                                                  const AttentionArgs& a, const int32_t* k_pos_all,
                                                  const int32_t* k_doc_all) {
    const size_t rows = size_t(a.B) * a.Tk;
    for (int step = 0; step < cp_; ++step) {
        const int j = (rank_ - step + cp_) % cp_;
        const AttentionArgs blk = block_args(a, j, k_pos_all, k_doc_all);
        const size_t ko = size_t(j) * rows * a.k_stride, vo = size_t(j) * rows * a.v_stride;
        be_.attention_backward(dq, dk_all + ko, dv_all + vo, dout, out, lse, q, k_all + ko,
                               v_all + vo, blk);
    }
}

void ContextParallel::attention_forward(float* out, float* lse, const float* q, const float* k,
                                        const float* v, const AttentionArgs& a,
                                        const int32_t* k_pos_all, const int32_t* k_doc_all) {
    const size_t rows = size_t(a.B) * a.Tk;
    const AttentionArgs loc = block_args(a, rank_, k_pos_all, k_doc_all);
    if (cp_ == 1) {
        be_.attention_forward(out, lse, q, k, v, loc);
        return;
    }
    const int kw = a.NKV * a.Dqk, vw = a.NKV * a.Dv, w = kw + vw;
    const size_t n = rows * size_t(w);
    ensure(n);
    ensure_partials(a);
    // The local block first, from the caller's buffers, while our K|V goes to the next rank.
    pack(kv_[0], k, v, a, kw, vw);
    Transfer s = post_send(kv_[0], n, kTagKv), r = post_recv(kv_[1], n, kTagKv);
    be_.attention_forward(out, lse, q, k, v, loc);
    int cur = 1;
    for (int step = 1; step < cp_; ++step) {
        wait(r, "context-parallel ring: recv K/V");
        wait(s, "context-parallel ring: send K/V");
        const int j = (rank_ - step + cp_) % cp_;  // whose block is in hand
        if (step < cp_ - 1) {  // the next block travels while this one is computed
            s = post_send(kv_[cur], n, kTagKv);
            r = post_recv(kv_[1 - cur], n, kTagKv);
        }
        AttentionArgs blk = block_args(a, j, k_pos_all, k_doc_all);
        blk.k_stride = blk.v_stride = w;  // the packed K|V block
        be_.attention_forward(part_out_, part_lse_, q, kv_[cur], kv_[cur] + kw, blk);
        be_.attention_merge(out, lse, part_out_, part_lse_, a);
        cur = 1 - cur;
    }
}

void ContextParallel::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                         const float* out, const float* lse, const float* q,
                                         const float* k, const float* v, const AttentionArgs& a,
                                         const int32_t* k_pos_all, const int32_t* k_doc_all) {
    const size_t rows = size_t(a.B) * a.Tk;
    const AttentionArgs loc = block_args(a, rank_, k_pos_all, k_doc_all);
    if (cp_ == 1) {
        be_.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, loc);
        return;
    }
    const int kw = a.NKV * a.Dqk, vw = a.NKV * a.Dv, w = kw + vw;
    const size_t n = rows * size_t(w);
    ensure(n);
    pack(kv_[0], k, v, a, kw, vw);
    Transfer ks = post_send(kv_[0], n, kTagKv), kr = post_recv(kv_[1], n, kTagKv);
    // This rank's own contributions to its own keys go straight into dk/dv.
    be_.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, loc);
    Transfer ds, dr;
    int cur = 1, dcur = 0;
    for (int step = 1; step < cp_; ++step) {
        wait(kr, "context-parallel ring (backward): recv K/V");
        wait(ks, "context-parallel ring (backward): send K/V");
        const int j = (rank_ - step + cp_) % cp_;
        if (step < cp_ - 1) {
            ks = post_send(kv_[cur], n, kTagKv);
            kr = post_recv(kv_[1 - cur], n, kTagKv);
        }
        // Block j's dK|dV accumulator: it starts here (its owner added its own share directly)
        // or arrives from the previous rank, gains this rank's share and moves on; after the
        // last step it reaches its owner.
        float* acc = dkv_[dcur];
        if (step == 1) be_.zero(acc, n);
        else wait(dr, "context-parallel ring (backward): recv dK/dV");
        AttentionArgs blk = block_args(a, j, k_pos_all, k_doc_all);
        blk.k_stride = blk.v_stride = w;  // the packed K|V block
        be_.attention_backward(dq, acc, acc + kw, dout, out, lse, q, kv_[cur], kv_[cur] + kw, blk);
        wait(ds, "context-parallel ring (backward): send dK/dV");
        ds = post_send(acc, n, kTagDkv);
        dr = post_recv(dkv_[1 - dcur], n, kTagDkv);
        dcur = 1 - dcur;
        cur = 1 - cur;
    }
    wait(dr, "context-parallel ring (backward): recv own dK/dV");
    wait(ds, "context-parallel ring (backward): send dK/dV");
    be_.copy_2d(dk, size_t(a.k_stride), dkv_[dcur], size_t(w), rows, size_t(kw), true);
    be_.copy_2d(dv, size_t(a.v_stride), dkv_[dcur] + kw, size_t(w), rows, size_t(vw), true);
}

}  // namespace quintet
