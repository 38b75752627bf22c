// RoPE (rotate-half, docs/math.md §3) on the GPU, in place: one thread per rotated pair
// (i, i+dim/2) of one head of one token, at the token's position. YaRN is in the cos/sin tables
// (model/rope), not here.
#include "common.cuh"
#include "rope_kernels.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"

namespace quintet::cuda {

using namespace kern;

void rope_apply(cudaStream_t st, float* x, const float* cos, const float* sin, const int32_t* pos,
                const RopeArgs& a, float sign) {
    const size_t total = size_t(a.N) * a.n_heads * (a.dim / 2);
    if (total == 0) return;
    const RopeShape r{a.N, a.n_heads, a.head_stride, a.col0, a.dim, a.row_stride};
    rope_kernel<<<grid_for(total), kThreads, 0, st>>>(x, cos, sin, pos, r, sign);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
