#include "quintet/parallel/device_comms.hpp"

#include "quintet/core/error.hpp"
#ifdef QUINTET_WITH_CUDA
#include "quintet/comm/nccl_communicator.hpp"
#endif

namespace quintet {

DeviceComms::DeviceComms(const ProcessGrid& grid, Backend& be, int kv_group_size, bool tied_embedding, bool muon) {
    const int pp = grid.pp().size(), stage = grid.coord(kPP);
    std::unique_ptr<MpiCommunicator> kv, tie;
    if (kv_group_size > 1) kv = grid.split(kTP, grid.coord(kTP) / kv_group_size, "tp_kv_group");
    if (tied_embedding && pp > 1) tie = grid.split(kPP, stage == 0 || stage == pp - 1 ? 0 : -1, "pp_tied");
    if (muon) {
        // Keyed by world rank: rank tp + TP*(dp*CP + cp) inside the stage, tp + TP*edp inside the
        // expert group (Layout numbers world ranks tp fastest, then cp, dp, pp).
        const Layout& l = grid.layout();
        const int ep = l.group_rank(Group::ep, grid.rank());
        muon_stage_host = grid.world().split(stage, grid.rank(), "muon_stage");
        muon_expert_host = grid.world().split(stage * l.ep + ep, grid.rank(), "muon_expert");
        const int tp = grid.tp().size();
        QUINTET_CHECK(muon_stage_host->rank() == grid.coord(kTP) + tp * grid.dp_cp().rank() &&
                          muon_expert_host->rank() == grid.coord(kTP) + tp * grid.edp().rank(),
                      "Muon's groups are not numbered tp + TP x (replica-group rank)");
    }
    if (be.device() == Device::cpu) {
        for (int g = 0; g < kNumGroups; ++g) groups[size_t(g)] = &grid.comm(Group(g));
        kv_group = std::move(kv);
        tied = std::move(tie);
        muon_stage = muon_stage_host.get();
        muon_expert = muon_expert_host.get();
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
    for (auto [host, dev] : {std::pair{muon_stage_host.get(), &muon_stage}, std::pair{muon_expert_host.get(), &muon_expert}})
        if (host) {
            owned.push_back(std::make_unique<NcclCommunicator>(host->handle(), cuda, host->name(), host->deadline()));
            *dev = owned.back().get();
        }
    // The MPI sub-communicators are needed only for NCCL's bootstrap.
#else
    rank_fail("a device backend without a CUDA build");
#endif
}

}  // namespace quintet
