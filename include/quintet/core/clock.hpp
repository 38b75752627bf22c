// The one clock every timing in quintet reads: seconds on the monotonic clock, as a double
// (differences of two readings are elapsed times; the origin means nothing).
#pragma once
#include <chrono>

namespace quintet {

inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace quintet
