#include "quintet/core/process.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "quintet/core/error.hpp"

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

std::string capture(const std::string& cmd) {
    std::string out;
    if (FILE* f = popen(cmd.c_str(), "r")) {
        char b[256];
        while (std::fgets(b, sizeof b, f)) out += b;
        pclose(f);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
}

std::string quote(const std::string& s) {
    if (s.find_first_of(" \t'\"$\\") == std::string::npos) return s;
    std::string o = "'";
    for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return o + "'";
}

std::string self_exe() {
    std::error_code ec;
    const fs::path p = fs::read_symlink("/proc/self/exe", ec);
    return ec ? "quintet" : p.string();
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

std::string source_commit() {
#ifdef QUINTET_SOURCE_SCRIPTS
    const std::string root = fs::path(QUINTET_SOURCE_SCRIPTS).parent_path().string();
    std::string c = capture("git -C " + quote(root) + " rev-parse HEAD 2>/dev/null");
    if (!c.empty()) {
        if (!capture("git -C " + quote(root) + " status --porcelain --untracked-files=no 2>/dev/null").empty()) c += "-dirty";
        return c;
    }
#endif
    return "unknown";
}

std::string host_name() {
    char h[256] = {0};
    if (gethostname(h, sizeof h - 1) != 0 || !h[0]) return "?";
    return h;
}

}  // namespace quintet
