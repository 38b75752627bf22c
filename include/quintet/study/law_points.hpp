// The runs a scaling law is fitted to, read from a study's study.h5 (a [laws] study) or from a
// CSV file whose header names its columns (docs/scaling-laws.md, "Input"). Every value is
// checked before any fit: a bad one is a ConfigError naming the file, the row, the column and
// the value. Runs that failed are kept aside with the reason, never averaged in.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "quintet/study/law_fit.hpp"

namespace quintet {

struct LawInput {
    std::vector<LawPoint> points;                             // the runs to fit
    std::vector<std::pair<std::string, std::string>> excluded;  // run, why it is left out
    std::string params;  // how N was counted: total | non_embedding | active ("" when the CSV does not say)
    std::string loss;    // what the loss is: "final validation loss", ...
    std::string family;  // the study's model family (study.h5), for `quintet plan --budget`
};

// `path`: a study.h5, a study folder holding one, or a CSV. `loss` (study.h5 only): val (the
// final validation loss, the default) or train (the smoothed final training loss). `params`
// (study.h5 only): which count is N ("" = the one the study ran with).
LawInput read_law_input(const std::string& path, const std::string& loss = "val", const std::string& params = "");

// Budgets of points given without one: C values within a factor 1.1 of the smallest C of their
// group are one budget (their geometric mean).
void assign_budgets(std::vector<LawPoint>& points);

}  // namespace quintet
