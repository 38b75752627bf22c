#include "quintet/parallel/process_grid.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

ProcessGrid::ProcessGrid(const MpiCommunicator& world, const Layout& layout, double deadline_s)
    : layout_(layout), deadline_s_(deadline_s) {
    const int wsize = world.size(), wrank = world.rank();
    if (deadline_s > 0) watchdog_ = std::make_shared<Watchdog>(wrank);
    QUINTET_CHECK(wsize == layout.world(), "the layout " + layout.describe() + " needs " +
                                               std::to_string(layout.world()) + " ranks, the world has " +
                                               std::to_string(wsize));
    // MPI orders Cartesian ranks row-major (last dim fastest): dims = {pp, dp, cp, tp}.
    std::vector<int> dims(kNumAxes);
    for (int a = 0; a < kNumAxes; ++a) dims[size_t(kNumAxes - 1 - a)] = layout.size[a];
    auto make = [&](Group g, std::unique_ptr<MpiCommunicator> comm) {
        comm->set_deadline(deadline_s_);
        comm->set_watchdog(watchdog_);
        QUINTET_CHECK(comm->size() == layout_.group_size(g) &&
                          (g == Group::world || comm->rank() == layout_.group_rank(g, rank_)),
                      std::string("MPI's ") + group_name(g) + " communicator differs from Layout's");
        groups_[size_t(g)] = std::move(comm);
    };
    std::unique_ptr<MpiCommunicator> cart = world.cartesian(dims, group_name(Group::world));
    rank_ = cart->rank();
    const std::vector<int> c = cart->cartesian_coords();
    for (int a = 0; a < kNumAxes; ++a) coords_[a] = c[size_t(kNumAxes - 1 - a)];
    QUINTET_CHECK(layout_.rank_of(coords_) == rank_, "Cartesian rank order differs from Layout");
    for (int a = 0; a < kNumAxes; ++a) {
        std::vector<int> keep(kNumAxes, 0);
        keep[size_t(kNumAxes - 1 - a)] = 1;
        make(Group(a), cart->cartesian_sub(keep, group_name(Group(a))));
    }
    // dp x cp: rank in it = dp*CP + cp, as Layout numbers it (MPI keeps row-major order).
    std::vector<int> keep(kNumAxes, 0);
    keep[size_t(kNumAxes - 1 - kDP)] = keep[size_t(kNumAxes - 1 - kCP)] = 1;
    make(Group::dp_cp, cart->cartesian_sub(keep, group_name(Group::dp_cp)));
    for (Group g : {Group::ep, Group::edp})
        make(g, comm(Group::dp_cp).split(layout_.group_color(g, rank_), layout_.group_rank(g, rank_), group_name(g)));
    make(Group::world, std::move(cart));
}

std::unique_ptr<MpiCommunicator> ProcessGrid::split(Axis a, int color, const std::string& name) const {
    return comm(a).split(color, coords_[a], name);
}

}  // namespace quintet
