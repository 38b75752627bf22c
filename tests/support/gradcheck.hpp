// Central-difference gradient checking for fp32 kernels.
// The loss is L = sum(out * R) for a fixed random R, accumulated in double, so the only fp32
// error left is in the kernel itself: with step h the central difference has truncation error
// O(h^2 |f'''|) and rounding error ~ eps32 * |L| / h. For O(1) values and h = 1e-2 both are
// ~1e-4 relative to a typical gradient, hence the tolerances of 1e-2 (relative to the largest
// gradient) used by the tests: a wrong backward is off by O(1), far above that. Where the loss
// is a large fp32 sum and h must stay small (MoE: a larger step flips a routing choice), the
// rounding term is measured instead of assumed (noise_probes) and allowed for.
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
    // The central difference's own round-off, measured (0 unless noise_probes > 0): how far f
    // moves from its linear trend under nudges far below h, divided by h. |fd - f'| can reach it
    // from fp32 rounding alone: e+ and e- (the errors of f(x+h), f(x-h)) give (e+ - e-) / 2h.
    double noise = 0;
    double rel() const { return max_abs_err / std::max(max_grad, 1e-12); }
    // The analytic gradient agrees to tol (relative to the largest one) beyond the round-off.
    bool within(double tol) const { return max_abs_err <= tol * max_grad + noise; }
};

// Compares analytic[i] with (f(x + h e_i) - f(x - h e_i)) / 2h for `samples` indices of x.
// noise_probes > 0: at the first noise_probes of them, also f(x + j d e_i) for d = h / 1000 and
// j = 1..4, whose true change (f' j d) is subtracted; what is left is the rounding of f.
inline GradCheckResult gradcheck(std::vector<float>& x, const std::vector<float>& analytic,
                                 const std::function<double()>& f, float h = 1e-2f,
                                 size_t samples = 64, uint32_t seed = 7, size_t noise_probes = 0) {
    GradCheckResult r;
    std::mt19937 g(seed);
    size_t n = x.size();
    double wobble = 0;                          // the largest |f(x + j d) - f(x) - f' j d| seen
    const double f0 = noise_probes > 0 ? f() : 0.0;  // f(x): x is restored after every index
    for (size_t k = 0; k < std::min(samples, n); ++k) {
        size_t i = samples >= n ? k : g() % n;
        float keep = x[i];
        if (k < noise_probes) {
            for (int j = 1; j <= 4; ++j) {
                x[i] = keep + float(j) * (h / 1000.0f);
                const double d = double(x[i]) - keep;  // the nudge as stored
                wobble = std::max(wobble, std::abs(f() - f0 - double(analytic[i]) * d));
            }
        }
        x[i] = keep + h;
        double fp = f();
        x[i] = keep - h;
        double fm = f();
        x[i] = keep;
        double fd = (fp - fm) / (2.0 * h);
        r.max_abs_err = std::max(r.max_abs_err, std::abs(fd - double(analytic[i])));
        r.max_grad = std::max(r.max_grad, std::abs(double(analytic[i])));
    }
    r.noise = wobble / h;
    return r;
}

}  // namespace quintet::testing
