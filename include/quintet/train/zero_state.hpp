// Fully sharded data parallelism, parallel.zero = 2 and 3 (docs/parallelism.md, "ZeRO"): this
// rank's slices of every unit's parameters and gradients (model/params.hpp ZeroLayout), and the
// chunks' side of it (parallel/param_units.hpp):
//  - gradients, both levels: each unit's gradient of one microbatch accumulates in a window (the
//    largest unit's size, kZeroGradWindows of them); once the unit's backward (or its W) is done
//    the window is reduce-scattered over each part's replica group (dense: dp x cp, expert: edp)
//    without blocking, and the rank's slice is added to its gradient shard when the window is
//    recycled or the step ends. The shard is all a rank keeps of the gradients.
//  - parameters, zero 2: whole on every rank (the arena); after the optimizer updated its slices
//    every part is all-gathered (gather_updated).
//  - parameters, zero 3: the rank keeps only its slices (param_shard). params(unit) all-gathers
//    the unit into one of kZeroGatherWindows windows (started early by prefetch(unit), while the
//    previous unit computes), with its bf16 copy under train.precision = bf16; release(unit)
//    frees the window for the next gather. A unit still in a window when asked again is used as
//    it is (the last layer's forward then its backward), until params_changed().
// Every rank of a replica group runs the same schedule, so they start the same collectives in
// the same order. Buffers (not trained: the aux-free bias) are not sharded: every rank keeps them
// whole (in the arena, or at the end of the zero-3 shard).
#pragma once
#include <memory>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/device_comms.hpp"
#include "quintet/parallel/param_units.hpp"

namespace quintet {

class ZeroState final : public ParamUnits {
public:
    // zero: 2 or 3. arena: the whole parameter arena (zero 2; its bf16 copy arena_bf16 under
    // bf16), null under zero 3 (then the shard is allocated here, zeroed).
    ZeroState(const ParamTable& table, Backend& be, const DeviceComms& comms, int zero, bool bf16,
              float* arena, bf16_bits* arena_bf16);
    ~ZeroState() override;
    ZeroState(const ZeroState&) = delete;
    ZeroState& operator=(const ZeroState&) = delete;

    int level() const { return zero_; }
    const ZeroLayout& layout() const { return z_; }
    const Communicator& group(int region) const { return *groups_[size_t(region)]; }
    // zero 3: this rank's parameter slices, [trainable + buffers] floats (piece.at); else null.
    float* param_shard() const { return pshard_; }
    // Where arena element `i` of piece p lives: the arena (zero 2) or the shard (zero 3).
    float* param_at(const ZeroPiece& p, size_t i) const;

    // The gradient side (the trainer; evaluation needs none of it).
    void enable_gradients();
    float* grad_shard() const { return gshard_; }  // [trainable] floats, by piece.at
    void begin_step();                             // the shard zeroed, no window open
    void finish_step();                            // every reduction started is complete and added
    // The parameters changed (optimizer step, aux-free bias, a load): gathered copies are stale.
    void params_changed();
    // zero 2: every rank's updated slices into the whole arena (collective over the groups).
    void gather_updated();

    // Bytes this rank holds (model/params.hpp zero_param_bytes, zero_grad_bytes: the planner's
    // figures); the optimizer's moments are 2 x 4 x layout().trainable.
    double param_bytes() const;
    double grad_bytes() const;

    // ParamUnits
    UnitParams params(int unit) override;
    void prefetch(int unit) override;
    void release(int unit) override;
    float* buffers(int unit) override;
    float* grads(int unit) override;
    void reduce(int unit) override;

private:
    struct Pending {
        const Communicator* comm;
        int handle;
    };
    struct GatherWindow {
        float* f = nullptr;
        bf16_bits* b = nullptr;
        int unit = -1;
        bool pending = false, in_use = false;
        uint64_t last = 0;
        std::vector<Pending> handles;
    };
    struct GradWindow {
        float* g = nullptr;     // [largest unit] the unit's gradient of one microbatch
        float* recv = nullptr;  // [largest unit shard] this rank's slices of its sums
        int unit = -1;
        bool open = false, pending = false;
        std::vector<Pending> handles;
    };
    void start_gather(GatherWindow& w, int unit);
    void complete_gather(GatherWindow& w);
    GatherWindow* window_of(int unit);
    GatherWindow* free_window();
    void complete_reduce(GradWindow& w);

    const ParamTable& table_;
    Backend& be_;
    const int zero_;
    const bool bf16_;
    ZeroLayout z_;
    std::vector<std::vector<size_t>> unit_pieces_;  // per unit: its pieces' indices in z_.pieces
    const Communicator* groups_[kNumRegions] = {nullptr, nullptr, nullptr};
    float* arena_ = nullptr;           // zero 2
    bf16_bits* arena_bf16_ = nullptr;  // zero 2, bf16
    float* pshard_ = nullptr;          // zero 3
    std::vector<GatherWindow> gather_;
    uint64_t clock_ = 0;
    float* gshard_ = nullptr;
    std::vector<GradWindow> grad_;
    size_t grad_next_ = 0;
};

}  // namespace quintet
