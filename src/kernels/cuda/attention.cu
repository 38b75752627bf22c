// Causal GQA attention on the GPU, flash-style: Q/K/V tiles in shared memory, an online
// softmax, never a T x T matrix; lse [B, NH, T] saved for backward. Backward recomputes P from
// lse and is split FlashAttention-2 style into two kernels so that every output element has
// exactly one writer: one block per (key tile, kv head) accumulates dK, dV over the query
// heads of its group and the query tiles at or after it; one block per (query tile, head)
// accumulates dQ. No atomics: bit-reproducible. Scalar fp32 FMAs (no tensor cores): the
// reference-accurate kernel, not the fast one (docs/cuda.md lists what is left).
// Derivation of the backward (D = rowsum(dO * O), dS = P * (dP - D)): docs/math.md.
#include <algorithm>

#include "attention_kernels.cuh"
#include "common.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"

namespace quintet::cuda {

namespace {

using namespace kern;

// Opt in to more than 48 KiB of dynamic shared memory, or fail clearly.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const AttentionLimits& lim, const char* what,
                int HD) {
    if (bytes > size_t(lim.max_smem_optin))
        rank_fail(std::string("CUDA ") + what + ": head_dim " + std::to_string(HD) + " needs " +
                  std::to_string(bytes) + " bytes of shared memory per block; this GPU allows " +
                  std::to_string(lim.max_smem_optin) + " (head_dim <= 256 fits sm_80/sm_90)");
    if (bytes > 48 * 1024)
        QUINTET_CUDA_CHECK(cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

void check_shape(int B, int T, int NH, int NKV, int HD) {
    QUINTET_CHECK(NKV > 0 && NH % NKV == 0, "attention: n_heads must be a multiple of n_kv_heads");
    QUINTET_CHECK(B <= 65535 && NH <= 65535, "attention: B and NH must be <= 65535 (grid limits)");
    QUINTET_CHECK(HD > 0, "attention: head_dim must be positive");
    (void)T;
}

}  // namespace

void attention_forward(cudaStream_t st, const AttentionLimits& lim, float* out, float* lse,
                       const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int HD, int q_stride, int kv_stride, float scale) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_shape(B, T, NH, NKV, HD);
    const size_t smem = fwd_smem_bytes(HD);
    allow_smem(attention_forward_kernel, smem, lim, "attention_forward", HD);
    const dim3 grid(unsigned((T + kFwdTile - 1) / kFwdTile), unsigned(NH), unsigned(B));
    attention_forward_kernel<<<grid, kAttnThreads, smem, st>>>(out, lse, q, k, v, T, NH, NKV, HD,
                                                               q_stride, kv_stride, scale);
    QUINTET_CUDA_LAUNCHED();
}

size_t attention_backward_scratch_bytes(int B, int T, int NH) {
    return size_t(B) * NH * T * sizeof(float);
}

void attention_backward(cudaStream_t st, const AttentionLimits& lim, float* dq, float* dk,
                        float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, int B, int T, int NH,
                        int NKV, int HD, int q_stride, int kv_stride, float scale,
                        float* scratch) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_shape(B, T, NH, NKV, HD);
    float* Dsum = scratch;  // [B, NH, T]
    const size_t rows = size_t(B) * NH * T;
    const size_t dsum_threads = rows * 32;
    attention_dsum_kernel<<<unsigned((dsum_threads + kAttnThreads - 1) / kAttnThreads),
                            kAttnThreads, 0, st>>>(Dsum, dout, out, rows, T, NH, HD);
    QUINTET_CUDA_LAUNCHED();
    const int bt = backward_tile(HD, lim.max_smem_optin);
    const int ntiles = (T + bt - 1) / bt;
    const size_t smem_kv = dkv_smem_bytes(HD, bt), smem_q = dq_smem_bytes(HD, bt);
    allow_smem(attention_backward_dkv_kernel, smem_kv, lim, "attention_backward (dK, dV)", HD);
    allow_smem(attention_backward_dq_kernel, smem_q, lim, "attention_backward (dQ)", HD);
    attention_backward_dkv_kernel<<<dim3(unsigned(ntiles), unsigned(NKV), unsigned(B)),
                                    kAttnThreads, smem_kv, st>>>(
        dk, dv, dout, lse, Dsum, q, k, v, T, NH, NKV, HD, q_stride, kv_stride, scale, bt);
    QUINTET_CUDA_LAUNCHED();
    attention_backward_dq_kernel<<<dim3(unsigned(ntiles), unsigned(NH), unsigned(B)),
                                   kAttnThreads, smem_q, st>>>(
        dq, dout, lse, Dsum, q, k, v, T, NH, NKV, HD, q_stride, kv_stride, scale, bt);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
