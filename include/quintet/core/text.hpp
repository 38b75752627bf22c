// Numbers for people, as every command prints them: durations and rates.
#pragma once
#include <string>

namespace quintet {

// 42s, 3m07s, 2h05m.
std::string human_seconds(double s);
// 950, 13.9k, 2.35M.
std::string human_count(double x);
// A JSON string's contents: quotes, backslashes and control characters escaped.
std::string json_escape(const std::string& s);
// s with every byte that is not part of a well-formed UTF-8 character replaced by U+FFFD (a
// sampled continuation may stop inside a character, or a byte-level model may emit any byte).
std::string utf8_or_replacement(const std::string& s);

}  // namespace quintet
