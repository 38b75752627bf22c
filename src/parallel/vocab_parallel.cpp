#include "quintet/parallel/vocab_parallel.hpp"

#include <algorithm>
#include <cmath>

namespace quintet {

void vocab_parallel_xent(Backend& be, TensorParallel& tp, float* logits, float* losses,
                         const int32_t* local_targets, int N, int Vl, float grad_scale,
                         bool need_grad, VocabParallelScratch& sc) {
    sc.ensure(N);
    float *mx = sc.rowmax.data(), *sum = sc.rowsum.data(), *tl = sc.tlogit.data();
    be.xent_local_stats(mx, sum, tl, logits, local_targets, N, Vl);
    // Global max; rescale each local sum to it; then sum the sums and the target logit (which
    // exactly one rank holds, the others contribute 0).
    std::vector<float>& gmax = sc.rowmax;
    std::vector<float>& local_max = sc.localmax;
    std::copy(mx, mx + N, local_max.begin());
    tp.all_reduce_max(gmax.data(), size_t(N));
    for (int n = 0; n < N; ++n) sum[n] = Vl > 0 ? sum[n] * std::exp(local_max[n] - gmax[n]) : 0.0f;
    tp.all_reduce_sum(sum, size_t(N));
    tp.all_reduce_sum(tl, size_t(N));
    for (int n = 0; n < N; ++n) losses[n] = std::log(sum[n]) + gmax[n] - tl[n];
    if (need_grad) be.xent_grad_from_stats(logits, gmax.data(), sum, local_targets, N, Vl, grad_scale);
}

}  // namespace quintet
