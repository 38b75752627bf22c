// MoE routing kernels (launchers): router softmax + top-k and its backward, row gathers between
// token and expert order. Device code in moe_kernels.cuh.
#include "common.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"
#include "moe_kernels.cuh"

namespace quintet::cuda {

using namespace kern;

void moe_route(cudaStream_t st, float* probs, int32_t* expert, float* weight, const float* logits,
               const float* bias, int N, int E, int k, const MoeRouteRule& rule) {
    if (N == 0) return;
    moe_route_kernel<<<grid_for(size_t(N)), kThreads, 0, st>>>(probs, expert, weight, logits, bias, N, E, k, rule);
    QUINTET_CUDA_LAUNCHED();
}

void moe_route_backward(cudaStream_t st, float* dlogits, const float* dweight, const float* probs,
                        const int32_t* expert, const float* weight, const float* daux, int N, int E,
                        int k, const MoeRouteRule& rule) {
    if (N == 0) return;
    moe_route_backward_kernel<<<grid_for(size_t(N)), kThreads, 0, st>>>(dlogits, dweight, probs, expert,
                                                                         weight, daux, N, E, k, rule);
    QUINTET_CUDA_LAUNCHED();
}

void gather_rows(cudaStream_t st, float* dst, const float* src, const int32_t* idx, int n, int C) {
    if (n == 0 || C == 0) return;
    gather_rows_kernel<<<grid_for(size_t(n) * C), kThreads, 0, st>>>(dst, src, idx, n, C);
    QUINTET_CUDA_LAUNCHED();
}

void moe_combine(cudaStream_t st, float* out, const float* y, const int32_t* slot, const float* weight,
                 int N, int k, int C) {
    if (N == 0 || C == 0) return;
    moe_combine_kernel<<<grid_for(size_t(N) * C), kThreads, 0, st>>>(out, y, slot, weight, N, k, C);
    QUINTET_CUDA_LAUNCHED();
}

void moe_combine_backward(cudaStream_t st, float* dy, float* dweight, const float* dout, const float* y,
                          const int32_t* slot, const float* weight, int N, int k, int C) {
    if (N == 0) return;
    moe_combine_backward_kernel<<<grid_for(size_t(N) * k), kThreads, 0, st>>>(dy, dweight, dout, y, slot,
                                                                               weight, N, k, C);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
