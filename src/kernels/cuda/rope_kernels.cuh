// Device code of RoPE (see rope.cu). Included by rope.cu and by emulate/.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace quintet::cuda::kern {

// Backend's RopeArgs, as a kernel argument.
struct RopeShape {
    int N, n_heads, head_stride, col0, dim, row_stride;
};

// x[N, row_stride]: in heads [0, n_heads) (head h at column h*head_stride) columns
// [col0, col0 + dim) are rotated at position pos[n] with tables cos/sin [*, dim/2].
// sign = -1 applies the transpose (inverse) rotation.
__global__ void rope_kernel(float* x, const float* cs, const float* sn, const int32_t* pos,
                            RopeShape r, float sign) {
    const int half = r.dim / 2;
    const size_t total = size_t(r.N) * r.n_heads * half;
    for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += size_t(gridDim.x) * blockDim.x) {
        const int i = int(idx % half);
        const size_t rr = idx / half;
        const int h = int(rr % r.n_heads);
        const size_t n = rr / r.n_heads;
        const size_t t = size_t(pos[n]);
        const float c = cs[t * half + i];
        const float s = sign * sn[t * half + i];
        float* x1 = x + n * r.row_stride + size_t(h) * r.head_stride + r.col0;
        const float a = x1[i], b = x1[i + half];
        x1[i] = a * c - b * s;
        x1[i + half] = b * c + a * s;
    }
}

}  // namespace quintet::cuda::kern
