// Tensor parallelism (Megatron-style), the communication half: the conjugate operators that
// column- and row-parallel layers need, over the tp communicator. The maths half is the linear
// layers (model/linear.hpp: ColumnLinear, RowLinear, VocabHead), which call these at their edges,
// and ModelChunk (model/transformer.cpp) for the vocab-parallel embedding.
// docs/parallelism.md derives where each sits.
//   f: identity forward, all-reduce backward     (entering a column-parallel block)
//   g: all-reduce forward, identity backward     (leaving a row-parallel block)
// Under sequence parallelism the all-reduce of g becomes reduce-scatter over token rows, and f
// becomes an all-gather of the rows (its backward a reduce-scatter).
#pragma once
#include <cstddef>

#include "quintet/comm/communicator.hpp"
#include "quintet/comm/comm_counters.hpp"
#include "quintet/kernels/backend.hpp"

namespace quintet {

class TensorParallel {
public:
    TensorParallel(const Communicator& tp, bool sequence_parallel)
        : tp_(tp), sp_(sequence_parallel && tp.size() > 1) {}
    int size() const { return tp_.size(); }
    int rank() const { return tp_.rank(); }
    bool sp() const { return sp_; }
    const Communicator& comm() const { return tp_; }

    // collective over tp. partial[rows, C] holds this rank's partial sum. Without SP it is
    // all-reduced in place and `partial` is returned; with SP it is reduce-scattered into
    // shard[rows/tp, C] and `shard` is returned.
    float* reduce(float* partial, float* shard, size_t rows, size_t C);
    // collective over tp. SP only: full[rows, C] = rows of every rank's shard[rows/tp, C] in
    // rank order. Without SP returns `shard` untouched (it already is the full tensor).
    const float* gather(const float* shard, float* full, size_t rows, size_t C);
    // The same for bf16 rows (train.precision = bf16): moved bit for bit as pairs packed in
    // 32-bit words, so shard rows * C must be even (it is: C = heads * head_dim, head_dim even).
    const bf16_bits* gather(const bf16_bits* shard, bf16_bits* full, size_t rows, size_t C);
    // collective over tp: all-reduce (vocab-parallel statistics, small).
    void all_reduce_sum(float* x, size_t n);
    void all_reduce_max(float* x, size_t n);

    // Accounting since the last reset: seconds inside TP collectives (blocking: all exposed),
    // and the bytes each rank sends in a ring implementation (all-reduce 2S(p-1)/p,
    // reduce-scatter/all-gather S(p-1)/p).
    CommCounters counters;

private:
    const Communicator& tp_;
    bool sp_;
};

}  // namespace quintet
