// The optimizer step (docs/math.md §6 and "Muon"): global-norm clipping, then AdamW exactly as
// PyTorch's for every trainable tensor -- or, under train.optimizer = muon, Muon (train/muon) for
// the hidden and expert matrices and AdamW for the rest -- and the optimizer state.
//
// What a rank updates: per trainable arena region the whole region (plain data parallelism) or
// its ZeRO-1 shard; under ZeRO-2/3 its slices of every unit (the gradient shard's layout,
// train/zero_state). That part of each tensor is a *segment*; AdamW keeps its two moments for
// the segments of its tensors only, back to back; Muon's momentum lives whole on the rank that
// orthogonalises each matrix. Buffers (not trainable) get no state, no decay, no update.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/deck/train_config.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/param_groups.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/device_comms.hpp"
#include "quintet/train/grad_sync.hpp"
#include "quintet/train/muon.hpp"

namespace quintet {

class Optimizer {
public:
    // rules: each tensor's (table.specs order) learning-rate and weight-decay multipliers
    // (model/param_groups.hpp); empty = 1 everywhere. comms, tp: Muon's groups and the
    // tensor-parallel size (used under train.optimizer = muon). collective under muon (its plan)
    Optimizer(const ParamTable& table, Backend& be, const GradientSync& sync, const DeviceComms& comms, int tp,
              const TrainConfig& cfg, std::vector<TensorRule> rules = {});
    ~Optimizer();
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    // Where the reduced gradient of region r lives under ZeRO-1: its shard (else null).
    float* shard(int r) const { return shards_[size_t(r)]; }
    float* const* shards() const { return shards_; }
    // Global L2 norm of the gradients, each parameter element counted exactly once in the whole
    // job (writer copies only; each region's group rank 0, or each rank's ZeRO shard).
    // collective over `world`
    double grad_norm(const float* grads, const Communicator& world) const;
    // Scale by max_norm / (norm + 1e-6) when norm > max_norm (max_norm > 0).
    void clip(float* grads, double norm);
    // One step s (0-based) at learning rate lr on this rank's share; then (ZeRO-1/2) the updated
    // parameters are all-gathered into every replica. collective over the regions' groups (and
    // Muon's)
    void update(float* params, const float* grads, int64_t s, double lr);

    // Checkpoints: the arena ranges of /params this rank writes (its dp-owned slice of every
    // trainable tensor; ZeRO-2/3: its slices), and its optimizer state -- for a save the parts it
    // writes, for a load those it holds (host pointers on the CPU backend).
    std::vector<ArenaRange> param_write_ranges() const;
    OptimizerStateIo state(bool for_save) const;
    bool muon() const { return muon_ != nullptr; }
    const Muon* muon_part() const { return muon_.get(); }
    float* exp_avg() const { return m_; }
    float* exp_avg_sq() const { return v_; }
    size_t moment_floats() const { return moments_; }  // per moment array
    size_t shard_floats() const { return shard_floats_; }  // ZeRO-1: the reduced gradient shards
    // Bytes of the optimizer's state and buffers on this rank: AdamW's two moments, Muon's
    // momentum, its exchange buffers and scratch.
    double bytes() const;
    // For the start-up line: what Muon took and what AdamW kept (of the whole model).
    std::string describe() const;

private:
    // The part [a, b) of the arena of tensor `spec` this rank updates, where its reduced
    // gradient is (gsrc: 0 the gradient arena, 1 region r's ZeRO-1 shard, 2 the ZeRO-2/3 shard;
    // g_at the index there), where its parameters are (zero 3: the shard at p_at) and its state.
    struct Segment {
        size_t spec = 0, a = 0, b = 0;
        int gsrc = 0, region = 0;
        size_t g_at = 0;
        bool p_shard = false;
        size_t p_at = 0;
        bool muon = false;
        size_t state = 0;  // AdamW: index in the moments; Muon: index in its segments
    };
    Range updated(int r) const;  // ZeRO < 2: the range of region r this rank updates
    Range written(const Segment& s) const;  // the part of a segment this rank writes to checkpoints
    const float* grad_of(const Segment& s, const float* grads) const;
    float* param_of(const Segment& s, float* params) const;
    const ParamTable& table_;
    Backend& be_;
    const GradientSync& sync_;
    TrainConfig cfg_;
    std::vector<TensorRule> rules_;
    std::vector<Segment> segments_;
    float *m_ = nullptr, *v_ = nullptr;
    size_t moments_ = 0;
    float* shards_[kNumRegions] = {nullptr, nullptr, nullptr};
    size_t shard_floats_ = 0;
    std::vector<float*> owned_;
    std::unique_ptr<Muon> muon_;
    std::vector<MuonPointers> muon_ptrs_;  // filled each step (sized once)
};

}  // namespace quintet
