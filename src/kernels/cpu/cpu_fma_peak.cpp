// The CPU's fp32 FMA peak, measured: the denominator of MFU (docs/math.md §1.4).
//
// One core's peak is (FMA units) x (lanes per vector) x 2 flops x clock. Rather than trust a
// table of CPUs, run that loop: 12 independent accumulator chains per thread (enough to cover
// the FMA latency of 4-5 cycles on two pipes), each `acc = acc * a + b`, with the widest vector
// unit the CPU reports at run time (AVX-512, AVX2+FMA, else scalar), so a portable build still
// measures the host's own peak. Values stay finite: a = 1 - 2^-20 shrinks the accumulators
// towards b / (1 - a), never to a denormal.
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "quintet/kernels/backend.hpp"

namespace quintet {

namespace {

constexpr int kChains = 12;

__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iters) {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 0.01f * c);
    const __m512 a = _mm512_set1_ps(1.0f - 1.0f / (1 << 20)), b = _mm512_set1_ps(1e-6f);
    for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 16  // whole, at any -O: a rolled loop keeps acc[] in memory (half the rate)
        for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
    float out[16];
    _mm512_storeu_ps(out, s);
    float t = 0;
    for (float v : out) t += v;
    return t;
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters) {
    __m256 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + 0.01f * c);
    const __m256 a = _mm256_set1_ps(1.0f - 1.0f / (1 << 20)), b = _mm256_set1_ps(1e-6f);
    for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 16  // whole, at any -O: a rolled loop keeps acc[] in memory (half the rate)
        for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    __m256 s = acc[0];
    for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
    float out[8];
    _mm256_storeu_ps(out, s);
    float t = 0;
    for (float v : out) t += v;
    return t;
}

float fma_loop_scalar(int64_t iters) {
    float acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = 1.0f + 0.01f * c;
    const float a = 1.0f - 1.0f / (1 << 20), b = 1e-6f;
    for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 16  // whole, at any -O: a rolled loop keeps acc[] in memory (half the rate)
        for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;
    float t = 0;
    for (float v : acc) t += v;
    return t;
}

}  // namespace

FmaPeak cpu_measure_fma_peak(int threads) {
    FmaPeak r;
    int lanes = 1;
    float (*loop)(int64_t) = fma_loop_scalar;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) loop = fma_loop_avx512, lanes = 16, r.isa = "avx512f";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) loop = fma_loop_avx2, lanes = 8, r.isa = "avx2+fma";
    else r.isa = "scalar";
    threads = std::max(1, threads);
    // ~0.1 s per repeat on a 3 GHz core with two FMA pipes; best of 5 (a busy host reads low).
    const int64_t iters = lanes == 1 ? 20'000'000 : 12'000'000;
    const double flops = double(iters) * kChains * lanes * 2.0 * threads;
    std::vector<float> sink(size_t(threads), 0.0f);
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
        // Plain threads, each on its own CPU: the calling rank may be bound to one core by
        // mpirun (and OpenMP's pool with it), which would stack every thread on that core.
        std::vector<std::thread> pool;
        auto t0 = std::chrono::steady_clock::now();
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                cpu_set_t one;
                CPU_ZERO(&one);
                CPU_SET(t, &one);
                pthread_setaffinity_np(pthread_self(), sizeof one, &one);  // best effort
                sink[size_t(t)] += loop(iters);
            });
        for (auto& th : pool) th.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, flops / s / 1e9);
    }
    volatile float keep = sink[0];  // the loops' results are used
    (void)keep;
    r.gflops = best;
    r.threads = threads;
    return r;
}

}  // namespace quintet
