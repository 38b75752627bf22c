// The project's Python scripts (plots) run from the C++ commands: which interpreter runs them.
// (Starting processes and finding scripts/NAME: core/process.hpp.)
#pragma once
#include <string>
#include <vector>

#include "quintet/core/process.hpp"

namespace quintet {

// A python3 that imports matplotlib and h5py: $QUINTET_PYTHON, else /usr/bin/python3 (Debian's
// python3-matplotlib), else python3 on PATH. Throws ConfigError naming what was tried (and the
// package to install) when none does -- another python3 first on PATH is skipped, not used.
std::string plotting_python();

// Runs PYTHON SCRIPT ARGS... and returns its exit status (its output goes to ours).
int run_python(const std::string& script, const std::vector<std::string>& args);

}  // namespace quintet
