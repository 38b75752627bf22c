// The process grid: owns the Cartesian topology over (pp, dp, cp, tp) -- MPI's last dimension
// varies fastest, so tp ranks are neighbours -- and hands out the communicator of every group of
// Layout: one per axis (MPI_Cart_sub), dp x cp (MPI_Cart_sub keeping both), and the ep and edp
// groups split from dp x cp with Layout's colours (docs/parallelism.md, "Expert parallelism").
// Each communicator is checked against Layout's maths when it is made, and carries the
// collective deadline.
#pragma once
#include <array>
#include <memory>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/parallel/layout.hpp"

namespace quintet {

class ProcessGrid {
public:
    // collective over `world`. deadline_s: train.collective_timeout_s (0 = none) for every
    // communicator of the grid.
    ProcessGrid(const MpiCommunicator& world, const Layout& layout, double deadline_s = 0);
    const Layout& layout() const { return layout_; }
    int rank() const { return rank_; }
    int coord(Axis a) const { return coords_[a]; }
    const MpiCommunicator& comm(Axis a) const { return comm(Group(a)); }
    const MpiCommunicator& comm(Group g) const { return *groups_[size_t(g)]; }
    const MpiCommunicator& world() const { return comm(Group::world); }
    const MpiCommunicator& tp() const { return comm(Group::tp); }
    const MpiCommunicator& cp() const { return comm(Group::cp); }
    const MpiCommunicator& dp() const { return comm(Group::dp); }
    const MpiCommunicator& pp() const { return comm(Group::pp); }
    const MpiCommunicator& dp_cp() const { return comm(Group::dp_cp); }  // dense gradients' replicas
    const MpiCommunicator& ep() const { return comm(Group::ep); }
    const MpiCommunicator& edp() const { return comm(Group::edp); }     // expert gradients' replicas
    // collective over axis `a`: the ranks of that axis with the same `color` (negative: none;
    // returns nullptr). Used for sub-groups such as the tp ranks sharing a kv head.
    std::unique_ptr<MpiCommunicator> split(Axis a, int color, const std::string& name) const;
    // The thread that times blocking collectives (null when deadline_s = 0).
    Watchdog* watchdog() const { return watchdog_.get(); }

private:
    Layout layout_;
    int rank_ = 0;
    Coords coords_{};
    double deadline_s_ = 0;
    std::shared_ptr<Watchdog> watchdog_;
    std::array<std::unique_ptr<MpiCommunicator>, kNumGroups> groups_;
};

}  // namespace quintet
