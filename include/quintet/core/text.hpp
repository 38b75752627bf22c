// Small text helpers every command shares: numbers for people (durations, rates), and this
// executable's path (for launching it again under mpirun or sbatch).
#pragma once
#include <string>

namespace quintet {

// 42s, 3m07s, 2h05m.
std::string human_seconds(double s);
// 950, 13.9k, 2.35M.
std::string human_count(double x);
// This executable's path ("quintet" when /proc/self/exe cannot be read).
std::string self_exe();

}  // namespace quintet
