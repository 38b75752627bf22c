// The learning-rate schedule (docs/math.md).
#pragma once
#include <cstdint>

#include "quintet/deck/train_config.hpp"

namespace quintet {

// Linear warm-up lr*(s+1)/warmup for s < warmup, then cosine from lr to lr_min at train.steps.
double lr_at(const TrainConfig& t, int64_t step);

}  // namespace quintet
