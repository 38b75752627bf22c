// The general attention operation on the GPU, flash-style: Q/K/V tiles in shared memory, an
// online softmax, never a Tq x Tk matrix; lse [B, NH, Tq] saved for backward. Backward
// recomputes P from lse and is split FlashAttention-2 style into two kernels so that every
// output element has exactly one writer: one block per (key tile, kv head) accumulates dK, dV
// over the query heads of its group and the query tiles that see its keys; one block per
// (query tile, head) accumulates dQ. No atomics: bit-reproducible. Fully masked tiles are
// skipped. Scalar fp32 FMAs (no tensor cores): the reference-accurate kernel, not the fast one
// (docs/cuda.md lists what is left). Derivation of the backward: docs/math.md.
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
                const AttentionArgs& a) {
    if (bytes > size_t(lim.max_smem_optin))
        rank_fail(std::string("CUDA ") + what + ": head dims " + std::to_string(a.Dqk) + "/" +
                  std::to_string(a.Dv) + " need " + std::to_string(bytes) +
                  " bytes of shared memory per block; this GPU allows " +
                  std::to_string(lim.max_smem_optin) + " (head dims <= 256 fit sm_80/sm_90)");
    if (bytes > 48 * 1024)
        QUINTET_CUDA_CHECK(cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

AttnShape shape_of(const AttentionArgs& a) {
    QUINTET_CHECK(a.NKV > 0 && a.NH % a.NKV == 0, "attention: NH must be a multiple of NKV");
    QUINTET_CHECK(a.B <= 65535 && a.NH <= 65535, "attention: B and NH must be <= 65535 (grid limits)");
    QUINTET_CHECK(a.Dqk > 0 && a.Dv > 0, "attention: head dims must be positive");
    QUINTET_CHECK(a.q_pos && a.k_pos, "attention: query and key positions are required");
    QUINTET_CHECK((a.q_doc == nullptr) == (a.k_doc == nullptr),
                  "attention: document ids for both queries and keys, or neither");
    return AttnShape{a.B, a.Tq, a.Tk, a.NH, a.NKV, a.Dqk, a.Dv, a.q_stride, a.k_stride,
                     a.v_stride, a.o_stride, a.scale, a.causal ? 1 : 0, a.q_pos, a.k_pos,
                     a.q_doc, a.k_doc};
}

}  // namespace

void attention_forward(cudaStream_t st, const AttentionLimits& lim, float* out, float* lse,
                       const float* q, const float* k, const float* v, const AttentionArgs& a) {
    if (a.B <= 0 || a.Tq <= 0 || a.NH <= 0) return;
    const AttnShape s = shape_of(a);
    const size_t smem = fwd_smem_bytes(a.Dqk, a.Dv);
    allow_smem(attention_forward_kernel, smem, lim, "attention_forward", a);
    const dim3 grid(unsigned((a.Tq + kFwdTile - 1) / kFwdTile), unsigned(a.NH), unsigned(a.B));
    attention_forward_kernel<<<grid, kAttnThreads, smem, st>>>(out, lse, q, k, v, s);
    QUINTET_CUDA_LAUNCHED();
}

void attention_merge(cudaStream_t st, float* out, float* lse, const float* out2, const float* lse2,
                     const AttentionArgs& a) {
    if (a.B <= 0 || a.Tq <= 0 || a.NH <= 0) return;
    const AttnShape s = shape_of(a);
    const size_t total = size_t(a.B) * a.Tq * a.NH * a.Dv;
    attention_merge_kernel<<<grid_for(total), kThreads, 0, st>>>(out, lse, out2, lse2, s);
    QUINTET_CUDA_LAUNCHED();
    const size_t n = size_t(a.B) * a.NH * a.Tq;
    attention_merge_lse_kernel<<<grid_for(n), kThreads, 0, st>>>(lse, lse2, n);
    QUINTET_CUDA_LAUNCHED();
}

size_t attention_backward_scratch_bytes(const AttentionArgs& a) {
    return size_t(a.B) * a.NH * a.Tq * sizeof(float);
}

void attention_backward(cudaStream_t st, const AttentionLimits& lim, float* dq, float* dk,
                        float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, const AttentionArgs& a,
                        float* scratch) {
    if (a.B <= 0 || a.Tq <= 0 || a.Tk <= 0 || a.NH <= 0) return;
    const AttnShape s = shape_of(a);
    float* Dsum = scratch;  // [B, NH, Tq]
    const size_t rows = size_t(a.B) * a.NH * a.Tq;
    attention_dsum_kernel<<<unsigned((rows * 32 + kAttnThreads - 1) / kAttnThreads), kAttnThreads,
                            0, st>>>(Dsum, dout, out, s);
    QUINTET_CUDA_LAUNCHED();
    const int bt = backward_tile(a.Dqk, a.Dv, lim.max_smem_optin);
    const size_t smem_kv = dkv_smem_bytes(a.Dqk, a.Dv, bt), smem_q = dq_smem_bytes(a.Dqk, a.Dv, bt);
    allow_smem(attention_backward_dkv_kernel, smem_kv, lim, "attention_backward (dK, dV)", a);
    allow_smem(attention_backward_dq_kernel, smem_q, lim, "attention_backward (dQ)", a);
    attention_backward_dkv_kernel<<<dim3(unsigned((a.Tk + bt - 1) / bt), unsigned(a.NKV), unsigned(a.B)),
                                    kAttnThreads, smem_kv, st>>>(dk, dv, dout, lse, Dsum, q, k, v, s, bt);
    QUINTET_CUDA_LAUNCHED();
    attention_backward_dq_kernel<<<dim3(unsigned((a.Tq + bt - 1) / bt), unsigned(a.NH), unsigned(a.B)),
                                   kAttnThreads, smem_q, st>>>(dq, dout, lse, Dsum, q, k, v, s, bt);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
