// Token embedding on the CPU (the twin of src/kernels/cuda/embedding.cu). ids[n] < 0 marks a
// token of another rank's vocabulary shard: a zero row forward, nothing backward. The backward
// splits the columns over threads rather than the tokens, so that each element of dwte sums
// its tokens in token order (the CUDA kernel's order too) without atomics.
#include <omp.h>

#include <cstring>

#include "cpu_backend.hpp"

namespace quintet::cpu {

void CpuBackend::embedding_forward(float* out, const int32_t* ids, const float* wte, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
        if (ids[n] >= 0) std::memcpy(out + size_t(n) * C, wte + size_t(ids[n]) * C, size_t(C) * 4);
        else std::memset(out + size_t(n) * C, 0, size_t(C) * 4);
    }
}

void CpuBackend::embedding_backward(float* dwte, const float* dout, const int32_t* ids, int N,
                                    int C, int V) {
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

}  // namespace quintet::cpu
