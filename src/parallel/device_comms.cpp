#include "quintet/parallel/device_comms.hpp"

#include "quintet/core/error.hpp"
#ifdef QUINTET_WITH_CUDA
#include "quintet/comm/nccl_communicator.hpp"
#endif

namespace quintet {

DeviceComms::DeviceComms(const ProcessGrid& grid, Backend& be, int kv_group_size, bool tied_embedding) {
    const int pp = grid.pp().size(), stage = grid.coord(kPP);
    std::unique_ptr<MpiCommunicator> kv, tie;
    if (kv_group_size > 1) kv = grid.split(kTP, grid.coord(kTP) / kv_group_size, "tp_kv_group");
    if (tied_embedding && pp > 1) tie = grid.split(kPP, stage == 0 || stage == pp - 1 ? 0 : -1, "pp_tied");
    if (be.device() == Device::cpu) {
        for (int g = 0; g < kNumGroups; ++g) groups[size_t(g)] = &grid.comm(Group(g));
        kv_group = std::move(kv);
        tied = std::move(tie);
        return;
    }
#ifdef QUINTET_WITH_CUDA
    auto& cuda = static_cast<CudaBackend&>(be);
    for (int g = 0; g < kNumGroups; ++g) {
        owned.push_back(std::make_unique<NcclCommunicator>(grid.comm(Group(g)).handle(), cuda,
                                                           group_name(Group(g)),
                                                           grid.comm(Group(g)).deadline()));
        groups[size_t(g)] = owned.back().get();
    }
    if (kv) kv_group = std::make_unique<NcclCommunicator>(kv->handle(), cuda, kv->name(), kv->deadline());
    if (tie) tied = std::make_unique<NcclCommunicator>(tie->handle(), cuda, tie->name(), tie->deadline());
    // The MPI sub-communicators are needed only for NCCL's bootstrap.
#else
    rank_fail("a device backend without a CUDA build");
#endif
}

}  // namespace quintet
