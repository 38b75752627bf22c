// `quintet plot RUN_DIR... [-o FILE.png]`: metrics.h5 of one or several runs as one PNG
// (scripts/plot_metrics.py draws it with matplotlib).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "quintet/core/error.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/tools/python.hpp"

extern char** environ;

namespace quintet {

namespace fs = std::filesystem;

int run_process(const std::vector<std::string>& args, const std::string& log, bool quiet,
                const std::vector<std::string>& env_add) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) env_s.push_back(*e);
    env_s.insert(env_s.end(), env_add.begin(), env_add.end());
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (!log.empty()) {
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
    } else if (quiet) {
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    }
    pid_t pid = 0;
    const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return 127;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return 127;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string plotting_python() {
    std::vector<std::string> tried;
    if (const char* e = std::getenv("QUINTET_PYTHON"); e && *e) tried.push_back(e);
    tried.push_back("/usr/bin/python3");
    tried.push_back("python3");
    for (const auto& py : tried)
        if (run_process({py, "-c", "import matplotlib, h5py, numpy"}, "", true) == 0) return py;
    std::string list;
    for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
    throw ConfigError("no python3 with matplotlib, h5py and numpy found (tried " + list +
                      "); install python3-matplotlib python3-h5py (scripts/setup.sh does), or set QUINTET_PYTHON");
}

std::string project_script(const std::string& name) {
    std::vector<fs::path> dirs;
    if (const char* e = std::getenv("QUINTET_SCRIPTS_DIR"); e && *e) dirs.emplace_back(e);
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        dirs.push_back(exe.parent_path() / ".." / "scripts");
        dirs.push_back(exe.parent_path() / ".." / "share" / "quintet");
    }
#ifdef QUINTET_SOURCE_SCRIPTS
    dirs.emplace_back(QUINTET_SOURCE_SCRIPTS);
#endif
    for (const auto& d : dirs)
        if (fs::exists(d / name, ec)) return fs::weakly_canonical(d / name, ec).string();
    throw ConfigError("cannot find the script " + name + " (looked beside the executable and in the source "
                      "tree; set QUINTET_SCRIPTS_DIR to the folder holding it)");
}

int run_python(const std::string& script, const std::vector<std::string>& args) {
    std::vector<std::string> cmd{plotting_python(), script};
    cmd.insert(cmd.end(), args.begin(), args.end());
    return run_process(cmd);
}

int plot_main(int argc, char** argv) {
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::cout << "usage: quintet plot RUN_DIR [RUN_DIR...] [-o FILE.png]\n"
                         "Plots loss, eval loss, learning rate, grad norm, tokens/s, MFU and (MoE) expert\n"
                         "load from each RUN_DIR/metrics.h5 into one PNG, runs overlaid; default output\n"
                         "RUN_DIR/metrics.png of the first run. Needs python3 with matplotlib and h5py\n"
                         "(/usr/bin/python3 from Debian's python3-matplotlib is preferred over PATH's;\n"
                         "QUINTET_PYTHON overrides).\n";
            return 0;
        }
        args.push_back(a);
    }
    if (args.empty()) throw ConfigError("plot: no RUN_DIR given (see quintet plot --help)");
    return run_python(project_script("plot_metrics.py"), args);
}

}  // namespace quintet
