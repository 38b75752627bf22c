// The straggler report's bookkeeping (train/stragglers.hpp) on figures made up for it: a rank is
// named after kStepsInRow steps over the ratio against the median of its stage's other ranks,
// never against ranks of other stages, never without peers; the run's ratio, the repeat on a log
// step, the line when it ends, and the end-of-run table.
#include <gtest/gtest.h>

#include "quintet/train/stragglers.hpp"

using namespace quintet;

namespace {

// 8 ranks: pp = 2 stages of 4 (stage = rank / 4); rank 7 alone would have no peers in pp = 8.
std::vector<StragglerRank> ranks(int n, int per_stage) {
    std::vector<StragglerRank> v(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
        v[size_t(r)].host = "node" + std::to_string(r / 4);
        v[size_t(r)].where = "pp stage " + std::to_string(r / per_stage);
        v[size_t(r)].group = r / per_stage;
    }
    return v;
}

size_t count(const std::vector<std::string>& lines, const std::string& needle) {
    size_t n = 0;
    for (const auto& l : lines) n += l.find(needle) != std::string::npos;
    return n;
}

}  // namespace

TEST(StragglerReport, NamesTheSlowRankAfterStepsInARow) {
    StragglerReport rep(ranks(8, 4), 1.2);
    // Stage 1 is twice as slow as stage 0 (other work): nobody is named for that.
    std::vector<double> compute = {1, 1, 1, 1, 2, 2, 2, 2}, wait(8, 0.1);
    std::vector<std::string> all;
    for (int s = 0; s < 10; ++s) {
        auto lines = rep.observe(s, compute.data(), wait.data(), false);
        all.insert(all.end(), lines.begin(), lines.end());
    }
    EXPECT_TRUE(all.empty()) << all.front();
    // Rank 5 at 1.5x its stage: named at the 5th step in a row, with host and place, not before.
    compute[5] = 3.0;
    for (int s = 0; s < StragglerReport::kStepsInRow - 1; ++s)
        EXPECT_TRUE(rep.observe(s, compute.data(), wait.data(), false).empty());
    auto lines = rep.observe(0, compute.data(), wait.data(), false);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0], "straggler: rank 5 (host node1, pp stage 1) computes 1.50x the median of its peers for 5 steps");
    EXPECT_DOUBLE_EQ(rep.ratio(5), 1.5);
    // Quiet until a log step, then said again with the run's length.
    EXPECT_TRUE(rep.observe(0, compute.data(), wait.data(), false).empty());
    lines = rep.observe(0, compute.data(), wait.data(), true);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("1.50x the median of its peers for 7 steps"), std::string::npos) << lines[0];
    // Back to normal: one step is forgiven, the second ends it with one line, then nothing.
    compute[5] = 2.0;
    EXPECT_TRUE(rep.observe(0, compute.data(), wait.data(), false).empty());
    lines = rep.observe(0, compute.data(), wait.data(), true);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("rank 5 (host node1, pp stage 1) is back within 1.20x"), std::string::npos) << lines[0];
    EXPECT_TRUE(rep.observe(0, compute.data(), wait.data(), true).empty());
    // One step at the peers' pace inside a run (a peer's hiccup) is forgiven: 4 + 1 slow steps
    // around it name the rank, over the 6 steps, at the average ratio of all 6.
    for (int s = 0; s < 4; ++s) {
        compute[2] = 1.5;
        EXPECT_TRUE(rep.observe(0, compute.data(), wait.data(), false).empty());
    }
    compute[2] = 1.0;
    EXPECT_TRUE(rep.observe(0, compute.data(), wait.data(), false).empty());
    compute[2] = 1.5;
    lines = rep.observe(0, compute.data(), wait.data(), false);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0], "straggler: rank 2 (host node0, pp stage 0) computes 1.42x the median of its peers for 6 steps");
    // Two at its peers' pace end a run that was not named yet, silently; the count starts again.
    compute[3] = 1.5;
    for (int s = 0; s < 4; ++s) rep.observe(0, compute.data(), wait.data(), false);
    compute[3] = 1.0;
    EXPECT_EQ(count(rep.observe(0, compute.data(), wait.data(), false), "rank 3"), 0u);
    EXPECT_EQ(count(rep.observe(0, compute.data(), wait.data(), false), "rank 3"), 0u);
    compute[3] = 1.5;
    for (int s = 0; s < 4; ++s) EXPECT_EQ(count(rep.observe(0, compute.data(), wait.data(), false), "rank 3"), 0u);
    EXPECT_EQ(count(rep.observe(0, compute.data(), wait.data(), false), "straggler: rank 3 "), 1u);
}

TEST(StragglerReport, BelowTheRatioOrWithoutPeersNobodyIsNamed) {
    // 1.19x of its peers at ratio 1.2, for long: not named.
    StragglerReport rep(ranks(4, 4), 1.2);
    std::vector<double> compute = {1.19, 1, 1, 1}, wait(4, 0);
    for (int s = 0; s < 50; ++s) EXPECT_TRUE(rep.observe(s, compute.data(), wait.data(), true).empty());
    // One rank per stage (pp only): no one does its work, so no one is compared.
    StragglerReport alone(ranks(4, 1), 1.2);
    compute = {5, 1, 1, 1};
    for (int s = 0; s < 50; ++s) EXPECT_TRUE(alone.observe(s, compute.data(), wait.data(), true).empty());
    EXPECT_EQ(alone.ratio(0), 0.0);
    // Two ranks: the other one is the median.
    StragglerReport two(ranks(2, 2), 1.2);
    compute = {1.0, 2.0};
    std::vector<std::string> lines;
    for (int s = 0; s < 5; ++s) lines = two.observe(s, compute.data(), wait.data(), false);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("rank 1 (host node0, pp stage 0) computes 2.00x"), std::string::npos) << lines[0];
}

TEST(StragglerReport, SummaryOrdersRanksByComputeTime) {
    StragglerReport rep(ranks(16, 8), 1.2);
    std::vector<double> compute(16, 1.0), wait(16, 0.5);
    compute[11] = 2.0, compute[3] = 0.5;
    wait[11] = 0.0;
    EXPECT_TRUE(rep.summary().empty());
    for (int s = 0; s < 3; ++s) rep.observe(s, compute.data(), wait.data(), false);
    const auto table = rep.summary(6);
    ASSERT_EQ(table.size(), 2u + 6 + 1);  // header, column names, 5 slowest, "...", the fastest
    EXPECT_NE(table[0].find("mean of 3 step(s)"), std::string::npos) << table[0];
    EXPECT_NE(table[2].find("    11  node2"), std::string::npos) << table[2];
    EXPECT_NE(table[2].find("2.0000"), std::string::npos) << table[2];
    EXPECT_NE(table[2].find("2.00x"), std::string::npos) << table[2];
    EXPECT_NE(table[7].find("10 rank(s) between"), std::string::npos) << table[7];
    EXPECT_NE(table[8].find("     3  node0"), std::string::npos) << table[8];
    EXPECT_NE(table[8].find("0.50x"), std::string::npos) << table[8];
}

TEST(StragglerReport, MedianOfPeers) {
    std::vector<double> v = {3, 1, 2};
    EXPECT_EQ(median_of(v), 2.0);
    v = {4, 1, 3, 2};
    EXPECT_EQ(median_of(v), 2.5);
    v = {};
    EXPECT_EQ(median_of(v), 0.0);
}
