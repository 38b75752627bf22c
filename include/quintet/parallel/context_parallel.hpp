// Context parallelism (docs/parallelism.md "Context parallelism", derivations in
// docs/math.md §8): each sample's sequence is cut into 2·cp equal chunks and cp rank r holds
// chunks r and 2·cp−1−r, so every rank has the same causal work; positions stay global.
// Attention is a ring: K/V blocks travel round the cp group with non-blocking sends and
// receives posted before the block in hand is computed, partial outputs merge by log-sum-exp,
// and in the backward each block's dK/dV accumulator travels with it and comes home to its
// owner. Everything is a call of the backend's one attention operation; this file only moves
// blocks. Knows no model and no other axis.
#pragma once
#include <cstdint>
#include <vector>

#include "quintet/comm/comm_counters.hpp"
#include "quintet/comm/communicator.hpp"
#include "quintet/kernels/backend.hpp"

namespace quintet {

// How MLA moves keys and values under cp (parallel.cp_mla_kv).
enum class MlaKv { ring, latent };

class ContextParallel {
public:
    // B samples of T tokens (the whole sequence) per microbatch. collective over cp (none here)
    ContextParallel(const Communicator& cp, Backend& be, int B, int T);
    ~ContextParallel();
    ContextParallel(const ContextParallel&) = delete;
    ContextParallel& operator=(const ContextParallel&) = delete;

    MlaKv mla_kv = MlaKv::ring;
    // Small statistics summed over the cp group (MoE's balance counts). collective over cp
    void all_reduce_sum(float* x, size_t n) const { comm_.all_reduce_sum(x, n); }
    int size() const { return cp_; }
    int rank() const { return rank_; }
    int chunk_len() const { return Tc_; }     // T / (2 cp)
    int local_len() const { return 2 * Tc_; } // rows per sample on a rank: T / cp
    // Global position in its sample of local row t (0 <= t < local_len()) of cp rank j.
    int position(int j, int t) const { return t < Tc_ ? j * Tc_ + t : (2 * cp_ - 1 - j) * Tc_ + (t - Tc_); }

    // Ring attention over every cp rank's keys. `a` describes the local problem (Tq = Tk =
    // local_len(), q/k/v/out strides of the caller's buffers); k_pos_all / k_doc_all hold the
    // mask positions and documents of every rank's rows, rank-major [cp][B*local_len()]
    // (k_doc_all null: no documents). collective over cp
    void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const AttentionArgs& a, const int32_t* k_pos_all,
                           const int32_t* k_doc_all);
    // dq, dk, dv accumulate, from the final out and lse. collective over cp
    void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                            const float* lse, const float* q, const float* k, const float* v,
                            const AttentionArgs& a, const int32_t* k_pos_all,
                            const int32_t* k_doc_all);

    // MLA's latent mode (parallel.cp_mla_kv = latent): instead of a ring of per-head K/V, every
    // rank gathers the compressed rows of all ranks and expands them itself.
    // all[cp][n] = every rank's local[n], rank-major. collective over cp
    void gather_rows(const float* local, float* all, size_t n);
    // local[n] = sum over ranks of their all[rank_][n] (the backward of gather_rows). collective over cp
    void reduce_scatter_rows(const float* all, float* local, size_t n);
    // Attention of the local queries over every rank's keys, already here: k_all/v_all rank-major
    // [cp][B*local_len()] rows with a's k/v strides; the blocks in the ring's order, merged.
    void attention_forward_gathered(float* out, float* lse, const float* q, const float* k_all,
                                    const float* v_all, const AttentionArgs& a,
                                    const int32_t* k_pos_all, const int32_t* k_doc_all);
    // dq accumulates; dk_all/dv_all accumulate every block's share (their owners' sums come from
    // reduce_scatter_rows of what the caller derives from them).
    void attention_backward_gathered(float* dq, float* dk_all, float* dv_all, const float* dout,
                                     const float* out, const float* lse, const float* q,
                                     const float* k_all, const float* v_all, const AttentionArgs& a,
                                     const int32_t* k_pos_all, const int32_t* k_doc_all);

    // Accounting since the last reset: seconds from posting each transfer to its completion
    // (overlapping compute), of which blocked waiting on the ring (exposed), bytes sent.
    CommCounters counters;
    // The ring's K/V, dK/dV and partial-output buffers (sized on the first step).
    size_t buffer_bytes() const { return (4 * cap_ + part_cap_ + lse_cap_) * sizeof(float); }
    // Allocates them for the largest K|V block, partial output and log-sum-exp any layer
    // declared (floats; while the model is built, so the steady state allocates nothing), and
    // the bytes such a reservation holds.
    void reserve(size_t kv, size_t out, size_t lse);
    static size_t buffer_bytes(size_t kv, size_t out, size_t lse) { return (4 * kv + out + lse) * sizeof(float); }

private:
    // Block buffers [rows, kw + vw]: K in columns [0, kw), V in [kw, kw + vw).
    void ensure(size_t floats);
    void ensure_partials(const AttentionArgs& a);
    AttentionArgs block_args(const AttentionArgs& a, int j, const int32_t* k_pos_all,
                             const int32_t* k_doc_all) const;
    void pack(float* dst, const float* k, const float* v, const AttentionArgs& a, int kw, int vw);
    struct Transfer {
        int handle = -1;
        bool recv = false;
        double posted = 0;
    };
    Transfer post_send(const float* buf, size_t n, int tag);
    Transfer post_recv(float* buf, size_t n, int tag);
    void wait(Transfer& t, const char* what);
    const Communicator& comm_;
    Backend& be_;
    int cp_, rank_, B_, T_, Tc_;
    float* kv_[2] = {nullptr, nullptr};  // K|V blocks in flight
    float* dkv_[2] = {nullptr, nullptr}; // dK|dV accumulators in flight
    float *part_out_ = nullptr, *part_lse_ = nullptr;
    size_t cap_ = 0, part_cap_ = 0, lse_cap_ = 0;
};

}  // namespace quintet
