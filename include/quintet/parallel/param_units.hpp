// The seam between a pipeline chunk and fully sharded data parallelism (parallel.zero >= 2;
// docs/parallelism.md, "ZeRO"): the chunk asks, unit by unit (the embedding, each layer, the
// final norm, the head: model/params.hpp ParamUnit), for the unit's parameters before it computes
// with them and for a window to accumulate the unit's gradients in; train/zero_state.cpp
// implements it over the replica groups (all-gathers of the parameter shards under zero 3,
// reduce-scatters of the gradients into this rank's shard under zero 2 and 3).
//
// Base pointers: a unit's tensors keep their arena offsets. The pointers returned are such that
// base + (a tensor's arena offset) addresses that tensor in the unit's window, so the layers'
// code, which adds its tensors' offsets to the parameter and gradient arenas, runs unchanged.
#pragma once
#include <cstddef>

#include "quintet/core/bf16.hpp"

namespace quintet {

struct UnitParams {
    const float* f = nullptr;      // fp32 parameters (base pointer, see above)
    const bf16_bits* b = nullptr;  // their bf16 copy (train.precision = bf16; else null)
};

class ParamUnits {
public:
    virtual ~ParamUnits() = default;
    // The unit's parameters, complete (under zero 3 gathered now, or waited for if prefetched);
    // valid until release(unit).
    virtual UnitParams params(int unit) = 0;
    // Start gathering a unit that params() will ask for next (zero 3), while this rank computes.
    virtual void prefetch(int unit) = 0;
    virtual void release(int unit) = 0;
    // Where the unit's buffers (tensors that are not trained: MoE's aux-free bias) live, to be
    // changed in place (base pointer; null when the unit has none).
    virtual float* buffers(int unit) = 0;
    // A zeroed window for the unit's gradients of one microbatch (base pointer), then: they are
    // complete -- start reducing them into this rank's shard (non-blocking), the window is
    // recycled once that is done.
    virtual float* grads(int unit) = 0;
    virtual void reduce(int unit) = 0;
};

}  // namespace quintet
