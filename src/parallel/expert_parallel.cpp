#include "quintet/core/profile.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/parallel/expert_parallel.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>

#include "quintet/core/error.hpp"

namespace quintet {

ExpertParallel::ExpertParallel(const Communicator& ep, Backend& be, int experts)
    : comm_(ep), be_(be), ep_(ep.size()), rank_(ep.rank()), E_(experts), El_(experts / ep.size()) {
    QUINTET_CHECK(E_ % ep_ == 0, "moe.experts not divisible by parallel.ep");
    count_sc_.resize(size_t(ep_));
    count_sd_.resize(size_t(ep_));
    for (int g = 0; g < ep_; ++g) {
        count_sc_[size_t(g)] = El_;
        count_sd_[size_t(g)] = g * El_;
    }
}

ExpertParallel::~ExpertParallel() {
    if (staging_) be_.release(staging_);
}

void ExpertParallel::reserve(size_t floats) {
    if (floats <= staging_n_) return;
    if (staging_) be_.release(staging_);
    staging_ = be_.alloc(floats);
    staging_n_ = floats;
}

void ExpertParallel::prepare(ExpertExchange& x, int max_rows, int C, int32_t* to_source, int32_t* to_expert) {
    QUINTET_CHECK(size_t(max_rows) * size_t(C) <= size_t(INT_MAX),
                  "expert parallelism: a layer's rows exceed MPI's int counts");
    const size_t ep = size_t(ep_);
    x.send_rows.assign(ep, 0), x.send_off.assign(ep, 0), x.recv_rows.assign(ep, 0), x.recv_off.assign(ep, 0);
    x.sc.assign(ep, 0), x.sd.assign(ep, 0), x.rc.assign(ep, 0), x.rd.assign(ep, 0);
    x.send_expert.assign(ep * size_t(El_), 0), x.recv_expert.assign(ep * size_t(El_), 0);
    x.expert_rows.assign(size_t(El_), 0), x.expert_off.assign(size_t(El_), 0);
    x.C = C;
    x.to_source = to_source;
    x.to_expert = to_expert;
    reserve(size_t(std::max(max_rows, 1)) * size_t(C));
    if (host_perm_.size() < size_t(max_rows)) {
        host_perm_.resize(size_t(max_rows));
        host_inv_.resize(size_t(max_rows));
    }
}

void ExpertParallel::plan(ExpertExchange& x, const int* counts) {
    QUINTET_PROFILE("comm.ep");
    const double t0 = now_s();
    // The counts first: El per peer, the experts of that peer's group.
    std::copy(counts, counts + E_, x.send_expert.begin());
    comm_.all_to_allv(reinterpret_cast<const int32_t*>(x.send_expert.data()), count_sc_.data(), count_sd_.data(),
                      reinterpret_cast<int32_t*>(x.recv_expert.data()), count_sc_.data(), count_sd_.data());
    int at = 0, from = 0;
    for (int g = 0; g < ep_; ++g) {
        int s = 0, r = 0;
        for (int j = 0; j < El_; ++j) {
            s += x.send_expert[size_t(g * El_ + j)];
            r += x.recv_expert[size_t(g * El_ + j)];
        }
        x.send_rows[size_t(g)] = s, x.send_off[size_t(g)] = at;
        x.recv_rows[size_t(g)] = r, x.recv_off[size_t(g)] = from;
        at += s, from += r;
    }
    x.rows = from;
    QUINTET_CHECK(size_t(x.rows) <= host_perm_.size(), "expert parallelism: more rows received than prepared for");
    for (int g = 0; g < ep_; ++g) {
        x.sc[size_t(g)] = x.send_rows[size_t(g)] * x.C, x.sd[size_t(g)] = x.send_off[size_t(g)] * x.C;
        x.rc[size_t(g)] = x.recv_rows[size_t(g)] * x.C, x.rd[size_t(g)] = x.recv_off[size_t(g)] * x.C;
    }
    // Expert-major order: expert j's rows from source 0, then source 1, ... (token order within).
    int e_at = 0;
    for (int j = 0; j < El_; ++j) {
        x.expert_off[size_t(j)] = e_at;
        for (int s = 0; s < ep_; ++s) {
            int src = x.recv_off[size_t(s)];  // the (s, j) block inside source s's rows
            for (int i = 0; i < j; ++i) src += x.recv_expert[size_t(s * El_ + i)];
            const int n = x.recv_expert[size_t(s * El_ + j)];
            for (int r = 0; r < n; ++r) {
                host_perm_[size_t(e_at + r)] = src + r;
                host_inv_[size_t(src + r)] = e_at + r;
            }
            e_at += n;
        }
        x.expert_rows[size_t(j)] = e_at - x.expert_off[size_t(j)];
    }
    be_.from_host_i32(x.to_source, host_perm_.data(), size_t(x.rows));
    be_.from_host_i32(x.to_expert, host_inv_.data(), size_t(x.rows));
    dispatch_counters.blocking(now_s() - t0, 0);
}

void ExpertParallel::dispatch_start(const ExpertExchange& x, const float* sorted) {
    QUINTET_PROFILE("comm.ep");
    QUINTET_CHECK(pending_ == -1, "expert parallelism: a dispatch is already in flight");
    const double t0 = now_s();
    pending_ = comm_.iall_to_allv(sorted, x.sc.data(), x.sd.data(), staging_, x.rc.data(), x.rd.data());
    if (pending_ < 0) pending_ = -2;  // completed at once
    double sent = 0;
    for (int g = 0; g < ep_; ++g)
        if (g != rank_) sent += double(x.sc[size_t(g)]) * sizeof(float);
    dispatch_counters.blocking(now_s() - t0, sent);
}

void ExpertParallel::dispatch_finish(const ExpertExchange& x, float* expert_major) {
    QUINTET_PROFILE("comm.ep");
    const double t0 = now_s();
    QUINTET_CHECK(pending_ != -1, "expert parallelism: dispatch_finish without dispatch_start");
    if (pending_ >= 0) comm_.wait_all_to_allv(pending_);
    pending_ = -1;
    be_.gather_rows(expert_major, staging_, x.to_source, x.rows, x.C);
    dispatch_counters.blocking(now_s() - t0, 0);
}

void ExpertParallel::combine(const ExpertExchange& x, const float* expert_major, float* sorted) {
    QUINTET_PROFILE("comm.ep");
    const double t0 = now_s();
    be_.gather_rows(staging_, expert_major, x.to_expert, x.rows, x.C);
    comm_.all_to_allv(staging_, x.rc.data(), x.rd.data(), sorted, x.sc.data(), x.sd.data());
    double sent = 0;
    for (int g = 0; g < ep_; ++g)
        if (g != rank_) sent += double(x.rc[size_t(g)]) * sizeof(float);
    combine_counters.blocking(now_s() - t0, sent);
}

}  // namespace quintet
