#include "quintet/core/profile.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/parallel/tensor_parallel.hpp"

#include <mpi.h>

#include "quintet/core/error.hpp"

namespace quintet {

float* TensorParallel::reduce(float* partial, float* shard, size_t rows, size_t C) {
    QUINTET_PROFILE("comm.tp");
    const int p = tp_.size();
    if (p == 1) return partial;
    double t0 = now_s();
    const double S = double(rows) * C * sizeof(float);
    float* out;
    double sent;
    if (sp_) {
        tp_.reduce_scatter_sum(partial, shard, rows / p * C);
        sent = S * (p - 1) / p;
        out = shard;
    } else {
        tp_.all_reduce_sum(partial, rows * C);
        sent = 2 * S * (p - 1) / p;
        out = partial;
    }
    counters.blocking(now_s() - t0, sent);
    return out;
}

const float* TensorParallel::gather(const float* shard, float* full, size_t rows, size_t C) {
    QUINTET_PROFILE("comm.tp");
    if (!sp_) return shard;
    const int p = tp_.size();
    double t0 = now_s();
    tp_.all_gather(shard, full, rows / p * C);
    counters.blocking(now_s() - t0, double(rows) * C * sizeof(float) * (p - 1) / p);
    return full;
}

const bf16_bits* TensorParallel::gather(const bf16_bits* shard, bf16_bits* full, size_t rows,
                                        size_t C) {
    QUINTET_PROFILE("comm.tp");
    if (!sp_) return shard;
    const int p = tp_.size();
    const size_t n = rows / p * C;
    QUINTET_CHECK(n % 2 == 0, "bf16 gather of an odd element count");
    double t0 = now_s();
    // A collective that only copies: the words are never interpreted as floats.
    tp_.all_gather(reinterpret_cast<const float*>(shard), reinterpret_cast<float*>(full), n / 2);
    counters.blocking(now_s() - t0, double(rows) * C * sizeof(bf16_bits) * (p - 1) / p);
    return full;
}

void TensorParallel::all_reduce_sum(float* x, size_t n) {
    QUINTET_PROFILE("comm.tp");
    if (tp_.size() == 1) return;
    double t0 = now_s();
    tp_.all_reduce_sum(x, n);
    counters.blocking(now_s() - t0, 2.0 * n * sizeof(float) * (tp_.size() - 1) / tp_.size());
}

void TensorParallel::all_reduce_max(float* x, size_t n) {
    QUINTET_PROFILE("comm.tp");
    if (tp_.size() == 1) return;
    double t0 = now_s();
    tp_.all_reduce_max(x, n);
    counters.blocking(now_s() - t0, 2.0 * n * sizeof(float) * (tp_.size() - 1) / tp_.size());
}

}  // namespace quintet
