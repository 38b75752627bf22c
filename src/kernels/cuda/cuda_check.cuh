// Every CUDA runtime, cuBLAS(Lt) and NCCL call is checked: a failure throws RankError with the
// call's text, the library's error name and message, and file:line (a rank-local failure,
// docs/architecture.md "Errors": main() then prints "rank N: ..." and MPI_Aborts). The *_WARN forms are for destructors: they print
// and never throw.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "quintet/core/error.hpp"

#ifdef QUINTET_WITH_NCCL
#include <nccl.h>
#endif

namespace quintet::cuda {

inline std::string where(const char* file, int line) {
    return std::string(file) + ":" + std::to_string(line) + ": ";
}

inline void check_cuda(cudaError_t rc, const char* what, const char* file, int line) {
    if (rc == cudaSuccess) return;
    (void)cudaGetLastError();  // clear a non-sticky error so the message is the only trace
    rank_fail(where(file, line) + what + " failed: " + cudaGetErrorName(rc) + ": " +
              cudaGetErrorString(rc));
}

inline void check_cublas(cublasStatus_t rc, const char* what, const char* file, int line) {
    if (rc == CUBLAS_STATUS_SUCCESS) return;
    rank_fail(where(file, line) + what + " failed: " + cublasGetStatusName(rc) + ": " +
              cublasGetStatusString(rc));
}

inline void warn_cuda(cudaError_t rc, const char* what, const char* file, int line) {
    if (rc == cudaSuccess) return;
    std::fprintf(stderr, "%s:%d: %s failed: %s: %s (ignored during clean-up)\n", file, line, what,
                 cudaGetErrorName(rc), cudaGetErrorString(rc));
}

#ifdef QUINTET_WITH_NCCL
inline void check_nccl(ncclResult_t rc, ncclComm_t comm, const char* what, const char* file,
                       int line) {
    if (rc == ncclSuccess) return;  // communicators are blocking: no ncclInProgress
    std::string last;
    if (comm != nullptr) {
        const char* l = ncclGetLastError(comm);
        if (l != nullptr && *l != '\0') last = std::string(" (") + l + ")";
    }
    rank_fail(where(file, line) + what + " failed: " + ncclGetErrorString(rc) + last);
}
#endif

}  // namespace quintet::cuda

#define QUINTET_CUDA_CHECK(call) ::quintet::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define QUINTET_CUDA_WARN(call) ::quintet::cuda::warn_cuda((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define QUINTET_CUDA_LAUNCHED() QUINTET_CUDA_CHECK(cudaGetLastError())
#define QUINTET_CUBLAS_CHECK(call) ::quintet::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#ifdef QUINTET_WITH_NCCL
// `comm` (may be nullptr) adds NCCL's last-error text for that communicator.
#define QUINTET_NCCL_CHECK(call, comm) \
    ::quintet::cuda::check_nccl((call), (comm), #call, __FILE__, __LINE__)
#endif
