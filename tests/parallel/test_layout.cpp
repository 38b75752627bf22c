// The rank <-> coordinates <-> groups maths of Layout, exhaustively: every (tp, cp, dp, pp, ep)
// layout of up to 64 ranks. Every group is a partition of the world with the right sizes and
// ranks, tp neighbours are consecutive world ranks (so they share a node), and the ep/edp groups
// follow the numbering of docs/parallelism.md ("Expert parallelism") inside each dp x cp
// block. No MPI.
#include <gtest/gtest.h>

#include <set>

#include "quintet/core/error.hpp"
#include "quintet/parallel/layout.hpp"

using namespace quintet;

namespace {

std::vector<Layout> all_layouts(int max_world) {
    std::vector<Layout> out;
    for (int tp = 1; tp <= max_world; ++tp)
        for (int cp = 1; tp * cp <= max_world; ++cp)
            for (int dp = 1; tp * cp * dp <= max_world; ++dp)
                for (int pp = 1; tp * cp * dp * pp <= max_world; ++pp)
                    for (int ep = 1; ep <= dp * cp; ++ep) {
                        if ((dp * cp) % ep) continue;
                        Layout l;
                        l.size = {tp, cp, dp, pp};
                        l.ep = ep;
                        out.push_back(l);
                    }
    return out;
}

const Group kGroups[] = {Group::tp, Group::cp, Group::dp, Group::pp,
                         Group::dp_cp, Group::ep, Group::edp, Group::world};

void check_layout(const Layout& l) {
    const int W = l.world();
    SCOPED_TRACE(l.describe());
    // Coordinates: a bijection, tp fastest.
    for (int r = 0; r < W; ++r) {
        Coords c = l.coords_of(r);
        ASSERT_EQ(l.rank_of(c), r);
        for (int a = 0; a < kNumAxes; ++a) ASSERT_LT(c[a], l.size[a]);
        if (r + 1 < W && c[kTP] + 1 < l.size[kTP]) ASSERT_EQ(l.coords_of(r + 1)[kTP], c[kTP] + 1);
    }
    for (Group g : kGroups) {
        SCOPED_TRACE(group_name(g));
        const int n = l.group_size(g);
        ASSERT_EQ(W % n, 0);
        std::vector<int> seen(size_t(W), 0);
        std::set<int> colors;
        for (int r = 0; r < W; ++r) {
            auto m = l.group_members(g, r);
            ASSERT_EQ(int(m.size()), n);
            // r is in its own group, at its group rank; every member agrees on the member list.
            ASSERT_EQ(m[size_t(l.group_rank(g, r))], r);
            for (int x : m) {
                ASSERT_GE(x, 0);
                ASSERT_EQ(l.group_color(g, x), l.group_color(g, r));
            }
            if (colors.insert(l.group_color(g, r)).second)
                for (int x : m) ++seen[size_t(x)];
        }
        // A partition: every rank in exactly one group, W/n groups.
        for (int r = 0; r < W; ++r) ASSERT_EQ(seen[size_t(r)], 1) << "rank " << r;
        ASSERT_EQ(int(colors.size()), W / n);
    }
    for (int r = 0; r < W; ++r) {
        const Coords c = l.coords_of(r);
        // Axis groups vary one coordinate only, in its order.
        for (int a = 0; a < kNumAxes; ++a) {
            auto m = l.group_members(Group(a), r);
            for (int i = 0; i < int(m.size()); ++i) {
                Coords d = l.coords_of(m[size_t(i)]);
                for (int b = 0; b < kNumAxes; ++b) ASSERT_EQ(d[b], b == a ? i : c[b]);
            }
        }
        // TP neighbours share a node: the tp group is a block of consecutive world ranks.
        auto tp = l.group_members(Group::tp, r);
        for (int i = 0; i < int(tp.size()); ++i) ASSERT_EQ(tp[size_t(i)], tp[0] + i);
        // dp x cp: same (tp, pp), index j = dp*CP + cp.
        auto dc = l.group_members(Group::dp_cp, r);
        for (int j = 0; j < int(dc.size()); ++j) {
            Coords d = l.coords_of(dc[size_t(j)]);
            ASSERT_EQ(d[kTP], c[kTP]);
            ASSERT_EQ(d[kPP], c[kPP]);
            ASSERT_EQ(d[kDP] * l.size[kCP] + d[kCP], j);
        }
        // ep: the j with the same j div ep, by j mod ep; edp: the same j mod ep, by j div ep.
        const int j = l.dp_cp_index(r);
        auto ep = l.group_members(Group::ep, r);
        auto edp = l.group_members(Group::edp, r);
        ASSERT_EQ(int(ep.size()) * int(edp.size()), int(dc.size()));
        for (int e = 0; e < int(ep.size()); ++e) ASSERT_EQ(ep[size_t(e)], dc[size_t((j / l.ep) * l.ep + e)]);
        for (int k = 0; k < int(edp.size()); ++k) ASSERT_EQ(edp[size_t(k)], dc[size_t(k * l.ep + j % l.ep)]);
        ASSERT_EQ(l.group_rank(Group::ep, r), j % l.ep);
        ASSERT_EQ(l.group_rank(Group::edp, r), j / l.ep);
        // An ep group and an edp group of one dp x cp block meet in exactly one rank.
        int common = 0;
        for (int x : ep)
            for (int y : edp) common += x == y;
        ASSERT_EQ(common, 1);
    }
}

TEST(Layout, EveryLayoutUpTo64Ranks) {
    auto layouts = all_layouts(64);
    EXPECT_GT(layouts.size(), 3000u);
    for (const auto& l : layouts) {
        check_layout(l);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(Layout, KnownRanks) {
    Layout l = make_layout(16, 2, 2, 2, 0, 2);  // dp = 2
    EXPECT_EQ(l.size[kDP], 2);
    EXPECT_EQ(l.describe(), "tp=2 cp=2 dp=2 pp=2 ep=2");
    // rank 13 = tp 1, cp 0, dp 1, pp 1: j = 1*2 + 0 = 2 -> ep rank 0, edp rank 1.
    EXPECT_EQ(l.coords_of(13), (Coords{1, 0, 1, 1}));
    EXPECT_EQ(l.dp_cp_index(13), 2);
    EXPECT_EQ(l.group_members(Group::dp_cp, 13), (std::vector<int>{9, 11, 13, 15}));
    EXPECT_EQ(l.group_members(Group::ep, 13), (std::vector<int>{13, 15}));
    EXPECT_EQ(l.group_members(Group::edp, 13), (std::vector<int>{9, 13}));
    EXPECT_EQ(l.group_members(Group::pp, 13), (std::vector<int>{5, 13}));
}

TEST(Layout, BadLayoutsNameTheKey) {
    auto msg = [](auto f) {
        try {
            f();
        } catch (const ConfigError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(msg([] { make_layout(6, 4, 1, 1, 0, 1); }).find("parallel.tp*cp*pp"), std::string::npos);
    EXPECT_NE(msg([] { make_layout(8, 2, 1, 1, 3, 1); }).find("parallel.dp"), std::string::npos);
    EXPECT_NE(msg([] { make_layout(8, 2, 1, 1, 0, 3); }).find("parallel.ep"), std::string::npos);
    EXPECT_NE(msg([] { make_layout(8, 2, 1, 1, 0, 3); }).find("dp*cp = 4"), std::string::npos);
    EXPECT_EQ(msg([] { make_layout(8, 2, 2, 1, 0, 2); }), "no error");
}

TEST(Layout, SplitRangeCoversEverythingOnce) {
    for (size_t n : {0u, 1u, 7u, 64u, 1001u})
        for (int parts = 1; parts <= 9; ++parts) {
            size_t next = 0;
            for (int p = 0; p < parts; ++p) {
                Range r = split_range(n, parts, p);
                EXPECT_EQ(r.lo, next);
                EXPECT_LE(r.size(), n / parts + 1);
                next = r.hi;
            }
            EXPECT_EQ(next, n);
        }
}

}  // namespace
