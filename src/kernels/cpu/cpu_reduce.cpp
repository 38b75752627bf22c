// The sum of squares in double on the CPU (the twin of src/kernels/cuda/reduce.cu), the global
// gradient norm's reduction: chunks of a fixed size, each summed by one thread, then the chunk
// sums added in order, so the bits do not depend on the thread split.
#include <algorithm>

#include "cpu_backend.hpp"

namespace quintet::cpu {

double CpuBackend::sumsq(const float* x, size_t n) {
    // Fixed chunks summed in order: the same result for the same thread count and n.
    constexpr size_t kChunk = 1 << 14;
    size_t nchunks = (n + kChunk - 1) / kChunk;
    partial_.assign(std::max<size_t>(nchunks, 1), 0.0);
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; ++c) {
        size_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
        double s = 0.0;
        for (size_t i = lo; i < hi; ++i) s += double(x[i]) * x[i];
        partial_[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; ++c) total += partial_[c];
    return total;
}

}  // namespace quintet::cpu
