// Vocab-parallel cross-entropy: each tp rank holds the logits of its vocabulary rows [v0, v1)
// only; the full [tokens x vocab] logits are never gathered. Per token the row max, the sum of
// exponentials and the target logit are combined across tp (all-reduce max, then sums), which is
// exactly the unsharded log-softmax (docs/parallelism.md).
#pragma once
#include <cstdint>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/parallel/tensor_parallel.hpp"

namespace quintet {

struct VocabParallelScratch {
    std::vector<float> rowmax, rowsum, tlogit, localmax;  // host [N], sized once
    void ensure(int N) {
        if (int(rowmax.size()) < N) {
            rowmax.resize(N);
            rowsum.resize(N);
            tlogit.resize(N);
            localmax.resize(N);
        }
    }
};

// collective over tp. logits[N, Vl]: this rank's shard. local_targets[N]: target - v0 when the
// target is in this shard, else -1 (backend memory). losses[N] (host) = -log p(target).
// With need_grad the logits are replaced by grad_scale * (softmax - onehot) for this shard.
void vocab_parallel_xent(Backend& be, TensorParallel& tp, float* logits, float* losses,
                         const int32_t* local_targets, int N, int Vl, float grad_scale,
                         bool need_grad, VocabParallelScratch& scratch);

}  // namespace quintet
