#include "quintet/core/lists.hpp"

#include <charconv>

namespace quintet {

std::vector<std::string> split_list(std::string_view s, char sep) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= s.size()) {
        size_t end = s.find(sep, at);
        if (end == std::string_view::npos) end = s.size();
        std::string_view item = s.substr(at, end - at);
        const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        if (a != std::string_view::npos) out.emplace_back(item.substr(a, b - a + 1));
        at = end + 1;
    }
    return out;
}

namespace {
bool whole_int(std::string_view s, int* v) {
    if (s.empty()) return false;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
    return ec == std::errc() && p == s.data() + s.size();
}
}  // namespace

std::optional<std::vector<int>> parse_int_list(std::string_view s, bool ranges) {
    std::vector<int> out;
    const std::vector<std::string> items = split_list(s, ',');
    // An empty item between commas ("1,,2") is an error, not something to skip.
    size_t commas = 0;
    for (char c : s) commas += c == ',';
    if (items.empty() || items.size() != commas + 1) return std::nullopt;
    for (const std::string& item : items) {
        const size_t dash = ranges ? item.find('-', 1) : std::string::npos;  // not a leading minus
        int a = 0, b = 0;
        if (dash == std::string::npos) {
            if (!whole_int(item, &a)) return std::nullopt;
            out.push_back(a);
            continue;
        }
        if (!whole_int(item.substr(0, dash), &a) || !whole_int(item.substr(dash + 1), &b) || b < a)
            return std::nullopt;
        if (int64_t(b) - a > (1 << 24)) return std::nullopt;  // not a list anyone means
        for (int v = a; v <= b; ++v) out.push_back(v);
    }
    return out;
}

}  // namespace quintet
