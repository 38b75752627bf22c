// Fused softmax cross-entropy on the GPU, one block per row of logits [N, V]: an online
// (max, sum-exp) pass, merged across the block in a fixed order, then (forward_backward) one
// pass that overwrites the row with grad_scale * (softmax - onehot). Losses go to a device
// array; the backend copies them to the caller's host array.
#include "common.cuh"
#include "xent_kernels.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"

namespace quintet::cuda {

using namespace kern;

void xent_local_stats(cudaStream_t st, float* stats_dev, const float* logits,
                      const int32_t* targets, int N, int V) {
    if (N <= 0) return;
    xent_local_stats_kernel<<<N, kXentThreads, 0, st>>>(stats_dev, logits, targets, N, V);
    QUINTET_CUDA_LAUNCHED();
}

void xent_grad_from_stats(cudaStream_t st, float* logits, const float* stats_dev,
                          const int32_t* targets, int N, int V, float grad_scale) {
    if (N <= 0 || V <= 0) return;
    xent_grad_from_stats_kernel<<<N, kXentThreads, 0, st>>>(logits, stats_dev, targets, N, V,
                                                            grad_scale);
    QUINTET_CUDA_LAUNCHED();
}

void xent_forward_backward(cudaStream_t st, float* logits, float* losses_dev,
                           const int32_t* targets, int N, int V, float grad_scale) {
    if (N <= 0) return;
    xent_forward_backward_kernel<<<N, kXentThreads, 0, st>>>(logits, losses_dev, targets, V,
                                                             grad_scale);
    QUINTET_CUDA_LAUNCHED();
}

void xent_forward(cudaStream_t st, float* losses_dev, const float* logits, const int32_t* targets,
                  int N, int V) {
    if (N <= 0) return;
    xent_forward_kernel<<<N, kXentThreads, 0, st>>>(losses_dev, logits, targets, V);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
