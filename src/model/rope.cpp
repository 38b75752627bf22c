#include "quintet/model/rope.hpp"

#include <algorithm>
#include <cmath>

namespace quintet {

std::vector<double> rope_inv_freq(const RopeConfig& rope, int d, int seq_len) {
    const int half = d / 2;
    std::vector<double> inv(half);
    for (int i = 0; i < half; ++i) inv[i] = std::pow(rope.theta, -2.0 * i / d);
    if (rope.scaling != "yarn") return inv;
    const double s = rope.factor;
    const double L = rope.original_max_position > 0 ? rope.original_max_position : seq_len;
    const double two_pi = 2.0 * M_PI;
    // Dimension index at which a frequency completes `beta` rotations over L (docs/math.md).
    auto dim_for = [&](double beta) { return d * std::log(L / (beta * two_pi)) / (2.0 * std::log(rope.theta)); };
    double low = std::floor(dim_for(rope.beta_fast));
    double high = std::ceil(dim_for(rope.beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, double(d - 1));
    double span = (high - low) == 0.0 ? 0.001 : (high - low);
    for (int i = 0; i < half; ++i) {
        double ramp = std::clamp((i - low) / span, 0.0, 1.0);
        inv[i] = (inv[i] / s) * ramp + inv[i] * (1.0 - ramp);
    }
    return inv;
}

double yarn_mscale(double s, double c) { return s <= 1.0 ? 1.0 : 0.1 * c * std::log(s) + 1.0; }

double rope_mscale(const RopeConfig& rope) {
    return rope.scaling != "yarn" ? 1.0 : yarn_mscale(rope.factor, rope.mscale);
}

double rope_table_factor(const RopeConfig& rope) {
    if (rope.scaling != "yarn") return 1.0;
    return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim);
}

double rope_softmax_factor(const RopeConfig& rope) {
    if (rope.scaling != "yarn") return 1.0;
    const double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
    return m * m;
}

void rope_tables(std::vector<float>& cos, std::vector<float>& sin, int T,
                 const std::vector<double>& inv, double amp) {
    const size_t half = inv.size();
    cos.resize(size_t(T) * half);
    sin.resize(size_t(T) * half);
    for (int t = 0; t < T; ++t)
        for (size_t i = 0; i < half; ++i) {
            double a = double(t) * inv[i];
            cos[t * half + i] = float(std::cos(a) * amp);
            sin[t * half + i] = float(std::sin(a) * amp);
        }
}

}  // namespace quintet
