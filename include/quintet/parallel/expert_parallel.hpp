// Expert parallelism (docs/parallelism.md "Expert parallelism",
// the bytes in docs/math.md §9): the E experts of a layer are split into ep contiguous groups of
// El = E/ep, ep rank g holding experts [g·El, (g+1)·El). A microbatch's rows are routed where
// they are and sorted by expert (the MoE block's counting sort), so the rows for ep rank g are
// one contiguous run. Dispatch sends them to their experts' ranks: first the per-expert counts
// (an int32 all-to-all-v of El counts per peer), then the rows (a float all-to-all-v). A rank
// receives them source-major ([source][expert][token order]); one permutation makes them
// expert-major ([expert][source][token order]) so that each local expert is one GEMM over
// contiguous rows. Combine is the reverse. The backward runs the same pair again: dispatch of
// the output gradients, combine of the input gradients. Every row's place follows from the
// counts alone, so the bits never depend on the order messages arrive in.
//
// Knows no model and no other axis: it moves rows of C floats.
#pragma once
#include <cstdint>
#include <vector>

#include "quintet/comm/comm_counters.hpp"
#include "quintet/comm/communicator.hpp"
#include "quintet/kernels/backend.hpp"

namespace quintet {

// The exchange of one microbatch through one MoE layer, planned in the forward (plan) and kept
// for its backward. Counts and offsets are in rows.
struct ExpertExchange {
    std::vector<int> send_rows, send_off;      // [ep] rows to rank g, first row in the sorted buffer
    std::vector<int> recv_rows, recv_off;      // [ep] rows from rank s, first row source-major
    std::vector<int> send_expert, recv_expert; // [ep*El] rows (to g | from s) per expert of the group
    std::vector<int> expert_rows, expert_off;  // [El] rows of each local expert, expert-major
    int rows = 0;                              // rows received
    int32_t* to_source = nullptr;  // [max_rows] expert-major row i is source-major row to_source[i]
    int32_t* to_expert = nullptr;  // [max_rows] the inverse
    // The same in floats (rows * C), as the float all-to-all-v takes them (combine swaps them).
    std::vector<int> sc, sd, rc, rd;
    int C = 0;
};

class ExpertParallel {
public:
    ExpertParallel(const Communicator& ep, Backend& be, int experts);
    ~ExpertParallel();
    ExpertParallel(const ExpertParallel&) = delete;
    ExpertParallel& operator=(const ExpertParallel&) = delete;

    int size() const { return ep_; }
    int rank() const { return rank_; }
    int local_experts() const { return El_; }
    int first_expert() const { return rank_ * El_; }
    // The most rows a rank can receive when each of `rows` tokens per rank picks k distinct
    // experts: every rank sends it min(k, El) rows per token.
    int max_rows(int rows, int k) const { return ep_ * rows * (k < El_ ? k : El_); }

    // Sizes an exchange for at most `max_rows` received rows of C floats (while the model is
    // built: nothing is allocated in the steady state); to_source and to_expert: [max(max_rows, 1)]
    // of backend memory the caller keeps (its declared buffers).
    void prepare(ExpertExchange& x, int max_rows, int C, int32_t* to_source, int32_t* to_expert);
    // The staging every exchange shares: at least `floats` (the largest any layer declared).
    void reserve(size_t floats);
    // counts[E]: this rank's rows per expert, laid out sorted by expert. Exchanges the counts
    // and plans the rows' places. collective over ep
    void plan(ExpertExchange& x, const int* counts);
    // Rows are x.C floats. sorted[sum counts, C] -> expert_major[x.rows, C]; started, then finished (so that the
    // caller can compute meanwhile; `sorted` stays untouched until dispatch_finish). collective over ep
    void dispatch_start(const ExpertExchange& x, const float* sorted);
    void dispatch_finish(const ExpertExchange& x, float* expert_major);
    void progress() const { comm_.progress(); }  // lets a started dispatch advance
    // expert_major[x.rows, C] -> sorted[sum counts, C] on the rows' home ranks. collective over ep
    void combine(const ExpertExchange& x, const float* expert_major, float* sorted);

    // Since the last reset, the dispatch (plan + rows to the experts) and the combine (rows back):
    // seconds inside their calls (all exposed: what the shared expert does not hide) and the
    // float payload bytes this rank sent to other ranks.
    CommCounters dispatch_counters, combine_counters;
    size_t buffer_bytes() const { return staging_n_ * sizeof(float); }  // the exchange's staging
    static size_t buffer_bytes(size_t floats) { return floats * sizeof(float); }  // for a reserve(floats)

private:
    const Communicator& comm_;
    Backend& be_;
    int ep_, rank_, E_, El_;
    float* staging_ = nullptr;  // [max rows, C] source-major rows (received, or to send back)
    size_t staging_n_ = 0;
    int pending_ = -1;          // the started dispatch: its handle; -2 done at once; -1 none
    std::vector<int> count_sc_, count_sd_;  // El counts to every peer
    std::vector<int32_t> host_perm_, host_inv_;
};

}  // namespace quintet
