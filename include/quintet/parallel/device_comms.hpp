// The communicators that carry the backend's own buffers (activations, gradients, pipeline
// messages): the grid's MPI communicators on the CPU backend, NCCL ones built from them on the
// CUDA backend; plus the sub-groups of replicated tensors (the tp ranks sharing a kv head; the
// first and last pipeline stages holding a tied embedding), and Muon's groups (the ranks that
// hold pieces of the same matrices, docs/parallelism.md "Muon"). Host scalars (loss sums, norms)
// always go over the grid's MPI communicators.
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/parallel/process_grid.hpp"

namespace quintet {

struct DeviceComms {
    // collective over the grid. kv_group_size: the tp ranks that share one kv head (1 when every
    // tp rank has heads of its own); tied_embedding: the embedding and the LM head are one tensor, held
    // by the first and the last pipeline stages; muon: make Muon's groups.
    DeviceComms(const ProcessGrid& grid, Backend& be, int kv_group_size, bool tied_embedding, bool muon = false);
    const Communicator& group(Group g) const { return *groups[size_t(g)]; }
    std::array<const Communicator*, kNumGroups> groups{};
    std::unique_ptr<Communicator> kv_group, tied;  // sub-groups for replicated tensors (or null)
    // Muon (null without it): the ranks of this pipeline stage (tp x cp x dp: dense matrices) and
    // those of this stage and expert-parallel rank (tp x edp: experts), numbered tp + TP x (rank
    // in the replica group). The MPI ones carry host data (the exchange's plan), the others the
    // backend's buffers (the same objects on the CPU backend).
    std::unique_ptr<MpiCommunicator> muon_stage_host, muon_expert_host;
    const Communicator* muon_stage = nullptr;
    const Communicator* muon_expert = nullptr;
    std::vector<std::unique_ptr<Communicator>> owned;
};

}  // namespace quintet
