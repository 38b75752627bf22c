// bf16 <-> fp32 on the host, bit-exact with CUDA's __float2bfloat16_rn / __bfloat162float for
// every finite value and infinity: bf16 is the upper 16 bits of an fp32, rounded to nearest,
// ties to even. Used by the CPU backend's bf16 path and by tests.
#pragma once
#include <cstdint>
#include <cstring>

namespace quintet {

inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

inline float bf16_to_float(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// The fp32 value nearest to what bf16 storage keeps of f.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace quintet
