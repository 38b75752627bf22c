// Device code of RoPE (see rope.cu). Included by rope.cu and by emulate/.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace quintet::cuda::kern {

// x[N, row_stride]: heads [0, nh) of HD each from column 0; cos/sin [T, HD/2]; t = n % T.
// sign = -1 applies the transpose (inverse) rotation.
__global__ void rope_kernel(float* x, const float* cs, const float* sn, int N, int T, int nh,
                            int HD, int stride, float sign) {
    const int half = HD / 2;
    const size_t total = size_t(N) * nh * half;
    for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += size_t(gridDim.x) * blockDim.x) {
        const int i = int(idx % half);
        const size_t r = idx / half;
        const int h = int(r % nh);
        const size_t n = r / nh;
        const int t = int(n % T);
        const float c = cs[size_t(t) * half + i];
        const float s = sign * sn[size_t(t) * half + i];
        float* x1 = x + n * stride + size_t(h) * HD;
        const float a = x1[i], b = x1[i + half];
        x1[i] = a * c - b * s;
        x1[i + half] = b * c + a * s;
    }
}

}  // namespace quintet::cuda::kern
