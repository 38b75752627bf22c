#include "quintet/core/error.hpp"

namespace quintet {

void config_fail(const std::string& key, const std::string& value, const std::string& valid) {
    throw ConfigError("deck key '" + key + "' = '" + value + "': " + valid);
}

void rank_fail(const std::string& what) { throw RankError(what); }

}  // namespace quintet
