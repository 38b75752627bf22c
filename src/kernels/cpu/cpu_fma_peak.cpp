// The CPU's fp32 FMA peak, measured: the denominator of MFU (docs/math.md §1.4).
//
// One core's peak is (FMA units) x (lanes per vector) x 2 flops x clock. Rather than trust a
// table of CPUs, run that loop: 12 independent accumulator chains per thread (enough to cover
// the FMA latency of 4-5 cycles on two pipes), each `acc = acc * a + b`, with the widest vector
// unit the CPU reports at run time (AVX-512, AVX2+FMA, else scalar), so a portable build still
// measures the host's own peak. Values stay finite: a = 1 - 2^-20 shrinks the accumulators
// towards b / (1 - a), never to a denormal.
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

namespace {

// The highest cpuinfo_max_freq (kHz) of any CPU, in GHz; 0 without cpufreq (most virtual machines).
double cpufreq_max_ghz() {
    double best = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/cpu", ec)) {
        std::ifstream f(e.path() / "cpufreq/cpuinfo_max_freq");
        double khz = 0;
        if (f >> khz) best = std::max(best, khz / 1e6);
    }
    return best;
}

// CPUID leaf 0x16 (Intel since Skylake): the maximum frequency in MHz, as GHz; 0 when absent.
double cpuid_max_ghz() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 0x16) return 0;
    __cpuid_count(0x16, 0, a, b, c, d);
    return b > 0 ? b / 1000.0 : 0;
}

// The brand string's "@ 2.30GHz" (Intel names its base clock there); 0 when absent.
double brand_ghz() {
    unsigned r[12] = {0};
    if (__get_cpuid_max(0x80000000, nullptr) < 0x80000004) return 0;
    for (unsigned i = 0; i < 3; ++i) __cpuid(0x80000002 + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
    const std::string brand(reinterpret_cast<const char*>(r), sizeof r);
    const size_t at = brand.find('@');
    double ghz = 0;
    if (at != std::string::npos && std::sscanf(brand.c_str() + at + 1, " %lfGHz", &ghz) == 1) return ghz;
    return 0;
}

// The highest "cpu MHz" of /proc/cpuinfo (the current clock; a virtual machine's nominal one), GHz.
double proc_cpuinfo_ghz() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    double best = 0;
    while (std::getline(f, line))
        if (line.rfind("cpu MHz", 0) == 0) {
            const size_t colon = line.find(':');
            if (colon != std::string::npos) best = std::max(best, std::atof(line.c_str() + colon + 1) / 1000.0);
        }
    return best;
}

}  // namespace

FmaCeiling cpu_fma_ceiling() {
    FmaCeiling c;
    __builtin_cpu_init();
    c.lanes = __builtin_cpu_supports("avx512f") ? 16 : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 8 : 4;
    if (const double g = cpufreq_max_ghz(); g > 0) {
        c.ghz = g, c.allowance = 1.3, c.clock_from = "cpufreq cpuinfo_max_freq";
    } else if (const double g2 = cpuid_max_ghz(); g2 > 0) {
        c.ghz = g2, c.allowance = 1.3, c.clock_from = "CPUID leaf 0x16";
    } else {
        // A base or current clock only: the larger of the two, with room for turbo.
        const double b = brand_ghz(), p = proc_cpuinfo_ghz();
        c.ghz = std::max(b, p), c.allowance = 2;
        c.clock_from = b >= p ? "the CPU's brand string" : "/proc/cpuinfo";
    }
    c.gflops_per_core = c.ghz * c.allowance * c.fma_units * c.lanes * 2;
    return c;
}

std::string FmaCeiling::describe() const {
    if (gflops_per_core <= 0) return "no clock reported: not bounded";
    char b[256];
    std::snprintf(b, sizeof b, "%d FMA units x %d lanes x 2 flops x %.2f GHz (%s) x %.1f (%s)", fma_units, lanes, ghz,
                  clock_from.c_str(), allowance, allowance > 1.5 ? "turbo" : "boost");
    return b;
}

}  // namespace quintet
