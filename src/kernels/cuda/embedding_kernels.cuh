// Device code of the token embedding (see embedding.cu): forward, the sort keys, and the
// per-run backward. Included by embedding.cu and by emulate/.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace quintet::cuda::kern {

// out[N,C] = wte[ids[n], :] (0 where ids[n] < 0); one block per token.
__global__ void embedding_forward_kernel(float* out, const int32_t* ids, const float* wte, int C) {
    const size_t n = blockIdx.x;
    const int32_t id = ids[n];
    float* dst = out + n * C;
    if (id < 0) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = 0.0f;
        return;
    }
    const float* src = wte + size_t(id) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

// Sort keys (ids < 0 become V: sorted last, then skipped) and token indices 0..N-1.
__global__ void embedding_keys_kernel(uint32_t* keys, uint32_t* toks, const int32_t* ids, int n,
                                      int V) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        keys[i] = ids[i] < 0 ? uint32_t(V) : uint32_t(ids[i]);
        toks[i] = uint32_t(i);
    }
}

// Block i handles the run of equal ids that starts at sorted position i (other blocks exit):
// dwte[id, c] += dout[tok_j, c] for the run's tokens j in increasing token order.
__global__ void embedding_backward_runs_kernel(float* dwte, const float* dout,
                                               const uint32_t* keys, const uint32_t* toks, int N,
                                               int C, int V) {
    const int i = blockIdx.x;
    const uint32_t id = keys[i];
    if ((i > 0 && keys[i - 1] == id) || id == uint32_t(V)) return;
    int end = i + 1;
    while (end < N && keys[end] == id) ++end;
    float* row = dwte + size_t(id) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = row[c];
        for (int j = i; j < end; ++j) acc += dout[size_t(toks[j]) * C + c];
        row[c] = acc;
    }
}

}  // namespace quintet::cuda::kern
