// The CPU backend as a whole: its construction (OpenMP's and the BLAS's thread counts, the
// GEMM kernel), make_cpu_backend, Backend's default for the vocab-parallel loss (a backend
// without it stops the rank), and the sgemm rate `quintet peak` reports. The kernels are in
// the files that cpu_backend.hpp lists, one per operation family.
#include "cpu_backend.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "quintet/core/stats.hpp"

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

double cpu_measure_read_gbs(Backend& be, int mib, int repeats) {
    const size_t n = size_t(mib) << 18;  // floats
    float* a = be.alloc(n);
    const int threads = be.threads();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; ++i) a[i] = float(i % 7) * 0.125f;  // each thread's pages its own
    std::vector<double> gbs;
    float keep = 0;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        float sum = 0;
        // 64 partial sums: independent chains the compiler keeps in vector registers (one
        // chain would bound the loop by the add's latency, not by the memory).
#pragma omp parallel num_threads(threads) reduction(+ : sum)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const size_t blocks = n / 64, b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
            float part[64] = {};
            for (size_t blk = b0; blk < b1; ++blk)
#pragma omp simd
                for (int j = 0; j < 64; ++j) part[j] += a[blk * 64 + j];
            for (float x : part) sum += x;
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        keep += sum;
        gbs.push_back(double(n) * sizeof(float) / s / 1e9);
    }
    be.release(a);
    return median_of(gbs) + (keep == -1.0f ? 1e-30 : 0.0);  // the sum is used: not optimised away
}

double cpu_measure_rows_gbs(Backend& be, int rows, int mib, int repeats) {
    const int K = 4096, N = int((size_t(mib) << 18) / K);
    const size_t w = size_t(N) * K;
    float* b = be.alloc(w);
    float* x = be.alloc(size_t(rows) * K);
    float* y = be.alloc(size_t(rows) * N);
    const int threads = be.threads();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < w; ++i) b[i] = float(i % 5) * 0.25f;
    for (size_t i = 0; i < size_t(rows) * K; ++i) x[i] = float(i % 3) * 0.5f;
    std::vector<double> gbs;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        be.gemm(false, true, rows, N, K, 1.0f, x, K, b, K, 0.0f, y, N);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        gbs.push_back(double(w) * sizeof(float) / s / 1e9);
    }
    be.release(b);
    be.release(x);
    be.release(y);
    return median_of(gbs);
}

}  // namespace quintet
