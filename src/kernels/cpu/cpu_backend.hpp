// The CPU backend (private header): the BLAS's sgemm for every matmul (BLIS or OpenBLAS, the
// CMake option QUINTET_BLAS, OpenMP builds: they share our thread pool), a register-blocked
// kernel for the attention tiles (cpu_tile_gemm.hpp), and fused element-wise kernels
// parallelised with OpenMP. The reference implementation of
// Backend. The attention and RoPE kernels live in cpu_attention.cpp.
#pragma once
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu_gemm.hpp"
#include "cpu_math.hpp"
#include "quintet/core/bf16.hpp"
#include "quintet/core/error.hpp"
#include "quintet/kernels/backend.hpp"

#if QUINTET_BLAS_BLIS
// Declared in blis.h (which BLIS's cblas.h does not pull in); dim_t is 64-bit in Debian's build.
extern "C" void bli_thread_set_num_threads(int64_t);
inline void blas_set_threads(int n) { bli_thread_set_num_threads(int64_t(n)); }
#else
extern "C" void openblas_set_num_threads(int);
inline void blas_set_threads(int n) { openblas_set_num_threads(n); }
#endif

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
    explicit CpuBackend(int threads) : threads_(threads) {
        omp_set_num_threads(threads_);
        blas_set_threads(threads_);
        gemm_ = gemm_kernel();  // reads QUINTET_CPU_GEMM now: a bad value stops before any work
    }
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

    void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) override {
        sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }

    // bf16 on the CPU exists to run the mixed-precision model path (and check its numerics) on
    // machines without a GPU: this CPU has no bf16 arithmetic, so gemm_bf16 widens its operands
    // into scratch (grown once, reused) and runs sgemm -- exact products, fp32 sums, like a
    // tensor core; slower than fp32, not faster.
    bf16_bits* alloc_bf16(size_t n) override {
        return static_cast<bf16_bits*>(std::calloc(std::max<size_t>(n, 1), sizeof(bf16_bits)));
    }
    void release_bf16(bf16_bits* p) override { std::free(p); }
    void to_bf16(bf16_bits* dst, const float* src, size_t n) override {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
        for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
    }
    void from_bf16(float* dst, const bf16_bits* src, size_t n) override {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
        for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
    }
    void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const bf16_bits* A, int lda,
                   const bf16_bits* B, int ldb, float beta, float* C, int ldc) override {
        // op(A) is M x K: stored rows x cols = (ta ? K x M : M x K); likewise B.
        const float* a = widen(wide_a_, A, ta ? K : M, ta ? M : K, lda);
        const float* b = widen(wide_b_, B, tb ? N : K, tb ? K : N, ldb);
        sgemm(ta, tb, M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, C, ldc);
    }

    void embedding_forward(float* out, const int32_t* ids, const float* wte, int N, int C) override {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            if (ids[n] >= 0) std::memcpy(out + size_t(n) * C, wte + size_t(ids[n]) * C, size_t(C) * 4);
            else std::memset(out + size_t(n) * C, 0, size_t(C) * 4);
        }
    }

    void embedding_backward(float* dwte, const float* dout, const int32_t* ids, int N, int C,
                            int V) override {
        (void)V;
        // Split the columns over threads: each thread adds all tokens in order to its columns,
        // so the sum order per element is fixed (bit-reproducible) and there are no races.
#pragma omp parallel
        {
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            int c0 = int(long(C) * t / nt), c1 = int(long(C) * (t + 1) / nt);
            for (int n = 0; n < N; ++n) {
                if (ids[n] < 0) continue;
                float* row = dwte + size_t(ids[n]) * C;
                const float* g = dout + size_t(n) * C;
                for (int c = c0; c < c1; ++c) row[c] += g[c];
            }
        }
    }

    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                         float eps) override {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            const float* x = inp + size_t(n) * C;
            float* y = out + size_t(n) * C;
            float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
            for (int c = 0; c < C; ++c) ss += x[c] * x[c];
            float r = 1.0f / std::sqrt(ss / C + eps);
            rstd[n] = r;
#pragma omp simd
            for (int c = 0; c < C; ++c) y[c] = x[c] * r * w[c];
        }
    }

    void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                          const float* w, const float* rstd, int N, int C) override {
        // dx = r*w*dy - x * r^3/C * sum(dy*w*x);  dw = sum_n dy * x * r.
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            const float* x = inp + size_t(n) * C;
            const float* dy = dout + size_t(n) * C;
            float* dx = dinp + size_t(n) * C;
            float r = rstd[n], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int c = 0; c < C; ++c) dot += dy[c] * w[c] * x[c];
            float k = dot * r * r * r / C;
#pragma omp simd
            for (int c = 0; c < C; ++c) dx[c] += r * w[c] * dy[c] - k * x[c];
        }
        // dw: columns split over threads, rows summed in order (deterministic).
#pragma omp parallel
        {
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            int c0 = int(long(C) * t / nt), c1 = int(long(C) * (t + 1) / nt);
            for (int n = 0; n < N; ++n) {
                const float* x = inp + size_t(n) * C;
                const float* dy = dout + size_t(n) * C;
                float r = rstd[n];
                for (int c = c0; c < c1; ++c) dw[c] += dy[c] * x[c] * r;
            }
        }
    }

    void rope_forward(float* x, const float* cs, const float* sn, const int32_t* pos,
                      const RopeArgs& a) override {
        rope_apply(x, cs, sn, pos, a, 1.0f);
    }
    void rope_backward(float* dx, const float* cs, const float* sn, const int32_t* pos,
                       const RopeArgs& a) override {
        rope_apply(dx, cs, sn, pos, a, -1.0f);
    }

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
                   const float* bias, int N, int E, int k, bool norm) override;
    void moe_route_backward(float* dlogits, const float* dweight, const float* probs,
                            const int32_t* expert, const float* weight, const float* daux, int N,
                            int E, int k, bool norm) override;
    void gather_rows(float* dst, const float* src, const int32_t* idx, int n, int C) override;
    void moe_combine(float* out, const float* y, const int32_t* slot, const float* weight, int N,
                     int k, int C) override;
    void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y,
                              const int32_t* slot, const float* weight, int N, int k, int C) override;

    void swiglu_forward(float* out, const float* gu, int N, int F) override {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            const float* g = gu + size_t(n) * 2 * F;
            const float* u = g + F;
            float* o = out + size_t(n) * F;
#pragma omp simd
            for (int f = 0; f < F; ++f) o[f] = g[f] / (1.0f + exp_fast(-g[f])) * u[f];
        }
    }
    void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) override {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            const float* g = gu + size_t(n) * 2 * F;
            const float* u = g + F;
            const float* dy = dout + size_t(n) * F;
            float* dg = dgu + size_t(n) * 2 * F;
            float* du = dg + F;
#pragma omp simd
            for (int f = 0; f < F; ++f) {
                float s = 1.0f / (1.0f + exp_fast(-g[f]));
                float silu = g[f] * s;
                du[f] = dy[f] * silu;
                dg[f] = dy[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
            }
        }
    }
    void copy_2d(float* dst, size_t ld_dst, const float* src, size_t ld_src, size_t rows,
                 size_t cols, bool accumulate) override {
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
        for (size_t r = 0; r < rows; ++r) {
            float* d = dst + r * ld_dst;
            const float* s = src + r * ld_src;
            if (accumulate) {
#pragma omp simd
                for (size_t c = 0; c < cols; ++c) d[c] += s[c];
            } else {
                std::memcpy(d, s, cols * sizeof(float));
            }
        }
    }
    void add_inplace(float* a, const float* b, size_t n) override {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; ++i) a[i] += b[i];
    }

    void xent_forward_backward(float* logits, float* losses, const int32_t* targets, int N, int V,
                               float grad_scale) override {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            float* z = logits + size_t(n) * V;
            int tgt = targets[n];
            if (tgt < 0) {
                std::memset(z, 0, size_t(V) * 4);
                losses[n] = 0.0f;
                continue;
            }
            const float mx = max_of(z, V, -INFINITY);
            const float zt = z[tgt];
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; ++i) {
                float e = exp_fast(z[i] - mx);
                z[i] = e;
                sum += e;
            }
            float inv = 1.0f / sum;
            losses[n] = std::log(sum) - (zt - mx);  // -log softmax(z)[tgt]
            float gs = grad_scale * inv;
#pragma omp simd
            for (int i = 0; i < V; ++i) z[i] *= gs;
            z[tgt] -= grad_scale;
        }
    }
    void xent_forward(float* losses, const float* logits, const int32_t* targets, int N,
                      int V) override {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            const float* z = logits + size_t(n) * V;
            int tgt = targets[n];
            if (tgt < 0) { losses[n] = 0.0f; continue; }
            const float mx = max_of(z, V, -INFINITY);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; ++i) sum += exp_fast(z[i] - mx);
            losses[n] = std::log(sum) + mx - z[tgt];
        }
    }

    void xent_local_stats(float* rowmax, float* rowsum, float* tl, const float* logits,
                          const int32_t* targets, int N, int V) override {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            const float* z = logits + size_t(n) * V;
            const float mx = max_of(z, V, -INFINITY);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; ++i) sum += exp_fast(z[i] - mx);
            rowmax[n] = V > 0 ? mx : -INFINITY;
            rowsum[n] = sum;
            tl[n] = targets[n] >= 0 ? z[targets[n]] : 0.0f;
        }
    }
    void xent_grad_from_stats(float* logits, const float* gmax, const float* gsum,
                              const int32_t* targets, int N, int V, float grad_scale) override {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; ++n) {
            float* z = logits + size_t(n) * V;
            const float m = gmax[n], k = grad_scale / gsum[n];
#pragma omp simd
            for (int i = 0; i < V; ++i) z[i] = exp_fast(z[i] - m) * k;
            if (targets[n] >= 0) z[targets[n]] -= grad_scale;
        }
    }

    double sumsq(const float* x, size_t n) override {
        // Fixed chunks summed in order: the same result for the same thread count and n.
        constexpr size_t kChunk = 1 << 14;
        size_t nchunks = (n + kChunk - 1) / kChunk;
        partial_.assign(std::max<size_t>(nchunks, 1), 0.0);
#pragma omp parallel for schedule(static)
        for (size_t c = 0; c < nchunks; ++c) {
            size_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
            double s = 0.0;
            for (size_t i = lo; i < hi; ++i) s += double(x[i]) * x[i];
            partial_[c] = s;
        }
        double total = 0.0;
        for (size_t c = 0; c < nchunks; ++c) total += partial_[c];
        return total;
    }
    void scale(float* x, size_t n, float s) override {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; ++i) x[i] *= s;
    }
    void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1,
               float b2, float eps, float wd, float bc1, float bc2) override {
        // PyTorch's AdamW (non-foreach, non-fused path): decay, moments, bias-corrected step.
        const float step_size = lr / bc1;
        const float bc2_sqrt = std::sqrt(bc2);
        const float decay = 1.0f - lr * wd;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; ++i) {
            float pi = p[i] * decay;
            float mi = m[i] + (g[i] - m[i]) * (1.0f - b1);  // torch: m.lerp_(g, 1-beta1)
            float vi = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
            m[i] = mi;
            v[i] = vi;
            float denom = std::sqrt(vi) / bc2_sqrt + eps;
            p[i] = pi - step_size * mi / denom;
        }
    }

private:
    // Every matmul: quintet's GEMM for the host's ISA (cpu_gemm.hpp), else the BLAS.
    void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
        if (gemm_ != GemmKernel::blas)
            return own_sgemm(gemm_, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads_);
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    // rows x cols of a bf16 matrix with leading dimension ld, widened into dense fp32 scratch.
    const float* widen(std::vector<float>& buf, const bf16_bits* x, int rows, int cols, int ld) {
        const size_t n = size_t(rows) * cols;
        if (buf.size() < n) buf.resize(n);  // grows during the first step only
        float* out = buf.data();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) out[size_t(r) * cols + c] = bf16_to_float(x[size_t(r) * ld + c]);
        return out;
    }
    std::vector<float> wide_a_, wide_b_;

    void rope_apply(float* x, const float* cs, const float* sn, const int32_t* pos,
                    const RopeArgs& a, float sign);

    int threads_;
    GemmKernel gemm_ = GemmKernel::blas;
    std::vector<double> partial_;
    AttentionScratch att_;  // cpu_attention.cpp
};

}  // namespace quintet::cpu
