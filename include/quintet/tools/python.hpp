// The project's Python scripts (plots) run from the C++ commands: which interpreter, which file.
#pragma once
#include <string>
#include <vector>

namespace quintet {

// A python3 that imports matplotlib and h5py: $QUINTET_PYTHON, else /usr/bin/python3 (Debian's
// python3-matplotlib), else python3 on PATH. Throws ConfigError naming what was tried (and the
// package to install) when none does -- another python3 first on PATH is skipped, not used.
std::string plotting_python();

// scripts/NAME: $QUINTET_SCRIPTS_DIR, else beside the executable (build/ -> ../scripts,
// bin/ -> ../share/quintet), else the source tree it was built from.
std::string project_script(const std::string& name);

// Runs args[0] (found on PATH) with args and returns its exit status (127: could not start).
// log: stdin from /dev/null, stdout and stderr appended to it; else quiet: both to /dev/null;
// else ours. env_add: "NAME=value" entries added to our environment.
int run_process(const std::vector<std::string>& args, const std::string& log = "", bool quiet = false,
                const std::vector<std::string>& env_add = {});

// Runs PYTHON SCRIPT ARGS... and returns its exit status (its output goes to ours).
int run_python(const std::string& script, const std::vector<std::string>& args);

}  // namespace quintet
