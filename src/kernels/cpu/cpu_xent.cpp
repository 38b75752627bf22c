// Fused softmax cross-entropy on the CPU (the twin of src/kernels/cuda/xent.cu), one row of
// logits [N, V] per OpenMP iteration. xent_forward_backward overwrites the logits with
// grad_scale * (softmax - onehot) (targets < 0: loss 0, gradient 0); xent_forward only reads
// them (evaluation). The vocab-parallel pair (docs/parallelism.md): xent_local_stats gives each
// row's max, sum of exp and target logit over this rank's vocabulary shard (targets < 0: the
// target lives on another rank), xent_grad_from_stats the gradient from the combined max and sum.
// exp_fast and max_of (cpu_math.hpp) let the row loops vectorise.
#include <cmath>
#include <cstring>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace quintet::cpu {

void CpuBackend::xent_forward_backward(float* logits, float* losses, const int32_t* targets, int N,
                                       int V, float grad_scale) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        float* z = logits + size_t(n) * V;
        int tgt = targets[n];
        if (tgt < 0) {
            std::memset(z, 0, size_t(V) * 4);
            losses[n] = 0.0f;
            continue;
        }
        const float mx = max_of(z, V, -INFINITY);
        const float zt = z[tgt];
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; ++i) {
            float e = exp_fast(z[i] - mx);
            z[i] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
        losses[n] = std::log(sum) - (zt - mx);  // -log softmax(z)[tgt]
        float gs = grad_scale * inv;
#pragma omp simd
        for (int i = 0; i < V; ++i) z[i] *= gs;
        z[tgt] -= grad_scale;
    }
}
void CpuBackend::xent_forward(float* losses, const float* logits, const int32_t* targets, int N,
                              int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        const float* z = logits + size_t(n) * V;
        int tgt = targets[n];
        if (tgt < 0) { losses[n] = 0.0f; continue; }
        const float mx = max_of(z, V, -INFINITY);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; ++i) sum += exp_fast(z[i] - mx);
        losses[n] = std::log(sum) + mx - z[tgt];
    }
}

void CpuBackend::xent_local_stats(float* rowmax, float* rowsum, float* tl, const float* logits,
                                  const int32_t* targets, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        const float* z = logits + size_t(n) * V;
        const float mx = max_of(z, V, -INFINITY);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; ++i) sum += exp_fast(z[i] - mx);
        rowmax[n] = V > 0 ? mx : -INFINITY;
        rowsum[n] = sum;
        tl[n] = targets[n] >= 0 ? z[targets[n]] : 0.0f;
    }
}
void CpuBackend::xent_grad_from_stats(float* logits, const float* gmax, const float* gsum,
                                      const int32_t* targets, int N, int V, float grad_scale) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        float* z = logits + size_t(n) * V;
        const float m = gmax[n], k = grad_scale / gsum[n];
#pragma omp simd
        for (int i = 0; i < V; ++i) z[i] = exp_fast(z[i] - m) * k;
        if (targets[n] >= 0) z[targets[n]] -= grad_scale;
    }
}

}  // namespace quintet::cpu
