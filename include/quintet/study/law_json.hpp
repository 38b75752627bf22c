// A fitted law as JSON (`quintet laws --json`, the LAW.json that `quintet plan --budget` reads;
// docs/scaling-laws.md, "The law file"): E, A, B, alpha, beta, a, b, each {"value", "ci_low",
// "ci_high"}, the points used, and what a reader needs to predict with intervals (the bootstrap
// samples, how N was counted, the study's model family).
#pragma once
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "quintet/study/law_fit.hpp"
#include "quintet/study/law_points.hpp"

namespace quintet {

struct LawReport {
    LawInput input;                 // points (those fitted), excluded runs, N's count, the loss
    std::vector<LawPoint> heldout;  // --exclude-highest: the highest budgets' runs, predicted
    ParametricFit fit;
    IsoflopFit isoflop;
    LawFitOptions options;
};

std::string law_json(const LawReport& r);

// What `quintet plan --budget` needs of a law file. Throws ConfigError naming the file and the
// key when one is missing or not a finite number.
struct LawFile {
    LawParams p;
    double confidence = 0.95;
    std::string params, family;
    std::vector<std::array<double, 5>> samples;  // bootstrap (E, A, B, alpha, beta); may be empty
};
LawFile read_law_file(const std::string& path);

}  // namespace quintet
