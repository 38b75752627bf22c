#include "quintet/train/schedule_math.hpp"

#include <cmath>

namespace quintet {

double lr_at(const TrainConfig& t, int64_t s) {
    if (s < t.warmup) return t.lr * double(s + 1) / t.warmup;
    if (t.steps <= t.warmup) return t.lr;
    double progress = std::min(1.0, double(s - t.warmup) / double(t.steps - t.warmup));
    return t.lr_min + 0.5 * (t.lr - t.lr_min) * (1.0 + std::cos(M_PI * progress));
}

double model_flops_per_token(const ParamTable& table, const ModelDims& d, int T) {
    return 6.0 * double(table.matmul_params) + 6.0 * d.L * double(T) * d.NH * double(d.Dqk + d.Dv);
}

}  // namespace quintet
