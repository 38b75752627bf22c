// Central-difference gradient checking for fp32 kernels.
// The loss is L = sum(out * R) for a fixed random R, accumulated in double, so the only fp32
// error left is in the kernel itself: with step h the central difference has truncation error
// O(h^2 |f'''|) and rounding error ~ eps32 * |L| / h. For O(1) values and h = 1e-2 both are
// ~1e-4 relative to a typical gradient, hence the tolerances of 1e-2 (relative to the largest
// gradient) used by the tests: a wrong backward is off by O(1), far above that.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace quintet::testing {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
    return s;
}

struct GradCheckResult {
    double max_abs_err = 0, max_grad = 0;
    double rel() const { return max_abs_err / std::max(max_grad, 1e-12); }
};

// Compares analytic[i] with (f(x + h e_i) - f(x - h e_i)) / 2h for `samples` indices of x.
inline GradCheckResult gradcheck(std::vector<float>& x, const std::vector<float>& analytic,
                                 const std::function<double()>& f, float h = 1e-2f,
                                 size_t samples = 64, uint32_t seed = 7) {
    GradCheckResult r;
    std::mt19937 g(seed);
    size_t n = x.size();
    for (size_t k = 0; k < std::min(samples, n); ++k) {
        size_t i = samples >= n ? k : g() % n;
        float keep = x[i];
        x[i] = keep + h;
        double fp = f();
        x[i] = keep - h;
        double fm = f();
        x[i] = keep;
        double fd = (fp - fm) / (2.0 * h);
        r.max_abs_err = std::max(r.max_abs_err, std::abs(fd - double(analytic[i])));
        r.max_grad = std::max(r.max_grad, std::abs(double(analytic[i])));
    }
    return r;
}

}  // namespace quintet::testing
