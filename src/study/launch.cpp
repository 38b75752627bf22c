#include "quintet/study/launch.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/core/process.hpp"
#include "quintet/core/text.hpp"
#include "quintet/study/run_metrics.hpp"

namespace quintet {

namespace fs = std::filesystem;


// One job array per (world, threads): each line of the case file is one run's arguments.
void submit_slurm(const Study& st, const std::vector<Case>& cases, bool dry, const std::string& script) {
    std::map<std::pair<int, int>, std::vector<const Case*>> groups;
    for (const auto& c : cases)
        if (c.skip.empty() && !fs::exists(done_marker(st, c))) groups[{c.world, c.threads}].push_back(&c);
    fs::create_directories(st.dir + "/slurm");
    for (const auto& [key, list] : groups) {
        const std::string file = st.dir + "/slurm/cases_w" + std::to_string(key.first) + "_t" + std::to_string(key.second) + ".txt";
        {
            std::ofstream o(file);
            for (const Case* c : list) {
                o << st.base;
                for (const auto& a : c->overrides) o << " " << a;
                o << "\n";
            }
        }
        const std::string root = fs::path(script).parent_path().parent_path().parent_path().string();
        std::string cmd = "sbatch --parsable --export=ALL,QUINTET_ROOT=" + quote(root) + ",QUINTET_BIN=" + quote(self_exe()) +
                          " --chdir=" + quote(fs::current_path().string()) + " --array=0-" + std::to_string(list.size() - 1) + " --ntasks=" +
                          std::to_string(key.first) + " --cpus-per-task=" + std::to_string(key.second) +
                          " --job-name=quintet-study --output=" + quote(st.dir + "/slurm/%x-%A_%a.out") + " " +
                          st.sbatch_flags + " " + quote(script) + " " + quote(fs::absolute(file).string());
        if (dry) {
            std::printf("%s\n", cmd.c_str());
            continue;
        }
        const std::string id = capture(cmd + " 2>&1");
        if (id.empty() || id.find_first_not_of("0123456789;") != std::string::npos)
            throw ConfigError("study: sbatch failed: " + cmd + "\n" + id);
        std::printf("study: submitted job array %s: %zu run(s) of %d rank(s) x %d thread(s)\n", id.c_str(), list.size(),
                    key.first, key.second);
    }
    std::printf("study: gather the results with: quintet study --collect %s\n", st.dir.c_str());
}

int run_local(const Study& st, const std::vector<Case>& cases, bool dry) {
    std::vector<const Case*> todo;
    int skipped_done = 0;
    for (const auto& c : cases) {
        if (!c.skip.empty()) continue;
        if (fs::exists(done_marker(st, c))) ++skipped_done;
        else todo.push_back(&c);
    }
    if (skipped_done) std::printf("study: %d run(s) finished before: skipped\n", skipped_done);
    const std::string self = self_exe();
    const double t0 = now_s();
    int i = 0, failed = 0;
    for (const Case* c : todo) {
        std::vector<std::string> args{"mpirun"};
        for (const auto& a : split_list(st.mpirun_flags, ' ')) args.push_back(a);
        args.insert(args.end(), {"-n", std::to_string(c->world), "-x", "OMP_NUM_THREADS=" + std::to_string(c->threads),
                                 self, "train", st.base});
        args.insert(args.end(), c->overrides.begin(), c->overrides.end());
        std::string line;
        for (const auto& a : args) {
            if (!line.empty()) line += ' ';
            line += quote(a);
        }
        if (dry) {
            std::printf("%s\n", line.c_str());
            continue;
        }
        fs::create_directories(run_dir(st, *c));
        fs::remove(failed_marker(st, *c));
        std::ofstream(run_dir(st, *c) + "/command") << line << "\n";
        const double r0 = now_s();
        const int rc = run_process(args, run_dir(st, *c) + "/train.log", false, {"OMP_NUM_THREADS=" + std::to_string(c->threads)});
        ++i;
        const double el = (now_s() - t0);
        const double took = (now_s() - r0);
        const double eta = el / i * double(todo.size() - size_t(i));
        // study_done for a finished run, study_failed (its exit status) for one that failed: a
        // re-run of the study runs it again, and study.h5 lists it meanwhile.
        const std::string marker = rc == 0 ? done_marker(st, *c) : failed_marker(st, *c);
        std::ofstream(marker + ".tmp") << rc << "\n";
        fs::rename(marker + ".tmp", marker);
        if (rc != 0) ++failed;
        const RunResult r = rc == 0 ? read_run(st, *c) : RunResult{};
        char b[400];
        if (rc == 0)
            std::snprintf(b, sizeof b, "[%d/%zu] %s: %.0f tok/s, MFU %.1f%%, final loss %.4f (%s) | ETA %s", i, todo.size(),
                          c->name.c_str(), median(steady(r.tps)), 100 * median(steady(r.mfu)),
                          r.loss.empty() ? std::nan("") : r.loss.back(), human_seconds(took).c_str(), human_seconds(eta).c_str());
        else
            std::snprintf(b, sizeof b, "[%d/%zu] %s: FAILED with exit status %d (see %s/train.log) | ETA %s", i, todo.size(),
                          c->name.c_str(), rc, run_dir(st, *c).c_str(), human_seconds(eta).c_str());
        std::printf("%s\n", b);
        std::fflush(stdout);
    }
    return failed;
}

}  // namespace quintet
