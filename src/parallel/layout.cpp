#include "quintet/parallel/layout.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

const char* axis_name(int axis) {
    static const char* names[] = {"tp", "cp", "dp", "pp"};
    return names[axis];
}

const char* group_name(Group g) {
    static const char* names[] = {"tp", "cp", "dp", "pp", "dp_cp", "ep", "edp", "world"};
    return names[int(g)];
}

int Layout::rank_of(const Coords& c) const {
    int r = 0;
    for (int a = kNumAxes - 1; a >= 0; --a) r = r * size[a] + c[a];
    return r;
}

Coords Layout::coords_of(int rank) const {
    Coords c{};
    for (int a = 0; a < kNumAxes; ++a) {
        c[a] = rank % size[a];
        rank /= size[a];
    }
    return c;
}

int Layout::dp_cp_index(int rank) const {
    const Coords c = coords_of(rank);
    return c[kDP] * size[kCP] + c[kCP];
}

int Layout::group_size(Group g) const {
    switch (g) {
    case Group::tp: return size[kTP];
    case Group::cp: return size[kCP];
    case Group::dp: return size[kDP];
    case Group::pp: return size[kPP];
    case Group::dp_cp: return size[kDP] * size[kCP];
    case Group::ep: return ep;
    case Group::edp: return edp();
    case Group::world: return world();
    }
    return 0;
}

int Layout::group_rank(Group g, int rank) const {
    const Coords c = coords_of(rank);
    switch (g) {
    case Group::tp: return c[kTP];
    case Group::cp: return c[kCP];
    case Group::dp: return c[kDP];
    case Group::pp: return c[kPP];
    case Group::dp_cp: return dp_cp_index(rank);
    case Group::ep: return dp_cp_index(rank) % ep;
    case Group::edp: return dp_cp_index(rank) / ep;
    case Group::world: return rank;
    }
    return 0;
}

int Layout::group_color(Group g, int rank) const {
    const Coords c = coords_of(rank);
    // The coordinates a group does not vary over, flattened; ep/edp add the part of j that
    // stays fixed inside the group.
    const int tp_pp = c[kTP] + size[kTP] * c[kPP];
    const int j = dp_cp_index(rank);
    switch (g) {
    case Group::tp: return c[kCP] + size[kCP] * (c[kDP] + size[kDP] * c[kPP]);
    case Group::cp: return c[kTP] + size[kTP] * (c[kDP] + size[kDP] * c[kPP]);
    case Group::dp: return c[kTP] + size[kTP] * (c[kCP] + size[kCP] * c[kPP]);
    case Group::pp: return c[kTP] + size[kTP] * (c[kCP] + size[kCP] * c[kDP]);
    case Group::dp_cp: return tp_pp;
    case Group::ep: return tp_pp * edp() + j / ep;
    case Group::edp: return tp_pp * ep + j % ep;
    case Group::world: return 0;
    }
    return 0;
}

std::vector<int> Layout::group_members(Group g, int rank) const {
    const int n = group_size(g);
    std::vector<int> out(size_t(n), -1);
    const int color = group_color(g, rank);
    for (int r = 0; r < world(); ++r)
        if (group_color(g, r) == color) out[size_t(group_rank(g, r))] = r;
    return out;
}

std::string Layout::describe() const {
    std::string s;
    for (int a = 0; a < kNumAxes; ++a)
        s += (a ? " " : "") + std::string(axis_name(a)) + "=" + std::to_string(size[a]);
    if (ep > 1) s += " ep=" + std::to_string(ep);
    return s;
}

Layout make_layout(int world, int tp, int cp, int pp, int dp, int ep) {
    auto S = [](long v) { return std::to_string(v); };
    const long axes = long(tp) * cp * pp;
    if (axes <= 0 || world % axes != 0)
        config_fail("parallel.tp*cp*pp", S(axes),
                    "must divide the world size " + S(world) + " (tp=" + S(tp) + ", cp=" + S(cp) +
                        ", pp=" + S(pp) + ")");
    const int auto_dp = int(world / axes);
    const int d = dp == 0 ? auto_dp : dp;
    if (long(d) * axes != world)
        config_fail("parallel.dp", S(dp),
                    "dp*tp*cp*pp = " + S(long(d) * axes) + " must equal the world size " + S(world) +
                        " (valid: " + S(auto_dp) + ", or 0 for what the other axes leave)");
    if (ep < 1 || (d * cp) % ep != 0)
        config_fail("parallel.ep", S(ep),
                    "must divide dp*cp = " + S(long(d) * cp) +
                        " (expert-parallel groups are carved out of the dp x cp ranks)");
    Layout l;
    l.size[kTP] = tp;
    l.size[kCP] = cp;
    l.size[kDP] = d;
    l.size[kPP] = pp;
    l.ep = ep;
    return l;
}

Range split_range(size_t n, int parts, int part) {
    size_t base = n / parts, extra = n % parts;
    size_t lo = part * base + (size_t(part) < extra ? part : extra);
    size_t hi = lo + base + (size_t(part) < extra ? 1 : 0);
    return {lo, hi};
}

}  // namespace quintet
