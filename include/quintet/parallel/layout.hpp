// Pure layout maths, no MPI (a CMake check compiles it with only include/ on the path): the
// four Cartesian axes in the fixed order tp, cp, dp, pp (fastest-varying first, so TP
// neighbours share a node), rank <-> coordinates, the groups built from them -- one per axis,
// dp x cp (the replica group of dense gradients), and the expert-parallel (ep) and
// expert-data-parallel (edp) groups carved out of dp x cp as in Megatron-Core
// (docs/parallelism.md, "Expert parallelism") -- and the flat shard ranges used by ZeRO-1 and
// the checkpoint writer.
// Unit-tested exhaustively (tests/parallel/test_layout.cpp); ProcessGrid builds the MPI
// communicators from it and checks that MPI agrees.
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace quintet {

enum Axis { kTP = 0, kCP = 1, kDP = 2, kPP = 3, kNumAxes = 4 };
const char* axis_name(int axis);  // "tp", "cp", "dp", "pp"

// Every communicator a rank needs. The first four are the Cartesian axes.
enum class Group { tp, cp, dp, pp, dp_cp, ep, edp, world };
constexpr int kNumGroups = 8;
const char* group_name(Group g);  // "tp", ..., "dp_cp", "ep", "edp", "world"

using Coords = std::array<int, kNumAxes>;  // indexed by Axis

struct Layout {
    std::array<int, kNumAxes> size{1, 1, 1, 1};  // indexed by Axis
    int ep = 1;                                  // divides size[kDP] * size[kCP]

    int world() const { return size[kTP] * size[kCP] * size[kDP] * size[kPP]; }
    // rank = tp + TP*(cp + CP*(dp + DP*pp))
    int rank_of(const Coords& coord) const;
    Coords coords_of(int rank) const;

    // Position j of a rank among the dp x cp ranks of its (tp, pp): j = dp*CP + cp (cp fastest).
    // ep rank = j mod ep, edp rank = j div ep (docs/parallelism.md, "Expert parallelism").
    int dp_cp_index(int rank) const;
    int edp() const { return size[kDP] * size[kCP] / ep; }

    int group_size(Group g) const;
    // This rank's index inside its group g (the rank it has in that group's communicator).
    int group_rank(Group g, int rank) const;
    // The world ranks of rank's group g, ordered by their index in the group.
    std::vector<int> group_members(Group g, int rank) const;
    // A number shared by exactly the ranks of one group g (MPI_Comm_split's colour).
    int group_color(Group g, int rank) const;

    std::string describe() const;  // "tp=2 cp=1 dp=2 pp=1" (+ " ep=2" when ep > 1)
};

// The layout of `world` ranks from the deck's [parallel] sizes (dp = 0: what the others leave).
// Throws ConfigError naming the key, the value and what would be valid when the sizes do not
// multiply to the world size or ep does not divide dp*cp.
Layout make_layout(int world, int tp, int cp, int pp, int dp, int ep);

// Contiguous share `part` of `n` items split over `parts`: [lo, hi). The first n % parts
// parts get one more item.
struct Range {
    size_t lo = 0, hi = 0;
    size_t size() const { return hi - lo; }
};
Range split_range(size_t n, int parts, int part);

}  // namespace quintet
