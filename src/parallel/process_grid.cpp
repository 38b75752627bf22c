#include "quintet/parallel/process_grid.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

ProcessGrid::ProcessGrid(MPI_Comm world, const Layout& layout) : layout_(layout) {
    // MPI orders Cartesian ranks row-major (last dim fastest): dims = {pp, dp, cp, tp}.
    int dims[kNumAxes], periods[kNumAxes] = {0, 0, 0, 0};
    for (int a = 0; a < kNumAxes; ++a) dims[kNumAxes - 1 - a] = layout.size[a];
    MPI_Comm cart;
    QUINTET_MPI(MPI_Cart_create(world, kNumAxes, dims, periods, /*reorder=*/0, &cart));
    cart_ = std::make_unique<MpiCommunicator>(cart);
    rank_ = cart_->rank();
    int c[kNumAxes];
    QUINTET_MPI(MPI_Cart_coords(cart, rank_, kNumAxes, c));
    for (int a = 0; a < kNumAxes; ++a) coords_[a] = c[kNumAxes - 1 - a];
    QUINTET_CHECK(layout_.rank_of(coords_) == rank_, "Cartesian rank order differs from Layout");
    for (int a = 0; a < kNumAxes; ++a) {
        int keep[kNumAxes] = {0, 0, 0, 0};
        keep[kNumAxes - 1 - a] = 1;
        MPI_Comm sub;
        QUINTET_MPI(MPI_Cart_sub(cart, keep, &sub));
        axis_[a] = std::make_unique<MpiCommunicator>(sub);
    }
}

std::unique_ptr<MpiCommunicator> ProcessGrid::split(Axis a, int color) const {
    MPI_Comm sub;
    QUINTET_MPI(MPI_Comm_split(comm(a).handle(), color < 0 ? MPI_UNDEFINED : color, coords_[a], &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub);
}

}  // namespace quintet
