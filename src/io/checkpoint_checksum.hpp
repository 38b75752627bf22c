// The checksum of a checkpoint dataset (docs/formats.md): the wrapping sum over its elements of
// a 64-bit mix of (logical index, value bits) -- float32 bits zero-extended, float64 bits whole.
// Order-independent, so each rank sums the elements it writes and one all-reduce completes it;
// any change of one element (or of where it sits) changes it. Shared by the writer and the
// verifier (io/checkpoint.cpp, io/checkpoint_writer.cpp).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace quintet::checkpoint_checksum {

inline uint64_t element_hash(uint64_t index, uint64_t bits) {
    uint64_t z = index * 0x9E3779B97F4A7C15ull + bits + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Elements first .. first + n - 1 of a float32 or float64 dataset, v[0] being element `first`:
// each element's bits (4 or 8 bytes) hashed with its index.
template <class T>
inline uint64_t run(const T* v, uint64_t first, size_t n) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "float32 or float64 elements");
    using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    uint64_t h = 0;
    for (size_t i = 0; i < n; ++i) {
        Bits bits;
        std::memcpy(&bits, v + i, sizeof(T));
        h += element_hash(first + i, bits);
    }
    return h;
}

}  // namespace quintet::checkpoint_checksum
