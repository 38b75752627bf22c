// The runs of a study: the product worlds x layouts x threads x seeds x the [vary] grid, each a
// `quintet train BASE --section.key=value ...` in DIR/runs/<name>, checked as the trainer would
// check it (a case that cannot run is kept with the reason, never started).
#pragma once
#include <string>
#include <vector>

#include "quintet/deck/deck.hpp"
#include "quintet/study/study_deck.hpp"

namespace quintet {

struct Case {
    std::string name;
    int world = 1, threads = 1;
    std::vector<std::string> overrides;  // --section.key=value for `quintet train BASE`
    Deck deck;                           // resolved (vocab set), for the planner
    std::string skip;                    // why it does not run ("" = it runs)
    std::string reference;               // --parity: the name of its single-rank twin
    bool is_reference = false;
};

// Every case of the study (and, with parity, the single-rank references before the cases that use them).
std::vector<Case> make_cases(const Study& st, bool parity);

std::string run_dir(const Study& st, const Case& c);      // DIR/runs/<name>
std::string done_marker(const Study& st, const Case& c);  // its study_done: the exit status of a finished run

}  // namespace quintet
