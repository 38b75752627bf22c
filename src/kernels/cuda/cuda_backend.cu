// The CUDA backend: every Backend op on device memory, queued on one compute stream; a second
// stream for communication (NcclCommunicator) so DP reduction can overlap the backward pass.
// Memory comes from a caching pool (no cudaMalloc in the steady state), GEMMs from cuBLAS /
// cuBLASLt, everything else from our kernels (kernels.cuh). The CPU backend is the reference:
// same semantics, method by method. Host-visible results (losses, sumsq, to_host) synchronise
// the compute stream; everything else is asynchronous. Status and what is left: docs/cuda.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>

#include "cuda_check.cuh"
#include "device_pool.cuh"
#include "gemm_cublas.cuh"
#include "kernels.cuh"
#include "quintet/kernels/cuda_backend.hpp"

namespace quintet {

namespace {

using cuda::DevicePool;

class CudaBackendImpl final : public CudaBackend {
public:
    explicit CudaBackendImpl(int device) : device_(device) {
        QUINTET_CUDA_CHECK(cudaSetDevice(device_));
        cudaDeviceProp prop{};
        QUINTET_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
        name_ = "cuda (device " + std::to_string(device_) + ": " + prop.name + ", sm_" +
                std::to_string(prop.major) + std::to_string(prop.minor) + ")";
        sm_count_ = prop.multiProcessorCount;
        QUINTET_CUDA_CHECK(cudaDeviceGetAttribute(&limits_.max_smem_optin,
                                                  cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
        // Non-blocking: no implicit ordering with the legacy default stream; every copy below
        // is queued on compute_ explicitly.
        QUINTET_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
        QUINTET_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
        QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&ev_compute_, cudaEventDisableTiming));
        QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&ev_comm_, cudaEventDisableTiming));
        blas_ = std::make_unique<cuda::Blas>(compute_, pool_);
    }

    ~CudaBackendImpl() override {
        QUINTET_CUDA_WARN(cudaStreamSynchronize(compute_));
        QUINTET_CUDA_WARN(cudaStreamSynchronize(comm_));
        blas_.reset();
        pool_.release(scratch_);
        QUINTET_CUDA_WARN(cudaEventDestroy(ev_compute_));
        QUINTET_CUDA_WARN(cudaEventDestroy(ev_comm_));
        QUINTET_CUDA_WARN(cudaStreamDestroy(compute_));
        QUINTET_CUDA_WARN(cudaStreamDestroy(comm_));
        // pool_ frees every block when it is destroyed, after this body.
    }

    Device device() const override { return Device::cuda; }
    std::string name() const override { return name_; }
    int threads() const override { return sm_count_; }  // streaming multiprocessors

    // ---- memory ----
    float* alloc(size_t n) override {
        auto* p = static_cast<float*>(pool_.alloc(std::max<size_t>(n, 1) * sizeof(float)));
        if (n > 0) QUINTET_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), compute_));
        return p;
    }
    void release(float* p) override { pool_.release(p); }
    void zero(float* p, size_t n) override {
        if (n > 0) QUINTET_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), compute_));
    }
    void copy(float* dst, const float* src, size_t n) override {
        if (n > 0 && dst != src)
            QUINTET_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                               cudaMemcpyDeviceToDevice, compute_));
    }
    void to_host(float* host, const float* src, size_t n) override {
        download(host, src, n * sizeof(float));
    }
    void from_host(float* dst, const float* host, size_t n) override {
        upload(dst, host, n * sizeof(float));
    }
    int32_t* alloc_i32(size_t n) override {
        auto* p = static_cast<int32_t*>(pool_.alloc(std::max<size_t>(n, 1) * sizeof(int32_t)));
        if (n > 0) QUINTET_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(int32_t), compute_));
        return p;
    }
    void release_i32(int32_t* p) override { pool_.release(p); }
    void from_host_i32(int32_t* dst, const int32_t* host, size_t n) override {
        upload(dst, host, n * sizeof(int32_t));
    }
    void to_host_i32(int32_t* host, const int32_t* src, size_t n) override {
        download(host, src, n * sizeof(int32_t));
    }

    // ---- dense algebra ----
    void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) override {
        blas_->sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }

    // ---- element-wise and row-wise kernels ----
    void embedding_forward(float* out, const int32_t* ids, const float* wte, int N,
                           int C) override {
        cuda::embedding_forward(compute_, out, ids, wte, N, C);
    }
    void embedding_backward(float* dwte, const float* dout, const int32_t* ids, int N, int C,
                            int V) override {
        const size_t bytes = cuda::embedding_backward_scratch_bytes(N, V);
        cuda::embedding_backward(compute_, dwte, dout, ids, N, C, V, scratch(bytes), bytes);
    }
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                         float eps) override {
        cuda::rmsnorm_forward(compute_, out, rstd, inp, w, N, C, eps);
    }
    void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                          const float* w, const float* rstd, int N, int C) override {
        auto* s = static_cast<float*>(scratch(cuda::rmsnorm_backward_scratch_bytes(N, C)));
        cuda::rmsnorm_backward(compute_, dinp, dw, dout, inp, w, rstd, N, C, s);
    }
    void rope_forward(float* x, const float* cs, const float* sn, const int32_t* pos,
                      const RopeArgs& a) override {
        cuda::rope_apply(compute_, x, cs, sn, pos, a, 1.0f);
    }
    void rope_backward(float* dx, const float* cs, const float* sn, const int32_t* pos,
                       const RopeArgs& a) override {
        cuda::rope_apply(compute_, dx, cs, sn, pos, a, -1.0f);
    }
    void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const AttentionArgs& a) override {
        cuda::attention_forward(compute_, limits_, out, lse, q, k, v, a);
    }
    void attention_merge(float* out, float* lse, const float* out2, const float* lse2,
                         const AttentionArgs& a) override {
        cuda::attention_merge(compute_, out, lse, out2, lse2, a);
    }
    void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                            const float* lse, const float* q, const float* k, const float* v,
                            const AttentionArgs& a) override {
        auto* s = static_cast<float*>(scratch(cuda::attention_backward_scratch_bytes(a)));
        cuda::attention_backward(compute_, limits_, dq, dk, dv, dout, out, lse, q, k, v, a, s);
    }
    void moe_route(float* probs, int32_t* expert, float* weight, const float* logits, const float* bias,
                   int N, int E, int k, const MoeRouteRule& rule) override {
        cuda::moe_route(compute_, probs, expert, weight, logits, bias, N, E, k, rule);
    }
    void moe_route_backward(float* dlogits, const float* dweight, const float* probs, const int32_t* expert,
                            const float* weight, const float* daux, int N, int E, int k,
                            const MoeRouteRule& rule) override {
        cuda::moe_route_backward(compute_, dlogits, dweight, probs, expert, weight, daux, N, E, k, rule);
    }
    void gather_rows(float* dst, const float* src, const int32_t* idx, int n, int C) override {
        cuda::gather_rows(compute_, dst, src, idx, n, C);
    }
    void moe_combine(float* out, const float* y, const int32_t* slot, const float* weight, int N, int k,
                     int C) override {
        cuda::moe_combine(compute_, out, y, slot, weight, N, k, C);
    }
    void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const int32_t* slot,
                              const float* weight, int N, int k, int C) override {
        cuda::moe_combine_backward(compute_, dy, dweight, dout, y, slot, weight, N, k, C);
    }
    void swiglu_forward(float* out, const float* gu, int N, int F) override {
        cuda::swiglu_forward(compute_, out, gu, N, F);
    }
    void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) override {
        cuda::swiglu_backward(compute_, dgu, dout, gu, N, F);
    }
    void copy_2d(float* dst, size_t ld_dst, const float* src, size_t ld_src, size_t rows,
                 size_t cols, bool accumulate) override {
        cuda::copy_2d(compute_, dst, ld_dst, src, ld_src, rows, cols, accumulate);
    }
    void add_inplace(float* a, const float* b, size_t n) override {
        cuda::add_inplace(compute_, a, b, n);
    }
    void xent_forward_backward(float* logits, float* losses, const int32_t* targets, int N, int V,
                               float grad_scale) override {
        if (N <= 0) return;
        auto* dev = static_cast<float*>(scratch(size_t(N) * sizeof(float)));
        cuda::xent_forward_backward(compute_, logits, dev, targets, N, V, grad_scale);
        download(losses, dev, size_t(N) * sizeof(float));  // losses: host memory
    }
    void xent_forward(float* losses, const float* logits, const int32_t* targets, int N,
                      int V) override {
        if (N <= 0) return;
        auto* dev = static_cast<float*>(scratch(size_t(N) * sizeof(float)));
        cuda::xent_forward(compute_, dev, logits, targets, N, V);
        download(losses, dev, size_t(N) * sizeof(float));
    }

    void xent_local_stats(float* rowmax, float* rowsum, float* target_logit, const float* logits,
                          const int32_t* targets, int N, int V) override {
        if (N <= 0) return;
        const size_t row = size_t(N) * sizeof(float);
        auto* dev = static_cast<float*>(scratch(3 * row));
        cuda::xent_local_stats(compute_, dev, logits, targets, N, V);
        download_async(rowmax, dev, row);
        download_async(rowsum, dev + N, row);
        download_async(target_logit, dev + 2 * size_t(N), row);
        QUINTET_CUDA_CHECK(cudaStreamSynchronize(compute_));
    }
    void xent_grad_from_stats(float* logits, const float* gmax, const float* gsum,
                              const int32_t* targets, int N, int V, float grad_scale) override {
        if (N <= 0) return;
        const size_t row = size_t(N) * sizeof(float);
        auto* dev = static_cast<float*>(scratch(2 * row));
        QUINTET_CUDA_CHECK(cudaMemcpyAsync(dev, gmax, row, cudaMemcpyHostToDevice, compute_));
        QUINTET_CUDA_CHECK(cudaMemcpyAsync(dev + N, gsum, row, cudaMemcpyHostToDevice, compute_));
        cuda::xent_grad_from_stats(compute_, logits, dev, targets, N, V, grad_scale);
        QUINTET_CUDA_CHECK(cudaStreamSynchronize(compute_));  // gmax/gsum reusable on return
    }

    // ---- optimizer ----
    double sumsq(const float* x, size_t n) override {
        auto* s = static_cast<double*>(scratch(cuda::sumsq_scratch_bytes() + sizeof(double)));
        double* out = s + cuda::sumsq_scratch_bytes() / sizeof(double);
        cuda::sumsq(compute_, out, x, n, s);
        double result = 0.0;
        download(&result, out, sizeof(double));
        return result;
    }
    void scale(float* x, size_t n, float s) override { cuda::scale(compute_, x, n, s); }
    void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1,
               float b2, float eps, float wd, float bc1, float bc2) override {
        cuda::adamw(compute_, p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2);
    }

    // ---- CudaBackend extras ----
    int device_index() const override { return device_; }
    void* compute_stream() const override { return compute_; }
    void* comm_stream() const override { return comm_; }
    void comm_waits_for_compute() override {
        QUINTET_CUDA_CHECK(cudaEventRecord(ev_compute_, compute_));
        QUINTET_CUDA_CHECK(cudaStreamWaitEvent(comm_, ev_compute_, 0));
    }
    void compute_waits_for_comm() override {
        QUINTET_CUDA_CHECK(cudaEventRecord(ev_comm_, comm_));
        QUINTET_CUDA_CHECK(cudaStreamWaitEvent(compute_, ev_comm_, 0));
    }
    void synchronize() override {
        QUINTET_CUDA_CHECK(cudaStreamSynchronize(compute_));
        QUINTET_CUDA_CHECK(cudaStreamSynchronize(comm_));
    }
    void set_tf32(bool on) override { blas_->set_tf32(on); }
    PoolStats pool_stats() const override {
        return {pool_.device_mallocs(), pool_.bytes_reserved(), pool_.bytes_in_use()};
    }

    bf16_bits* alloc_bf16(size_t n) override {
        auto* p = static_cast<bf16_bits*>(pool_.alloc(std::max<size_t>(n, 1) * sizeof(bf16_bits)));
        if (n > 0) QUINTET_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(bf16_bits), compute_));
        return p;
    }
    void release_bf16(bf16_bits* p) override { pool_.release(p); }
    void to_bf16(bf16_bits* dst, const float* src, size_t n) override {
        cuda::f32_to_bf16(compute_, dst, src, n);
    }
    void from_bf16(float* dst, const bf16_bits* src, size_t n) override {
        cuda::bf16_to_f32(compute_, dst, src, n);
    }
    void to_host_bf16(bf16_bits* host, const bf16_bits* src, size_t n) override {
        download(host, src, n * sizeof(bf16_bits));
    }
    void from_host_bf16(bf16_bits* dst, const bf16_bits* host, size_t n) override {
        upload(dst, host, n * sizeof(bf16_bits));
    }
    void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const bf16_bits* A, int lda,
                   const bf16_bits* B, int ldb, float beta, float* C, int ldc) override {
        QUINTET_CHECK(K > 0, "gemm_bf16 needs K > 0");
        blas_->gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, false, ldc);
    }
    void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const bf16_bits* A, int lda,
                   const bf16_bits* B, int ldb, float beta, bf16_bits* C, int ldc) override {
        QUINTET_CHECK(K > 0, "gemm_bf16 needs K > 0");
        blas_->gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, true, ldc);
    }

private:
    // Host <-> device copies on the compute stream, complete (and the host buffer free to
    // reuse) on return, like the CPU backend's memcpy.
    void upload(void* dst, const void* host, size_t bytes) {
        if (bytes == 0) return;
        QUINTET_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, compute_));
        QUINTET_CUDA_CHECK(cudaStreamSynchronize(compute_));
    }
    void download_async(void* host, const void* src, size_t bytes) {
        if (bytes == 0) return;
        QUINTET_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, compute_));
    }
    void download(void* host, const void* src, size_t bytes) {
        if (bytes == 0) return;
        QUINTET_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, compute_));
        QUINTET_CUDA_CHECK(cudaStreamSynchronize(compute_));
    }
    // One scratch area shared by the ops: they run in order on the compute stream, so reuse is
    // safe; it only grows (the old block goes back to the pool, stream-ordered).
    void* scratch(size_t bytes) {
        if (bytes > scratch_bytes_) {
            pool_.release(scratch_);
            scratch_ = pool_.alloc(bytes);
            scratch_bytes_ = DevicePool::size_class(bytes);
        }
        return scratch_;
    }

    int device_;
    std::string name_;
    int sm_count_ = 0;
    cuda::AttentionLimits limits_;
    cudaStream_t compute_ = nullptr, comm_ = nullptr;
    cudaEvent_t ev_compute_ = nullptr, ev_comm_ = nullptr;
    DevicePool pool_;                    // declared before blas_: destroyed after it
    std::unique_ptr<cuda::Blas> blas_;
    void* scratch_ = nullptr;
    size_t scratch_bytes_ = 0;
};

int device_count(std::string* why) {
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        if (why != nullptr)
            *why = std::string("no CUDA device: cudaGetDeviceCount failed: ") +
                   cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc);
        return 0;
    }
    if (n == 0 && why != nullptr) *why = "no CUDA device: cudaGetDeviceCount found 0 devices";
    return n;
}

}  // namespace

std::string cuda_unavailable_reason() {
    std::string why;
    device_count(&why);
    return why;
}

bool cuda_available() { return cuda_unavailable_reason().empty(); }

std::unique_ptr<CudaBackend> make_cuda_backend_ext(int device_index) {
    std::string why;
    const int n = device_count(&why);
    if (n == 0) config_fail("train.device", "cuda", why + " (valid here: cpu)");
    if (device_index < 0 || device_index >= n)
        config_fail("train.device", "cuda",
                    "device index " + std::to_string(device_index) + " is out of range: " +
                        std::to_string(n) + " CUDA device(s) visible (valid: 0.." +
                        std::to_string(n - 1) + ")");
    return std::make_unique<CudaBackendImpl>(device_index);
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
    return make_cuda_backend_ext(device_index);
}

}  // namespace quintet
