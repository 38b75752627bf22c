// The runs of a study: the product worlds x layouts x threads x seeds x the [vary] grid, each a
// `quintet train BASE --section.key=value ...` in DIR/runs/<name>, checked as the trainer would
// check it (a case that cannot run is kept with the reason, never started).
#pragma once
#include <string>
#include <vector>

#include "quintet/deck/deck.hpp"
#include "quintet/study/study_deck.hpp"

namespace quintet {

// What a [laws] run is: its budget, its shape, its parameters counted three ways, and the tokens
// and steps the budget gives it.
struct LawsRun {
    double budget = 0;
    std::string shape;  // the shape's deck keys
    ParamCounts counts;
    double n = 0;       // counts.of(the study's params)
    double tokens = 0;  // D: steps x global batch x seq_len
    int64_t steps = 0;
};

struct Case {
    std::string name;
    int world = 1, threads = 1;
    std::vector<std::string> overrides;  // --section.key=value for `quintet train BASE`
    Deck deck;                           // resolved (vocab set), for the planner
    std::string skip;                    // why it does not run ("" = it runs)
    std::string reference;               // --parity: the name of its single-rank twin
    bool is_reference = false;
    LawsRun laws;                        // a [laws] study's run (laws.budget > 0)
};

// Every case of the study (and, with parity, the single-rank references before the cases that use
// them); a [laws] study's cases are its (budget, shape) pairs (seeds too, when it lists several).
std::vector<Case> make_cases(const Study& st, bool parity);

std::string run_dir(const Study& st, const Case& c);      // DIR/runs/<name>
std::string done_marker(const Study& st, const Case& c);    // its study_done: the exit status of a finished run
std::string failed_marker(const Study& st, const Case& c);  // its study_failed: the exit status of a failed run

}  // namespace quintet
