// SIGKILL of a whole (one-rank) training job at pseudo-random moments until it completes, each
// restart resuming from its latest checkpoint: shared by the background-checkpoint tests
// (test_async_checkpoints: a few kills; test_async_checkpoints_slow: many).
#pragma once
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include "support/run_support.hpp"

namespace quintet::testing {

struct KillTrials {
    int kills = 0;          // runs ended by SIGKILL
    int in_write = 0;       // of which with a checkpoint being written (a step_*.h5.tmp left behind)
    int verified = 0;       // kills after which `latest` named a checkpoint that `quintet eval` loaded
    int before_first = 0;   // kills before the run's first checkpoint (no `latest` yet)
    bool finished = false;  // a run went to the end
    std::string failure;    // what went wrong, or ""
};

// `command` runs the job (without mpirun, one rank) with run_dir `run_dir`; each try is killed
// after a delay drawn in [earliest, latest] s (seed), at most `max_kills` times. After each kill
// `latest` must name a checkpoint that verifies and loads (`quintet eval --data data`).
inline KillTrials kill_until_done(const std::string& command, const std::filesystem::path& run_dir,
                                  const std::filesystem::path& data, int max_kills, double earliest, double latest,
                                  uint32_t seed) {
    namespace fs = std::filesystem;
    KillTrials t;
    std::mt19937 g(seed);
    while (!t.finished && t.kills < max_kills) {
        const double after = earliest + double(g() % 1000) * 1e-3 * (latest - earliest);
        char s[32];
        std::snprintf(s, sizeof s, "%.3f", after);
        const int st = std::system((std::string("OMP_NUM_THREADS=1 timeout -s KILL ") + s + " " + command).c_str());
        t.finished = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (t.finished) break;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 137)) {
            t.failure = "a run ended with status " + std::to_string(st) + " instead of being killed";
            return t;
        }
        ++t.kills;
        const fs::path dir = run_dir / "checkpoints";
        std::error_code ec;
        bool tmp = false;
        if (fs::is_directory(dir, ec))
            for (auto& e : fs::directory_iterator(dir))
                tmp = tmp || (e.path().extension() == ".tmp" && e.path().filename().string().find(".h5.tmp") != std::string::npos);
        t.in_write += tmp;
        const std::string name = read_file(dir / "latest");
        if (name.empty()) {  // killed before the first checkpoint
            ++t.before_first;
            continue;
        }
        const RunResult e = run_quintet(0, "eval --checkpoint " + (dir / name.substr(0, name.size() - 1)).string() +
                                                " --data " + data.string() + " --eval.batches=1");
        if (e.status != 0) {
            t.failure = "after kill " + std::to_string(t.kills) + ", latest (" + name + ") does not load:\n" + e.output;
            return t;
        }
        ++t.verified;
    }
    return t;
}

}  // namespace quintet::testing
