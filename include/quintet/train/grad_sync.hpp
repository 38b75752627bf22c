// Gradient synchronisation of one step, per parameter and per replica group (docs/architecture.md, "The seams":
// "Replica groups"): first the partial sums inside the model-parallel ranks (tp-replicated norm
// weights under sequence parallelism, kv heads shared by several tp ranks, the tied embedding's
// two copies), then the data-parallel sum of each arena region over its group -- dense tensors
// over dp x cp, expert tensors over edp -- bucketed, overlapped with the backward
// (parallel.overlap_dp), or reduce-scattered into ZeRO-1 shards. Under ZeRO-2/3 the chunks
// reduce-scatter each unit's gradient into this rank's shard as they go (train/zero_state); what
// is left here is to wait for those and complete the partial sums on the shard.
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "quintet/model/block.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/data_parallel.hpp"
#include "quintet/parallel/tensor_parallel.hpp"
#include "quintet/parallel/device_comms.hpp"
#include "quintet/train/zero_state.hpp"

namespace quintet {

class GradientSync {
public:
    // zero: ZeRO-1 for the trainable regions; overlap: start bucket reductions during the last
    // backward (without ZeRO; only where a region's group has more than one rank). sharded: the
    // ZeRO-2/3 state (then zero and overlap are ignored).
    GradientSync(const ParamTable& table, Backend& be, const DeviceComms& comms,
                 TensorParallel& tp, double bucket_mb, bool zero, bool overlap, ZeroState* sharded = nullptr);
    // Region r's data parallelism (r = Replicas::dense or ::expert); null for buffers and under
    // ZeRO-2/3.
    DataParallel* region(int r) { return dp_[size_t(r)].get(); }
    const DataParallel* region(int r) const { return dp_[size_t(r)].get(); }
    bool zero() const { return zero_; }          // ZeRO-1
    ZeroState* sharded() const { return sharded_; }  // ZeRO-2/3, or null

    // At the start of a step (grads zeroed by the caller).
    void begin_step(float* grads);
    // The hook for the step's last backward of each chunk (null without overlap).
    GradReadyHook* hook() { return overlap_ ? &hook_ : nullptr; }
    // After the pipeline schedule: completes every replicated gradient not done yet, then the
    // replica-group sums. shards[r]: region r's ZeRO shard (ignored without ZeRO).
    // Returns {seconds in replica sync, seconds in data-parallel reduction}.
    std::pair<double, double> finish_step(float* grads, float* const* shards);
    double buckets_overlapped() const;  // last step

private:
    void sync_one(size_t i, float* grads);
    // ZeRO-2/3: tensor i's partial sums completed on this rank's slice of its gradient.
    void sync_shard(size_t i);
    struct Hook final : GradReadyHook {
        GradientSync* s = nullptr;
        void ready(float* g, size_t n) override;
    };
    const ParamTable& table_;
    const DeviceComms& comms_;
    TensorParallel& tp_;
    bool zero_, overlap_ = false;
    ZeroState* sharded_ = nullptr;
    Hook hook_;
    float* grads_ = nullptr;
    std::unique_ptr<DataParallel> dp_[kNumRegions];
    std::unordered_map<size_t, size_t> spec_at_offset_;  // arena offset -> index in specs
    std::vector<char> synced_;                           // per spec: replica sync done this step
};

}  // namespace quintet
