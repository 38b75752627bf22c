// RoPE (rotate-half, DESIGN §2) on the GPU, in place: one thread per rotated pair (i, i+HD/2)
// of one head of one token. YaRN is in the cos/sin tables (model/rope), not here.
#include "common.cuh"
#include "rope_kernels.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"

namespace quintet::cuda {

using namespace kern;

void rope_apply(cudaStream_t st, float* x, const float* cos, const float* sin, int N, int T,
                int n_rot_heads, int HD, int row_stride, float sign) {
    const size_t total = size_t(N) * n_rot_heads * (HD / 2);
    if (total == 0) return;
    rope_kernel<<<grid_for(total), kThreads, 0, st>>>(x, cos, sin, N, T, n_rot_heads, HD,
                                                      row_stride, sign);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
