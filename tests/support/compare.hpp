// Comparing a result with a reference computed another way (another backend, emulated device
// code): the max-norm relative error the CUDA tests state their tolerances in.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace quintet::testing {

// max|got - ref| / max|ref|; infinite when got has a NaN/Inf where ref is finite, or the sizes
// differ.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
    if (got.size() != ref.size()) return INFINITY;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i]) && std::isfinite(ref[i])) return INFINITY;
        num = std::max(num, std::abs(double(got[i]) - double(ref[i])));
        den = std::max(den, std::abs(double(ref[i])));
    }
    return num / std::max(den, 1e-30);
}

}  // namespace quintet::testing
