// The CUDA backend's extras beyond Backend: its two streams (compute, communication), the
// bf16 building blocks (storage, conversions, cuBLASLt GEMM with fp32 accumulation), the TF32
// switch and allocator statistics. Plain C++ (no CUDA header), so host code and tests use it.
// Defined only in CUDA builds (QUINTET_WITH_CUDA); make_cuda_backend()/cuda_available() in
// backend.hpp exist in every build. Derivations and status: docs/cuda.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "quintet/kernels/backend.hpp"

namespace quintet {

class CudaBackend : public Backend {
public:
    struct PoolStats {
        size_t device_mallocs = 0;   // cudaMalloc calls so far (constant in the steady state)
        size_t bytes_reserved = 0;   // held from the driver: in use + cached in the free lists
        size_t bytes_in_use = 0;     // handed out and not yet released
    };

    virtual int device_index() const = 0;
    // cudaStream_t handles, as void* so this header needs no CUDA include. Every Backend op is
    // queued on the compute stream; NcclCommunicator queues its collectives on the comm stream.
    virtual void* compute_stream() const = 0;
    virtual void* comm_stream() const = 0;
    // Orderings between the streams, host not blocked: work queued next on the comm stream
    // starts after the compute work queued so far, and the converse.
    virtual void comm_waits_for_compute() = 0;
    virtual void compute_waits_for_comm() = 0;
    // Host waits for both streams.
    virtual void synchronize() = 0;
    // fp32 GEMMs on TF32 tensor cores (off by default: results then match the CPU to ~1e-6).
    virtual void set_tf32(bool on) = 0;
    virtual PoolStats pool_stats() const = 0;

    // ---- bf16 extras (the core bf16 ops are Backend methods) ----
    // Host <-> device copies of bf16 arrays.
    virtual void to_host_bf16(bf16_bits* host, const bf16_bits* src, size_t n) = 0;
    virtual void from_host_bf16(bf16_bits* dst, const bf16_bits* host, size_t n) = 0;
    // Backend::gemm_bf16 on cuBLASLt (CUBLAS_COMPUTE_32F); this overload rounds C to bf16 once
    // at the end.
    using Backend::gemm_bf16;
    virtual void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                           const bf16_bits* A, int lda, const bf16_bits* B, int ldb, float beta,
                           bf16_bits* C, int ldc) = 0;
};

// The same backend as make_cuda_backend(), typed. Throws ConfigError naming train.device when
// no GPU is usable (with the CUDA error text) or device_index is out of range.
std::unique_ptr<CudaBackend> make_cuda_backend_ext(int device_index);
// "" when a CUDA device can be used; else why not: "no CUDA device: <CUDA error text>".
std::string cuda_unavailable_reason();

}  // namespace quintet
