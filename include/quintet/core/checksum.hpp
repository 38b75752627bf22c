// A streaming 64-bit checksum of bytes (token shards, docs/data.md "The manifest"): the same value
// however the bytes are cut into calls. Not cryptographic: it catches corruption, not tampering.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace quintet {

class Checksum {
public:
    void update(const void* data, size_t n);
    uint64_t value() const;
    static std::string hex(uint64_t v);  // 16 lower-case hex digits

private:
    uint64_t h_ = 0x9E3779B97F4A7C15ull, carry_ = 0, total_ = 0;
    int n_carry_ = 0;
};

}  // namespace quintet
