// The one parser of the lists users write in decks and on command lines: comma lists of words
// ("a, b, c") and of integers, optionally with ranges ("0,2-5" = 0 2 3 4 5). Syntax only: the
// caller checks the values' range and names the key in its error.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace quintet {

// The items of `s` separated by `sep`, each trimmed of spaces and tabs; empty items dropped.
std::vector<std::string> split_list(std::string_view s, char sep = ',');

// Integers separated by commas (spaces allowed around them); with `ranges`, an item may be
// "a-b" (a <= b, both included). nullopt on anything else, or on an empty list.
std::optional<std::vector<int>> parse_int_list(std::string_view s, bool ranges = false);

}  // namespace quintet
