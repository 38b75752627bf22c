// Learning-rate schedule and FLOP accounting (DESIGN §2-3; derivations in docs/math.md).
#pragma once
#include <cstdint>

#include "quintet/model/params.hpp"
#include "quintet/train/train_config.hpp"

namespace quintet {

// Linear warm-up lr*(s+1)/warmup for s < warmup, then cosine from lr to lr_min at train.steps.
double lr_at(const TrainConfig& t, int64_t step);

// PaLM-convention model FLOPs per token: 6*P + 6*L*T*NH*(d_qk + d_v).
double model_flops_per_token(const ParamTable& table, const ModelDims& d, int seq_len);

}  // namespace quintet
