// AdamW exactly as PyTorch's (docs/math.md §6), global-norm clipping, and the optimizer state: per
// trainable arena region, the moments of the whole region (plain data parallelism) or of this
// rank's ZeRO-1 shard; under ZeRO-2/3 the moments of this rank's slices of every unit (the
// gradient shard's layout, train/zero_state). Buffers (not trainable) get no moments, no decay,
// no update.
#pragma once
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/param_groups.hpp"
#include "quintet/model/params.hpp"
#include "quintet/train/grad_sync.hpp"
#include "quintet/deck/train_config.hpp"

namespace quintet {

class AdamW {
public:
    // rules: each tensor's (table.specs order) learning-rate and weight-decay multipliers
    // (model/param_groups.hpp); empty = 1 everywhere.
    AdamW(const ParamTable& table, Backend& be, const GradientSync& sync, const TrainConfig& cfg,
          std::vector<TensorRule> rules = {});
    ~AdamW();
    AdamW(const AdamW&) = delete;
    AdamW& operator=(const AdamW&) = delete;

    // Where the reduced gradient of region r lives: its ZeRO shard, or the gradient arena.
    float* shard(int r) const { return shards_[size_t(r)]; }
    float* const* shards() const { return shards_; }
    // Global L2 norm of the gradients, each parameter element counted exactly once in the whole
    // job (writer copies only; each region's group rank 0, or each rank's ZeRO shard).
    // collective over `world`
    double grad_norm(const float* grads, const Communicator& world) const;
    // Scale by max_norm / (norm + 1e-6) when norm > max_norm (max_norm > 0).
    void clip(float* grads, double norm);
    // One AdamW step s (0-based) at learning rate lr on this rank's share; then (ZeRO) the
    // updated shards are all-gathered into every replica. collective over the regions' groups
    void update(float* params, const float* grads, int64_t s, double lr);

    // For checkpoints, per trainable region r: the part this rank writes (its dp-owned slice of
    // every tensor), and the part whose moments it holds (its ZeRO shard, or the whole region),
    // each with the index of its first element in exp_avg()/exp_avg_sq().
    ArenaRange write_range(int r) const;
    ArenaRange state_range(int r) const;
    // The same for every region (ZeRO-2/3: every trainable slice this rank owns; it writes what it
    // holds the moments of).
    std::vector<ArenaRange> write_ranges() const;
    std::vector<ArenaRange> state_ranges() const;
    float* exp_avg() const { return m_; }
    float* exp_avg_sq() const { return v_; }
    size_t state_floats() const { return state_; }
    size_t shard_floats() const { return shard_floats_; }  // ZeRO-1: the reduced gradient shards

private:
    // The range of region r this rank updates (its ZeRO shard, or the whole region) and the
    // index of its first element in the moments.
    Range updated(int r) const;
    // The AdamW step of [a, b) of tensor i at learning rate lr (its multipliers applied).
    void step_range(size_t i, float* p, const float* g, float* m, float* v, size_t n, double lr, double bc1,
                    double bc2) const;
    const ParamTable& table_;
    Backend& be_;
    const GradientSync& sync_;
    TrainConfig cfg_;
    std::vector<TensorRule> rules_;
    float *m_ = nullptr, *v_ = nullptr;
    size_t state_ = 0;
    size_t state_at_[kNumRegions] = {0, 0, 0};
    float* shards_[kNumRegions] = {nullptr, nullptr, nullptr};
    size_t shard_floats_ = 0;
    std::vector<float*> owned_;
};

}  // namespace quintet
