#include "quintet/core/checksum.hpp"

#include <cstdio>
#include <cstring>

namespace quintet {

namespace {

uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t step(uint64_t h, uint64_t w) {
    h = (h ^ mix(w)) * 0x100000001B3ull;
    return (h << 31) | (h >> 33);
}

}  // namespace

// Eight bytes at a time, little-endian (a partial word is carried to the next call); the length
// is folded in at the end.
void Checksum::update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    while (n > 0 && n_carry_ > 0) {
        carry_ |= uint64_t(*p++) << (8 * n_carry_);
        --n;
        if (++n_carry_ == 8) {
            h_ = step(h_, carry_);
            carry_ = 0, n_carry_ = 0;
        }
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h_ = step(h_, w);
    }
    for (; n > 0; --n) carry_ |= uint64_t(*p++) << (8 * n_carry_++);
}

uint64_t Checksum::value() const { return mix(step(h_, carry_ ^ (uint64_t(n_carry_) << 56)) ^ total_); }

std::string Checksum::hex(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

}  // namespace quintet
