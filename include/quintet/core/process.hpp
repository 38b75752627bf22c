// Other processes and the program's own files: starting a command and waiting for it, reading a
// command's output, quoting for a shell line, this executable's path, the project's scripts.
// Used by the commands that launch mpirun, sbatch or python (study, plan --measure, plot).
#pragma once
#include <string>
#include <vector>

namespace quintet {

// Runs args[0] (found on PATH) with args and returns its exit status (127: could not start).
// log: stdin from /dev/null, stdout and stderr appended to it; else quiet: both to /dev/null;
// else ours. env_add: "NAME=value" entries added to our environment.
int run_process(const std::vector<std::string>& args, const std::string& log = "", bool quiet = false,
                const std::vector<std::string>& env_add = {});

// The stdout of a shell command line, trailing newlines and spaces removed ("" when it cannot start).
std::string capture(const std::string& cmd);

// `s` as one word of a POSIX shell line (single-quoted when it holds a space, quote, $ or \).
std::string quote(const std::string& s);

// This executable's path ("quintet" when /proc/self/exe cannot be read).
std::string self_exe();
// This machine's host name ("?" when it cannot be read).
std::string host_name();

// scripts/NAME: $QUINTET_SCRIPTS_DIR, else beside the executable (build/ -> ../scripts,
// bin/ -> ../share/quintet), else the source tree it was built from. Throws ConfigError.
std::string project_script(const std::string& name);

// The commit of the source tree this binary was built from, "-dirty" appended when tracked files
// differ from it ("unknown" outside a git checkout).
std::string source_commit();

}  // namespace quintet
