// DIR/study.h5: every finished run of a study gathered into one file (docs/formats.md): its
// resolved deck, layout, medians of speed, the step time's parts, memory per rank and the
// planner's prediction beside them; with parity, each layout against its single-rank twin.
// Written whole to a temporary name and renamed.
#pragma once
#include <vector>

#include "quintet/study/cases.hpp"

namespace quintet {

struct Collected {
    int done = 0;     // runs that finished (study.h5 holds them)
    int missing = 0;  // runs not finished yet
};

Collected collect(const Study& st, const std::vector<Case>& cases, bool parity);

}  // namespace quintet
