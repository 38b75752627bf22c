// The CPU backend as a whole: its construction (OpenMP's and the BLAS's thread counts, the
// GEMM kernel), make_cpu_backend, Backend's default for the vocab-parallel loss (a backend
// without it stops the rank), and the sgemm rate `quintet peak` reports. The kernels are in
// the files that cpu_backend.hpp lists, one per operation family.
#include "cpu_backend.hpp"

#include <omp.h>

#include <chrono>
#include <cstdint>

#if QUINTET_BLAS_BLIS
// Declared in blis.h (which BLIS's cblas.h does not pull in); dim_t is 64-bit in Debian's build.
extern "C" void bli_thread_set_num_threads(int64_t);
static void blas_set_threads(int n) { bli_thread_set_num_threads(int64_t(n)); }
#else
extern "C" void openblas_set_num_threads(int);
static void blas_set_threads(int n) { openblas_set_num_threads(n); }
#endif

namespace quintet::cpu {

CpuBackend::CpuBackend(int threads) : threads_(threads) {
    omp_set_num_threads(threads_);
    blas_set_threads(threads_);
    gemm_ = gemm_kernel();  // reads QUINTET_CPU_GEMM now: a bad value stops before any work
}

}  // namespace quintet::cpu

namespace quintet {

using cpu::CpuBackend;

void Backend::xent_local_stats(float*, float*, float*, const float*, const int32_t*, int, int) {
    rank_fail("backend " + name() + " does not implement xent_local_stats (vocab-parallel loss)");
}
void Backend::xent_grad_from_stats(float*, const float*, const float*, const int32_t*, int, int,
                                   float) {
    rank_fail("backend " + name() + " does not implement xent_grad_from_stats (vocab-parallel loss)");
}

std::unique_ptr<Backend> make_cpu_backend(int threads) {
    if (threads <= 0) {
        const char* env = std::getenv("OMP_NUM_THREADS");
        threads = env ? std::atoi(env) : 0;
        if (threads <= 0) threads = omp_get_num_procs();
    }
    return std::make_unique<CpuBackend>(threads);
}

double cpu_measure_sgemm_gflops(Backend& be, int n, int repeats) {
    float* a = be.alloc(size_t(n) * n);
    float* b = be.alloc(size_t(n) * n);
    float* c = be.alloc(size_t(n) * n);
    for (size_t i = 0; i < size_t(n) * n; ++i) {
        a[i] = float((i * 7) % 13) * 0.01f;
        b[i] = float((i * 5) % 11) * 0.01f;
    }
    be.gemm(false, true, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);  // warm-up
    double best = 0.0;
    for (int r = 0; r < repeats; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        be.gemm(false, true, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, 2.0 * n * double(n) * n / s / 1e9);
    }
    be.release(a);
    be.release(b);
    be.release(c);
    return best;
}

}  // namespace quintet
