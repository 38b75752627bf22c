#include "quintet/tokenizer/byte_alphabet.hpp"

#include <array>
#include <cstdint>

namespace quintet {
namespace {

// code_point[b]: the character that stands for byte b; byte_of[cp]: the byte, or -1.
struct Alphabet {
    std::array<uint32_t, 256> code_point{};
    std::array<int, 324> byte_of{};
    Alphabet() {
        byte_of.fill(-1);
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            code_point[size_t(b)] = printable ? uint32_t(b) : next++;
            byte_of[code_point[size_t(b)]] = b;
        }
    }
};

const Alphabet& alphabet() {
    static const Alphabet a;
    return a;
}

}  // namespace

std::string byte_level_text(const std::string& bytes) {
    std::string s;
    s.reserve(bytes.size() * 2);
    for (const unsigned char c : bytes) {
        const uint32_t cp = alphabet().code_point[c];
        if (cp < 0x80) {
            s += char(cp);
        } else {  // the alphabet ends at U+0143: two UTF-8 bytes at most
            s += char(0xc0 | (cp >> 6));
            s += char(0x80 | (cp & 0x3f));
        }
    }
    return s;
}

bool byte_level_bytes(const std::string& s, std::string& out) {
    out.clear();
    const auto& table = alphabet().byte_of;
    for (size_t i = 0; i < s.size();) {
        const auto c = uint8_t(s[i]);
        uint32_t cp;
        if (c < 0x80) {
            cp = c;
            i += 1;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
            cp = (uint32_t(c & 0x1F) << 6) | (uint8_t(s[i + 1]) & 0x3F);
            i += 2;
        } else {
            return false;
        }
        if (cp >= table.size() || table[cp] < 0) return false;
        out += char(table[cp]);
    }
    return true;
}

}  // namespace quintet
