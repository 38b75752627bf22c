#include "quintet/parallel/layout.hpp"

namespace quintet {

const char* axis_name(int axis) {
    static const char* names[] = {"tp", "cp", "dp", "pp"};
    return names[axis];
}

int Layout::rank_of(const std::array<int, kNumAxes>& c) const {
    int r = 0;
    for (int a = kNumAxes - 1; a >= 0; --a) r = r * size[a] + c[a];
    return r;
}

std::array<int, kNumAxes> Layout::coords_of(int rank) const {
    std::array<int, kNumAxes> c{};
    for (int a = 0; a < kNumAxes; ++a) {
        c[a] = rank % size[a];
        rank /= size[a];
    }
    return c;
}

std::string Layout::describe() const {
    std::string s;
    for (int a = 0; a < kNumAxes; ++a)
        s += (a ? " " : "") + std::string(axis_name(a)) + "=" + std::to_string(size[a]);
    return s;
}

Range split_range(size_t n, int parts, int part) {
    size_t base = n / parts, extra = n % parts;
    size_t lo = part * base + (size_t(part) < extra ? part : extra);
    size_t hi = lo + base + (size_t(part) < extra ? 1 : 0);
    return {lo, hi};
}

}  // namespace quintet
