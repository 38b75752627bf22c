// Pure layout maths, no MPI: axis sizes in the fixed order tp, cp, dp, pp (fastest-varying
// first, so TP neighbours share a node), rank <-> coordinates, and the flat shard ranges used
// by ZeRO-1 and the collective checkpoint writer. Unit-tested exhaustively without MPI.
#pragma once
#include <array>
#include <cstddef>
#include <string>

namespace quintet {

enum Axis { kTP = 0, kCP = 1, kDP = 2, kPP = 3, kNumAxes = 4 };
const char* axis_name(int axis);

struct Layout {
    std::array<int, kNumAxes> size{1, 1, 1, 1};  // indexed by Axis

    int world() const { return size[kTP] * size[kCP] * size[kDP] * size[kPP]; }
    // rank = tp + TP*(cp + CP*(dp + DP*pp))
    int rank_of(const std::array<int, kNumAxes>& coord) const;
    std::array<int, kNumAxes> coords_of(int rank) const;
    std::string describe() const;  // "tp=2 cp=1 dp=2 pp=1"
};

// Contiguous share `part` of `n` items split over `parts`: [lo, hi). The first n % parts
// parts get one more item.
struct Range {
    size_t lo = 0, hi = 0;
    size_t size() const { return hi - lo; }
};
Range split_range(size_t n, int parts, int part);

}  // namespace quintet
