// Element-wise maths the CPU kernels vectorise: no library calls inside their loops, so that
// `#pragma omp simd` loops compile to AVX2/AVX-512 (std::exp is a scalar call in GCC without
// -ffast-math, and it was most of SwiGLU's and the softmaxes' time: docs/benchmarks.md). The
// selects below vectorise because the library is compiled with -fno-trapping-math (CMakeLists:
// it changes no result, only which FP exception flags may be raised).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace quintet::cpu {

// exp(x) in fp32 within 2 ulp of std::exp over the normal range: x = n ln2 + r with |r| <= ln2/2
// (ln2 split in two for an exact reduction), e^r by Cephes' degree-6 polynomial, 2^n through
// the exponent bits. Exactly 0 below -87.3 (e^x is then below the smallest normal float), +inf
// above 88.7, and NaN stays NaN, so masked (-inf) scores and non-finite values behave as with
// std::exp.
inline float exp_fast(float x) {
    // Branch-free (selects, not jumps), so that it vectorises inside the callers' simd loops.
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.3f ? 88.3f : xc;  // 2^n stays a normal float
    // n = round(xc / ln2) as floor(t + 128) - 128, t + 128 > 0 so truncation is floor (no
    // library call: floorf needs SSE4.1 to vectorise). Near a rounding boundary the addition may
    // pick the neighbouring n; the polynomial is as accurate there (|r| just above ln2/2).
    const int32_t i = int32_t(xc * 1.44269504088896341f + 128.5f) - 128;
    const float n = float(i);
    // Cody-Waite: n * 0.693359375 is exact (9 significant bits), so no FMA is needed and the
    // baseline x86-64 build vectorises too.
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * (r * r) + r + 1.0f;
    float y = er * std::bit_cast<float>((i + 127) << 23);
    y = x < -87.3f ? 0.0f : y;
    y = x > 88.7f ? INFINITY : y;
    y = x != x ? x : y;
    return y;
}

// max(init, x[0..n)) with std::max's rule (a NaN element is passed over). A max is exact in
// any order, so it runs eight lanes at once: GCC does not vectorise the plain std::max loop,
// even under `omp simd reduction(max)`.
inline float max_of(const float* x, int n, float init) {
    float m[8] = {init, init, init, init, init, init, init, init};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    float r = init;
    for (int l = 0; l < 8; ++l) r = m[l] > r ? m[l] : r;
    for (; i < n; ++i) r = x[i] > r ? x[i] : r;
    return r;
}

}  // namespace quintet::cpu
