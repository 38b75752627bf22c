// Element-wise maths the CPU kernels vectorise: no library calls inside their loops, so that
// `#pragma omp simd` loops compile to AVX2/AVX-512 (std::exp is a scalar call in GCC without
// -ffast-math, and it was most of SwiGLU's and the softmaxes' time: docs/benchmarks.md).
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
#pragma omp declare simd
inline float exp_fast(float x) {
    const float xc = std::fmin(std::fmax(x, -87.3f), 88.3f);  // 2^n stays a normal float
    const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
    float r = std::fma(n, -0.693359375f, xc);
    r = std::fma(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = std::fma(p, r, 1.3981999507e-3f);
    p = std::fma(p, r, 8.3334519073e-3f);
    p = std::fma(p, r, 4.1665795894e-2f);
    p = std::fma(p, r, 1.6666665459e-1f);
    p = std::fma(p, r, 5.0000001201e-1f);
    const float er = std::fma(p, r * r, r) + 1.0f;
    const float y = er * std::bit_cast<float>((int32_t(n) + 127) << 23);
    return x < -87.3f ? 0.0f : x > 88.7f ? INFINITY : x != x ? x : y;
}

}  // namespace quintet::cpu
