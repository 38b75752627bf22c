#include "quintet/model/config.hpp"

#include <algorithm>

#include "quintet/core/lists.hpp"

namespace quintet {

bool LayerSet::parse(const std::string& text) {
    if (text == "all") {
        text_ = text, all_ = true, list_.clear();
        return true;
    }
    const auto v = parse_int_list(text, /*ranges=*/true);
    if (!v) return false;
    text_ = text, all_ = false, list_ = *v;
    std::sort(list_.begin(), list_.end());
    list_.erase(std::unique(list_.begin(), list_.end()), list_.end());
    return true;
}

bool LayerSet::contains(int layer) const {
    return all_ || std::binary_search(list_.begin(), list_.end(), layer);
}

}  // namespace quintet
