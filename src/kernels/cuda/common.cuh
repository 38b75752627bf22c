// Device helpers shared by the kernels: fixed-order warp/block reductions (deterministic: the
// same inputs give the same bits on every run) and grid sizing for grid-stride loops.
// The *_kernels.cuh headers hold device code only, so that emulate/ can also compile them for
// the CPU (QUINTET_KERNEL_EMULATION: threads for CUDA threads, barriers for __syncthreads).
#pragma once
#ifndef QUINTET_KERNEL_EMULATION
#include <cuda_runtime.h>
// The block's dynamic shared memory as `float* name`.
#define QUINTET_DYNAMIC_SMEM(name) extern __shared__ float name[]
#endif

#include <cstddef>

namespace quintet::cuda {

constexpr int kThreads = 256;  // default block size: a multiple of 32 (the reductions need it)

// Blocks for a grid-stride loop over n elements (capped: each thread then loops).
inline unsigned grid_for(size_t n, int threads = kThreads) {
    size_t blocks = (n + size_t(threads) - 1) / size_t(threads);
    if (blocks < 1) blocks = 1;
    if (blocks > 65536) blocks = 65536;
    return unsigned(blocks);
}

template <typename T>
__device__ inline T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block, returned to every thread. `sh` holds >= 32 elements of shared memory;
// blockDim.x must be a multiple of 32 and every thread of the block must call it.
template <typename T>
__device__ inline T block_sum(T v, T* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // earlier readers of sh[] are done
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T r = lane < nw ? sh[lane] : T(0);
        r = warp_sum(r);
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}

// (max, sum of exp(x - max)) pairs, merged as in the online softmax.
struct MaxSum {
    float m, s;
};

__device__ inline MaxSum maxsum_merge(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0f};
    const float sa = a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m);
    const float sb = b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m);
    return {m, sa + sb};
}

__device__ inline MaxSum block_maxsum(MaxSum v, float* shm, float* shs) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
        v = maxsum_merge(v, other);
    }
    __syncthreads();
    if (lane == 0) {
        shm[warp] = v.m;
        shs[warp] = v.s;
    }
    __syncthreads();
    if (warp == 0) {
        MaxSum r = lane < nw ? MaxSum{shm[lane], shs[lane]} : MaxSum{-INFINITY, 0.0f};
        for (int o = 16; o > 0; o >>= 1) {
            MaxSum other{__shfl_xor_sync(0xffffffffu, r.m, o),
                         __shfl_xor_sync(0xffffffffu, r.s, o)};
            r = maxsum_merge(r, other);
        }
        if (lane == 0) {
            shm[0] = r.m;
            shs[0] = r.s;
        }
    }
    __syncthreads();
    return {shm[0], shs[0]};
}

}  // namespace quintet::cuda
