#include "quintet/core/text.hpp"

#include <cstdio>

namespace quintet {

std::string human_seconds(double s) {
    char buf[32];
    if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
    else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
    else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
    return buf;
}

std::string human_count(double x) {
    char buf[32];
    if (x >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
    else if (x >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", x / 1e3);
    else std::snprintf(buf, sizeof buf, "%.0f", x);
    return buf;
}

}  // namespace quintet
