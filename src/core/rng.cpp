#include "quintet/core/rng.hpp"

#include <cmath>

namespace quintet {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
    uint64_t p = uint64_t(a) * uint64_t(b);
    hi = uint32_t(p >> 32);
    lo = uint32_t(p);
}
}  // namespace

void Philox::block(uint64_t ctr_lo, uint64_t ctr_hi, uint32_t out[4]) const {
    uint32_t c0 = uint32_t(ctr_lo), c1 = uint32_t(ctr_lo >> 32);
    uint32_t c2 = uint32_t(ctr_hi), c3 = uint32_t(ctr_hi >> 32);
    uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
    for (int r = 0; r < 10; ++r) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(kM0, c0, hi0, lo0);
        mulhilo(kM1, c2, hi1, lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += kW0;
        k1 += kW1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

float Philox::normal(uint64_t i) const {
    uint32_t w[4];
    block(i, 0, w);
    // 53-bit uniforms from two words each; u1 in (0, 1] so log() is finite.
    double u1 = ((uint64_t(w[0]) << 21 ^ (w[1] >> 11)) + 1.0) / 9007199254740992.0;
    double u2 = (uint64_t(w[2]) << 21 ^ (w[3] >> 11)) / 9007199254740992.0;
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

double Philox::uniform(uint64_t i, uint64_t sub) const {
    uint32_t w[4];
    block(i, sub, w);
    return (uint64_t(w[0]) << 21 ^ (w[1] >> 11)) / 9007199254740992.0;
}

uint64_t stream_key(uint64_t seed, std::string_view name) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : name) {
        h ^= c;
        h *= 1099511628211ull;
    }
    // splitmix64 finaliser over (h, seed)
    uint64_t z = h ^ (seed + 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace quintet
