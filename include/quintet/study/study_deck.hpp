// The study deck (docs/studies.md): a [study] section naming the base training deck and what
// varies across runs (worlds, layouts, threads, seeds, scaling), and a [vary] section of deck
// keys with lists -- or a [laws] section (docs/scaling-laws.md): budgets and model shapes. Every key and value is checked here, before any run starts.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "quintet/study/laws_study.hpp"

namespace quintet {

struct Study {
    std::string deck_path;  // the study deck as given
    std::string text;       // its text
    std::string base;       // the base training deck (found beside the study deck or from the working directory)
    std::string dir;        // the study folder
    std::string scaling = "none", mpirun_flags = "--oversubscribe", sbatch_flags;
    std::vector<int> worlds{1}, threads{1};
    std::vector<int64_t> seeds;                                  // empty: the base deck's train.seed
    std::vector<std::map<std::string, std::string>> layouts{{}};  // [parallel] settings, one map per layout
    std::vector<std::pair<std::string, std::vector<std::string>>> vary;  // deck key -> values (a grid)
    int global_batch = 0, steps = 0;
    LawsSpec laws;  // a [laws] section: runs laid out by FLOP budget (study/laws_study.hpp)
};

// Reads and checks a study deck; throws ConfigError naming the key, the value and what is valid.
Study read_study(const std::string& path);

// The study deck as kept in DIR/study.deck for `--collect`: its text with `base` made absolute.
std::string study_deck_for_dir(const Study& st);

}  // namespace quintet
