// The process grid: owns the Cartesian topology over (pp, dp, cp, tp) -- MPI's last dimension
// varies fastest, so tp ranks are neighbours -- and hands out one communicator per axis.
#pragma once
#include <mpi.h>

#include <array>
#include <memory>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/parallel/layout.hpp"

namespace quintet {

class ProcessGrid {
public:
    // collective over `world`
    ProcessGrid(MPI_Comm world, const Layout& layout);
    const Layout& layout() const { return layout_; }
    int rank() const { return rank_; }
    int coord(Axis a) const { return coords_[a]; }
    const MpiCommunicator& comm(Axis a) const { return *axis_[a]; }
    const MpiCommunicator& world() const { return *cart_; }
    const MpiCommunicator& tp() const { return comm(kTP); }
    const MpiCommunicator& cp() const { return comm(kCP); }
    const MpiCommunicator& dp() const { return comm(kDP); }
    const MpiCommunicator& pp() const { return comm(kPP); }
    // collective over axis `a`: the ranks of that axis with the same `color` (negative: none;
    // returns nullptr). Used for sub-groups such as the tp ranks sharing a kv head.
    std::unique_ptr<MpiCommunicator> split(Axis a, int color) const;

private:
    Layout layout_;
    int rank_ = 0;
    std::array<int, kNumAxes> coords_{};
    std::unique_ptr<MpiCommunicator> cart_;
    std::array<std::unique_ptr<MpiCommunicator>, kNumAxes> axis_;
};

}  // namespace quintet
