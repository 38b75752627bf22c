// Launchers of the CUDA backend's own kernels, one .cu per op. Each has the semantics of the
// Backend method of the same name (include/quintet/kernels/backend.hpp; the CPU backend is the
// reference) and queues its work on `st`. Scratch memory, where an op needs it, is passed in by
// the backend (sized by the matching *_scratch_bytes), so no launcher allocates.
// Every reduction has a fixed order: the results are bit-reproducible run to run.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quintet/kernels/backend.hpp"  // RopeArgs, AttentionArgs
#include "quintet/core/error.hpp"

namespace quintet::cuda {

// ---- embedding.cu ----  (ids[n] < 0: a token of another vocabulary shard: zero / skipped)
void embedding_forward(cudaStream_t st, float* out, const int32_t* ids, const float* wte, int N,
                       int C);
// Stable radix sort of the ids (CUB), then one block per run of equal ids adds its rows in
// token order: deterministic, no atomics, the same summation order as the CPU backend.
size_t embedding_backward_scratch_bytes(int N, int V);
void embedding_backward(cudaStream_t st, float* dwte, const float* dout, const int32_t* ids,
                        int N, int C, int V, void* scratch, size_t scratch_bytes);

// ---- rmsnorm.cu ----
void rmsnorm_forward(cudaStream_t st, float* out, float* rstd, const float* inp, const float* w,
                     int N, int C, float eps);
// dw: per-row-chunk partial sums (pass 1), then chunks summed in order per column (pass 2).
size_t rmsnorm_backward_scratch_bytes(int N, int C);
void rmsnorm_backward(cudaStream_t st, float* dinp, float* dw, const float* dout,
                      const float* inp, const float* w, const float* rstd, int N, int C,
                      float* scratch);

// ---- rope.cu ----  (sign = +1 forward, -1 backward: the transpose rotation)
void rope_apply(cudaStream_t st, float* x, const float* cos, const float* sin, const int32_t* pos,
                const RopeArgs& a, float sign);

// ---- attention.cu ----
struct AttentionLimits {
    int max_smem_optin = 48 * 1024;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};
void attention_forward(cudaStream_t st, const AttentionLimits& lim, float* out, float* lse,
                       const float* q, const float* k, const float* v, const AttentionArgs& a);
void attention_merge(cudaStream_t st, float* out, float* lse, const float* out2, const float* lse2,
                     const AttentionArgs& a);
size_t attention_backward_scratch_bytes(const AttentionArgs& a);
void attention_backward(cudaStream_t st, const AttentionLimits& lim, float* dq, float* dk,
                        float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, const AttentionArgs& a,
                        float* scratch);

// ---- elementwise.cu ----
void moe_route(cudaStream_t st, float* probs, int32_t* expert, float* weight, const float* logits,
               const float* bias, int N, int E, int k, const MoeRouteRule& rule);
void moe_route_backward(cudaStream_t st, float* dlogits, const float* dweight, const float* probs,
                        const int32_t* expert, const float* weight, const float* daux, int N, int E,
                        int k, const MoeRouteRule& rule);
void gather_rows(cudaStream_t st, float* dst, const float* src, const int32_t* idx, int n, int C);
void moe_combine(cudaStream_t st, float* out, const float* y, const int32_t* slot, const float* weight,
                 int N, int k, int C);
void moe_combine_backward(cudaStream_t st, float* dy, float* dweight, const float* dout, const float* y,
                          const int32_t* slot, const float* weight, int N, int k, int C);
void swiglu_forward(cudaStream_t st, float* out, const float* gu, int N, int F);
void swiglu_backward(cudaStream_t st, float* dgu, const float* dout, const float* gu, int N,
                     int F);
void add_inplace(cudaStream_t st, float* a, const float* b, size_t n);
// accumulate = false: cudaMemcpy2DAsync; true: dst += src element-wise.
void copy_2d(cudaStream_t st, float* dst, size_t ld_dst, const float* src, size_t ld_src,
             size_t rows, size_t cols, bool accumulate);
void scale(cudaStream_t st, float* x, size_t n, float s);
void adamw(cudaStream_t st, float* p, const float* g, float* m, float* v, size_t n, float lr,
           float beta1, float beta2, float eps, float wd, float bc1, float bc2);
void f32_to_bf16(cudaStream_t st, uint16_t* dst, const float* src, size_t n);
void bf16_to_f32(cudaStream_t st, float* dst, const uint16_t* src, size_t n);

// ---- reduce.cu ----
// Sum of squares in double: fixed grid, per-block partials, one final block. Result in *out
// (device). scratch: sumsq_scratch_bytes().
size_t sumsq_scratch_bytes();
void sumsq(cudaStream_t st, double* out, const float* x, size_t n, double* scratch);

// ---- xent.cu ----  (losses_dev: device [N]; the backend copies them to host)
void xent_forward_backward(cudaStream_t st, float* logits, float* losses_dev,
                           const int32_t* targets, int N, int V, float grad_scale);
void xent_forward(cudaStream_t st, float* losses_dev, const float* logits, const int32_t* targets,
                  int N, int V);
// Vocab-parallel cross-entropy (Backend::xent_local_stats / xent_grad_from_stats), with the
// per-row statistics in device arrays: stats_dev[3N] = [rowmax | rowsum | target_logit] out of
// step 1, stats_dev[2N] = [gmax | gsum] into step 2.
void xent_local_stats(cudaStream_t st, float* stats_dev, const float* logits,
                      const int32_t* targets, int N, int V);
void xent_grad_from_stats(cudaStream_t st, float* logits, const float* stats_dev,
                          const int32_t* targets, int N, int V, float grad_scale);

}  // namespace quintet::cuda
