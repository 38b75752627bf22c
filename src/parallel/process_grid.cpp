#include "quintet/parallel/process_grid.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

ProcessGrid::ProcessGrid(MPI_Comm world, const Layout& layout, double deadline_s)
    : layout_(layout), deadline_s_(deadline_s) {
    int wsize = 0, wrank = 0;
    QUINTET_MPI(MPI_Comm_size(world, &wsize));
    QUINTET_MPI(MPI_Comm_rank(world, &wrank));
    if (deadline_s > 0) watchdog_ = std::make_shared<Watchdog>(wrank);
    QUINTET_CHECK(wsize == layout.world(), "the layout " + layout.describe() + " needs " +
                                               std::to_string(layout.world()) + " ranks, the world has " +
                                               std::to_string(wsize));
    // MPI orders Cartesian ranks row-major (last dim fastest): dims = {pp, dp, cp, tp}.
    int dims[kNumAxes], periods[kNumAxes] = {0, 0, 0, 0};
    for (int a = 0; a < kNumAxes; ++a) dims[kNumAxes - 1 - a] = layout.size[a];
    MPI_Comm cart;
    QUINTET_MPI(MPI_Cart_create(world, kNumAxes, dims, periods, /*reorder=*/0, &cart));
    auto make = [&](Group g, MPI_Comm c) {
        auto comm = std::make_unique<MpiCommunicator>(c, group_name(g), deadline_s_, watchdog_);
        QUINTET_CHECK(comm->size() == layout_.group_size(g) &&
                          (g == Group::world || comm->rank() == layout_.group_rank(g, rank_)),
                      std::string("MPI's ") + group_name(g) + " communicator differs from Layout's");
        groups_[size_t(g)] = std::move(comm);
    };
    QUINTET_MPI(MPI_Comm_rank(cart, &rank_));
    make(Group::world, cart);
    int c[kNumAxes];
    QUINTET_MPI(MPI_Cart_coords(cart, rank_, kNumAxes, c));
    for (int a = 0; a < kNumAxes; ++a) coords_[a] = c[kNumAxes - 1 - a];
    QUINTET_CHECK(layout_.rank_of(coords_) == rank_, "Cartesian rank order differs from Layout");
    for (int a = 0; a < kNumAxes; ++a) {
        int keep[kNumAxes] = {0, 0, 0, 0};
        keep[kNumAxes - 1 - a] = 1;
        MPI_Comm sub;
        QUINTET_MPI(MPI_Cart_sub(cart, keep, &sub));
        make(Group(a), sub);
    }
    // dp x cp: rank in it = dp*CP + cp, as Layout numbers it (MPI keeps row-major order).
    int keep[kNumAxes] = {0, 0, 0, 0};
    keep[kNumAxes - 1 - kDP] = keep[kNumAxes - 1 - kCP] = 1;
    MPI_Comm dc;
    QUINTET_MPI(MPI_Cart_sub(cart, keep, &dc));
    make(Group::dp_cp, dc);
    for (Group g : {Group::ep, Group::edp}) {
        MPI_Comm sub;
        QUINTET_MPI(MPI_Comm_split(dc, layout_.group_color(g, rank_), layout_.group_rank(g, rank_), &sub));
        make(g, sub);
    }
}

std::unique_ptr<MpiCommunicator> ProcessGrid::split(Axis a, int color, const std::string& name) const {
    MPI_Comm sub;
    QUINTET_MPI(MPI_Comm_split(comm(a).handle(), color < 0 ? MPI_UNDEFINED : color, coords_[a], &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub, name, deadline_s_, watchdog_);
}

}  // namespace quintet
