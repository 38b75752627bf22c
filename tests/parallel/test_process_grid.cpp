// ProcessGrid on 8 ranks: for several layouts, every group's MPI communicator holds exactly the
// world ranks Layout's maths says, in its order, and carries the deadline it was given.
// ctest: labels=mpi ranks=8
#include <gtest/gtest.h>
#include <mpi.h>

#include "quintet/parallel/process_grid.hpp"

using namespace quintet;

namespace {

std::vector<int> world_ranks(const MpiCommunicator& c) {
    MPI_Group g, w;
    MPI_Comm_group(c.handle(), &g);
    MPI_Comm_group(MPI_COMM_WORLD, &w);
    std::vector<int> local(size_t(c.size())), out(local.size());
    for (int i = 0; i < c.size(); ++i) local[size_t(i)] = i;
    MPI_Group_translate_ranks(g, c.size(), local.data(), w, out.data());
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    return out;
}

TEST(ProcessGrid, GroupsAreLayoutsGroups) {
    int world = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ASSERT_EQ(world, 8);
    // (tp, cp, pp, dp = 0: the rest, ep)
    const int layouts[][4] = {{2, 2, 1, 2}, {1, 2, 1, 4}, {2, 1, 2, 2}, {1, 1, 1, 8}, {1, 4, 2, 2}, {8, 1, 1, 1}};
    for (const auto& l : layouts) {
        const Layout layout = make_layout(world, l[0], l[1], l[2], 0, l[3]);
        ProcessGrid grid(MpiCommunicator(MPI_COMM_WORLD), layout, 12.5);
        SCOPED_TRACE(layout.describe());
        for (int g = 0; g < kNumGroups; ++g) {
            const MpiCommunicator& c = grid.comm(Group(g));
            EXPECT_EQ(world_ranks(c), layout.group_members(Group(g), rank)) << group_name(Group(g));
            EXPECT_EQ(c.rank(), layout.group_rank(Group(g), rank)) << group_name(Group(g));
            EXPECT_EQ(c.name(), group_name(Group(g)));
            EXPECT_EQ(c.deadline(), 12.5);
        }
        EXPECT_NE(grid.watchdog(), nullptr);
    }
}

}  // namespace
