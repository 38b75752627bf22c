// The seam between a backward pass and data parallelism: a layer tells the hook, as soon as a
// parameter gradient is final for the step, so that its reduction over the replica group can
// start while the backward goes on (parallel.overlap_dp; train/grad_sync.cpp implements it).
#pragma once
#include <cstddef>

namespace quintet {

// Told, during a backward, that a parameter gradient g[0, n) in the gradient arena is final for
// this step.
struct GradReadyHook {
    virtual ~GradReadyHook() = default;
    virtual void ready(float* g, size_t n) = 0;
};

}  // namespace quintet
