// Small statistics the measurements share (the straggler report, the host probes, a study's
// summaries).
#pragma once
#include <vector>

namespace quintet {

// The median of v (v reordered; the mean of the two middle values for an even count); 0 for an
// empty v.
double median_of(std::vector<double>& v);

}  // namespace quintet
