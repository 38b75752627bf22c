// Deterministic sum of squares in double (the global gradient norm): a fixed grid where each
// thread owns a fixed strided set of elements, per-block partials, then one block sums the
// partials in order. Same bits every run for the same n.
#include "common.cuh"
#include "reduce_kernels.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"

namespace quintet::cuda {

using namespace kern;

size_t sumsq_scratch_bytes() { return kSumsqBlocks * sizeof(double); }

void sumsq(cudaStream_t st, double* out, const float* x, size_t n, double* scratch) {
    const int blocks = sumsq_blocks(n);
    sumsq_partial_kernel<<<blocks, kThreads, 0, st>>>(scratch, x, n);
    QUINTET_CUDA_LAUNCHED();
    sumsq_final_kernel<<<1, kThreads, 0, st>>>(out, scratch, blocks);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
