// Memory of one GPU rank in a bf16 (or fp32) mixed-precision run, as GPU frameworks lay it out
// (docs/planner.md §5): the weights in the run's precision, gradients accumulated in fp32, the
// fp32 master weights and both AdamW moments in the optimizer (sharded over the replica group
// under ZeRO-1, Megatron-Core's "distributed optimizer"; ZeRO-2 shards the gradients and ZeRO-3
// the weights too, each plus two windows of the largest unit), the activations the layer modules
// declare (model/buffers.hpp) with every floating value in the run's precision, the
// communication staging, and a stated allowance for the framework itself.
#pragma once
#include <utility>
#include <vector>

#include "quintet/model/transformer.hpp"
#include "quintet/perf/inventory.hpp"
#include "quintet/perf/planner.hpp"

namespace quintet {

struct GpuMemoryInput {
    RegionFloats params;      // this rank's parameters by region
    RegionFloats muon;        // of which Muon's matrices (train.optimizer = muon): one momentum, not two moments
    bool bf16 = true;
    int zero = 0;
    double dense_group = 1;   // dp x cp: the dense tensors' replica group
    double expert_group = 1;  // edp: the experts'
    // ZeRO-2/3: the largest unit's values (a layer, or the embedding / head): the windows its
    // gradients (zero 2, 3) and its gathered weights (zero 3) pass through, two of each.
    double largest_unit = 0;
    // The stage's chunks: their declared buffers and the microbatches each holds at once.
    std::vector<std::pair<const ChunkBuffers*, int>> chunks;
    double boundary_values = 0;  // pp > 1: one microbatch's boundary activations (Nr x C)
    double ring_values = 0;      // cp > 1: the ring's K|V blocks, partial outputs and log-sum-exp
    double exchange_values = 0;  // ep > 1: the expert exchange's rows (send and receive)
    // Unfused attention (FrameworkModel::unfused_attention): each layer also keeps its softmax
    // probabilities, B x heads x (T/cp) x T values, unless the attention core is recomputed.
    double score_values = 0;
};

// Bytes of a declared list with floating values in the run's precision and integers at 4.
double gpu_list_bytes(const std::vector<BufferSpec>& list, bool bf16);
MemoryBytes gpu_memory(const GpuMemoryInput& in);

// The allowance for what a GPU process holds besides the model (docs/planner.md §5).
constexpr double kGpuRuntimeBytes = 3.0 * 1073741824.0;

}  // namespace quintet
