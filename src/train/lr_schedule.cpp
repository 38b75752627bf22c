#include "quintet/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace quintet {

double lr_at(const TrainConfig& t, int64_t s) {
    if (s < t.warmup) return t.lr * double(s + 1) / t.warmup;
    if (t.steps <= t.warmup) return t.lr;
    double progress = std::min(1.0, double(s - t.warmup) / double(t.steps - t.warmup));
    return t.lr_min + 0.5 * (t.lr - t.lr_min) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace quintet
