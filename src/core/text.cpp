#include "quintet/core/text.hpp"

#include <cstdio>

namespace quintet {

std::string human_seconds(double s) {
    char buf[32];
    if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
    else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
    else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
    return buf;
}

std::string human_count(double x) {
    char buf[32];
    if (x >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
    else if (x >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", x / 1e3);
    else std::snprintf(buf, sizeof buf, "%.0f", x);
    return buf;
}

std::string json_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\', o += c;
        else if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else o += c;
    }
    return o;
}

std::string utf8_or_replacement(const std::string& s) {
    std::string o;
    o.reserve(s.size());
    const auto* u = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = 0; i < s.size();) {
        const unsigned c = u[i];
        // The length of the character c begins, and the range its second byte must be in
        // (excluding overlong forms, surrogates and code points past U+10FFFF).
        int n = 0;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) n = 1;
        else if (c >= 0xC2 && c <= 0xDF) n = 2;
        else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        bool ok = n > 0 && i + size_t(n) <= s.size();
        for (int k = 1; ok && k < n; ++k) {
            const unsigned b = u[i + size_t(k)];
            ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        }
        if (ok) {
            o.append(s, i, size_t(n));
            i += size_t(n);
        } else {
            o += "\xEF\xBF\xBD";
            ++i;
        }
    }
    return o;
}

}  // namespace quintet
