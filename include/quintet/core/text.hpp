// Numbers for people, as every command prints them: durations and rates.
#pragma once
#include <string>

namespace quintet {

// 42s, 3m07s, 2h05m.
std::string human_seconds(double s);
// 950, 13.9k, 2.35M.
std::string human_count(double x);

}  // namespace quintet
