// The CPU backend's class (private header): the reference implementation of Backend
// (include/quintet/kernels/backend.hpp). Memory is host memory, so allocation and copies stay
// inline here; each operation family has its own file beside it, named after its CUDA twin
// (src/kernels/cuda/<family>.cu <-> cpu_<family>.cpp):
//   cpu_gemm_blas.cpp    gemm, gemm_bf16: quintet's GEMM (cpu_gemm.cpp) or the BLAS's sgemm
//   cpu_embedding.cpp    token embedding
//   cpu_rmsnorm.cpp      RMSNorm
//   cpu_rope.cpp         RoPE
//   cpu_attention.cpp    the general attention operation (tiles multiplied by cpu_tile_gemm.hpp)
//   cpu_moe.cpp          MoE routing and the row gathers around the experts
//   cpu_elementwise.cpp  SwiGLU, copy_2d, add, scale, the AdamW step, fp32 <-> bf16
//   cpu_xent.cpp         fused softmax cross-entropy, whole vocabulary and vocab-parallel
//   cpu_reduce.cpp       the deterministic sum of squares (the gradient norm)
//   cpu_backend.cpp      the factory, the thread setup, the sgemm rate measurement
// The kernels run on OpenMP threads (the BLAS shares the pool) and sum every output element in
// a fixed order: the same bits for a given thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cpu_gemm.hpp"
#include "quintet/core/bf16.hpp"
#include "quintet/core/error.hpp"
#include "quintet/kernels/backend.hpp"

namespace quintet::cpu {

// Scratch of the attention kernels, grown on first use and kept (no allocation in the steady
// state): per-thread tiles, per-tile position bounds, the backward's task lists and the
// thread-private dK/dV it reduces afterwards.
struct AttentionScratch {
    struct Tile {
        std::vector<float> s, dp, m, l, d;  // [Bq*Bk], [Bq*Bk], [Bq] x 3
        // A query tile's operands packed for cpu_tile_gemm.hpp (once per task), as A panels
        // (_a) or B panels (_b).
        std::vector<float> q_a, do_a, q_b, do_b;
        std::vector<float> o, dq;  // [Bq * Dv], [Bq * Dqk]: the tile's O and dQ accumulators
    };
    std::vector<Tile> tiles;                // per thread
    // Every key tile's operands as B panels, packed once per call for all the query tiles and
    // heads that use them: K^T (S = Q K^T), V (P V), V^T (dP = dO V^T), K (dQ = dS K).
    std::vector<float> kT, v, vT, k;
    std::vector<int32_t> qb, kb;            // per (b, tile): min/max position and document
    std::vector<std::vector<long>> tasks;   // per thread: backward tasks
    std::vector<std::vector<float>> dk, dv; // per thread > 0: private dK, dV
    std::vector<std::pair<int, long>> cost;  // per task: (visible key tiles, task)
    std::vector<double> load;
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int threads);  // cpu_backend.cpp
    Device device() const override { return Device::cpu; }
    std::string name() const override {
        const char* gemm = gemm_ == GemmKernel::avx512 ? "AVX-512 GEMM"
                           : gemm_ == GemmKernel::avx2 ? "AVX2 GEMM"
                                                       : QUINTET_BLAS_NAME;
        return std::string("cpu (") + gemm +
               " + OpenMP)";
    }
    int threads() const override { return threads_; }

    float* alloc(size_t n) override {
        void* p = nullptr;
        if (posix_memalign(&p, 64, std::max<size_t>(n, 1) * sizeof(float)) != 0)
            rank_fail("out of host memory allocating " + std::to_string(n * 4) + " bytes");
        std::memset(p, 0, n * sizeof(float));
        return static_cast<float*>(p);
    }
    void release(float* p) override { std::free(p); }
    void zero(float* p, size_t n) override {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
        for (size_t i = 0; i < n; ++i) p[i] = 0.0f;
    }
    void copy(float* dst, const float* src, size_t n) override { std::memcpy(dst, src, n * 4); }
    void to_host(float* host, const float* src, size_t n) override { std::memcpy(host, src, n * 4); }
    void from_host(float* dst, const float* host, size_t n) override { std::memcpy(dst, host, n * 4); }
    int32_t* alloc_i32(size_t n) override {
        return static_cast<int32_t*>(std::calloc(std::max<size_t>(n, 1), sizeof(int32_t)));
    }
    void release_i32(int32_t* p) override { std::free(p); }
    void from_host_i32(int32_t* dst, const int32_t* host, size_t n) override {
        std::memcpy(dst, host, n * 4);
    }
    void to_host_i32(int32_t* host, const int32_t* src, size_t n) override {
        std::memcpy(host, src, n * 4);
    }
    bf16_bits* alloc_bf16(size_t n) override {
        return static_cast<bf16_bits*>(std::calloc(std::max<size_t>(n, 1), sizeof(bf16_bits)));
    }
    void release_bf16(bf16_bits* p) override { std::free(p); }

    // cpu_gemm_blas.cpp
    void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) override;
    void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const bf16_bits* A, int lda,
                   const bf16_bits* B, int ldb, float beta, float* C, int ldc) override;

    // cpu_embedding.cpp
    void embedding_forward(float* out, const int32_t* ids, const float* wte, int N, int C) override;
    void embedding_backward(float* dwte, const float* dout, const int32_t* ids, int N, int C,
                            int V) override;

    // cpu_rmsnorm.cpp
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                         float eps) override;
    void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                          const float* w, const float* rstd, int N, int C) override;

    // cpu_rope.cpp
    void rope_forward(float* x, const float* cs, const float* sn, const int32_t* pos,
                      const RopeArgs& a) override;
    void rope_backward(float* dx, const float* cs, const float* sn, const int32_t* pos,
                       const RopeArgs& a) override;

    // cpu_attention.cpp
    void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const AttentionArgs& a) override;
    void attention_merge(float* out, float* lse, const float* out2, const float* lse2,
                         const AttentionArgs& a) override;
    void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                            const float* lse, const float* q, const float* k, const float* v,
                            const AttentionArgs& a) override;

    // cpu_moe.cpp
    void moe_route(float* probs, int32_t* expert, float* weight, const float* logits,
                   const float* bias, int N, int E, int k, const MoeRouteRule& rule) override;
    void moe_route_backward(float* dlogits, const float* dweight, const float* probs,
                            const int32_t* expert, const float* weight, const float* daux, int N,
                            int E, int k, const MoeRouteRule& rule) override;
    void gather_rows(float* dst, const float* src, const int32_t* idx, int n, int C) override;
    void moe_combine(float* out, const float* y, const int32_t* slot, const float* weight, int N,
                     int k, int C) override;
    void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y,
                              const int32_t* slot, const float* weight, int N, int k, int C) override;

    // cpu_elementwise.cpp
    void swiglu_forward(float* out, const float* gu, int N, int F) override;
    void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) override;
    void copy_2d(float* dst, size_t ld_dst, const float* src, size_t ld_src, size_t rows,
                 size_t cols, bool accumulate) override;
    void add_inplace(float* a, const float* b, size_t n) override;
    void scale(float* x, size_t n, float s) override;
    void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1,
               float b2, float eps, float wd, float bc1, float bc2) override;
    void to_bf16(bf16_bits* dst, const float* src, size_t n) override;
    void from_bf16(float* dst, const bf16_bits* src, size_t n) override;

    // cpu_xent.cpp
    void xent_forward_backward(float* logits, float* losses, const int32_t* targets, int N, int V,
                               float grad_scale) override;
    void xent_forward(float* losses, const float* logits, const int32_t* targets, int N,
                      int V) override;
    void xent_local_stats(float* rowmax, float* rowsum, float* tl, const float* logits,
                          const int32_t* targets, int N, int V) override;
    void xent_grad_from_stats(float* logits, const float* gmax, const float* gsum,
                              const int32_t* targets, int N, int V, float grad_scale) override;

    // cpu_reduce.cpp
    double sumsq(const float* x, size_t n) override;

private:
    // cpu_gemm_blas.cpp: every matmul, and the bf16 operands widened into scratch.
    void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);
    const float* widen(std::vector<float>& buf, const bf16_bits* x, int rows, int cols, int ld);
    std::vector<float> wide_a_, wide_b_;

    int threads_;
    GemmKernel gemm_ = GemmKernel::blas;
    std::vector<double> partial_;  // cpu_reduce.cpp
    AttentionScratch att_;  // cpu_attention.cpp
};

}  // namespace quintet::cpu
