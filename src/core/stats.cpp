#include "quintet/core/stats.hpp"

#include <algorithm>

namespace quintet {

double median_of(std::vector<double>& v) {
    if (v.empty()) return 0.0;
    const size_t h = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + long(h), v.end());
    const double hi = v[h];
    if (v.size() % 2) return hi;
    return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + long(h)));
}

}  // namespace quintet
