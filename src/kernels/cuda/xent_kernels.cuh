// Device code of the fused cross-entropy (see xent.cu). Included by xent.cu and by emulate/.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace quintet::cuda::kern {

constexpr int kXentThreads = 2 * kThreads;  // a row of logits per block

// This thread's (max, sum exp(z - max)) over its strided elements of the row.
__device__ inline MaxSum row_maxsum(const float* z, int V) {
    MaxSum a{-INFINITY, 0.0f};
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float x = z[i];
        if (x > a.m) {
            a.s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - x)) + 1.0f;
            a.m = x;
        } else if (a.m != -INFINITY) {  // (-inf logits before any finite one add nothing)
            a.s += expf(x - a.m);
        }
    }
    return a;
}

__global__ void xent_forward_backward_kernel(float* logits, float* losses,
                                             const int32_t* targets, int V, float grad_scale) {
    __shared__ float shm[32], shs[32];
    const size_t n = blockIdx.x;
    float* z = logits + n * V;
    const int tgt = targets[n];
    if (tgt < 0) {  // ignored position: loss 0, gradient 0
        for (int i = threadIdx.x; i < V; i += blockDim.x) z[i] = 0.0f;
        if (threadIdx.x == 0) losses[n] = 0.0f;
        return;
    }
    const float zt = z[tgt];  // read by every thread before any write below
    const MaxSum r = block_maxsum(row_maxsum(z, V), shm, shs);  // ends with __syncthreads
    if (threadIdx.x == 0) losses[n] = logf(r.s) - (zt - r.m);  // -log softmax(z)[tgt]
    const float gs = grad_scale * (1.0f / r.s);
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float g = expf(z[i] - r.m) * gs;
        if (i == tgt) g -= grad_scale;
        z[i] = g;
    }
}

__global__ void xent_forward_kernel(float* losses, const float* logits, const int32_t* targets,
                                    int V) {
    __shared__ float shm[32], shs[32];
    const size_t n = blockIdx.x;
    const float* z = logits + n * V;
    const int tgt = targets[n];
    if (tgt < 0) {
        if (threadIdx.x == 0) losses[n] = 0.0f;
        return;
    }
    const MaxSum r = block_maxsum(row_maxsum(z, V), shm, shs);
    if (threadIdx.x == 0) losses[n] = logf(r.s) + r.m - z[tgt];
}

// Vocab-parallel step 1: per row of this shard, (max, sum exp(z - max), target logit).
// stats[3N] = [rowmax | rowsum | target_logit].
__global__ void xent_local_stats_kernel(float* stats, const float* logits, const int32_t* targets,
                                        int N, int V) {
    __shared__ float shm[32], shs[32];
    const size_t n = blockIdx.x;
    const float* z = logits + n * V;
    const MaxSum r = block_maxsum(row_maxsum(z, V), shm, shs);
    if (threadIdx.x == 0) {
        const int tgt = targets[n];
        stats[n] = V > 0 ? r.m : -INFINITY;
        stats[N + n] = r.s;
        stats[2 * size_t(N) + n] = tgt >= 0 ? z[tgt] : 0.0f;
    }
}

// Vocab-parallel step 2: z = grad_scale * (exp(z - gmax) / gsum - onehot(target >= 0)).
// stats[2N] = [gmax | gsum].
__global__ void xent_grad_from_stats_kernel(float* logits, const float* stats,
                                            const int32_t* targets, int N, int V,
                                            float grad_scale) {
    const size_t n = blockIdx.x;
    float* z = logits + n * V;
    const float m = stats[n], k = grad_scale / stats[N + n];
    const int tgt = targets[n];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float g = expf(z[i] - m) * k;
        if (i == tgt) g -= grad_scale;
        z[i] = g;
    }
}

}  // namespace quintet::cuda::kern
