#include "quintet/train/faults.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "quintet/core/error.hpp"
#include "quintet/core/trace.hpp"

namespace quintet {

void write_fault_file(const std::string& run_dir, const std::string& kind, int64_t step, int rank,
                      const std::string& what) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    const fs::path path = fs::path(run_dir) / "fault", tmp = path.string() + ".tmp" + std::to_string(getpid());
    {
        std::ofstream f(tmp);
        f << "kind=" << kind << " step=" << step << " rank=" << rank << "\n" << what << "\n";
    }
    fs::rename(tmp, path, ec);
}

void write_stop_file(const std::string& run_dir, int64_t step, const std::string& checkpoint) {
    namespace fs = std::filesystem;
    const fs::path path = fs::path(run_dir) / "stopped", tmp = path.string() + ".tmp" + std::to_string(getpid());
    {
        std::ofstream f(tmp);
        f << "step=" << step << "\n" << checkpoint << "\n";
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
}

void remove_stop_file(const std::string& run_dir) {
    std::error_code ec;
    std::filesystem::remove(std::filesystem::path(run_dir) / "stopped", ec);
}

void arm_watchdog(const ProcessGrid& grid, const std::string& run_dir, const std::atomic<int64_t>* steps_done) {
    Watchdog* w = grid.watchdog();
    if (!w) return;
    w->set_status_dir((std::filesystem::path(run_dir) / ".ranks").string());
    const int rank = grid.rank();
    w->on_expiry([run_dir, rank, steps_done](const std::string& report) {
        write_fault_file(run_dir, "transient", steps_done->load() + 1, rank, report);
        std::fprintf(stderr, "%s\n", report.c_str());
        std::fflush(stderr);
        _exit(4);
    });
}

std::string locate_nonfinite(const ParamTable& table, Backend& be, const float* grads, double local_loss,
                             const MpiCommunicator& world) {
    // This rank's first non-finite tensor (in arena order) of its gradients before any reduction.
    std::string name;
    if (!std::isfinite(local_loss)) name = "loss";
    for (const auto& spec : table.specs) {
        if (!name.empty()) break;
        if (!spec.trainable()) continue;
        if (!std::isfinite(be.sumsq(grads + spec.offset, spec.numel()))) name = "gradient of " + spec.name;
    }
    return locate_nonfinite(name, world);
}

std::string locate_nonfinite(const std::string& name, const MpiCommunicator& world) {
    const int size = world.size();
    double first = name.empty() ? -double(size) : -double(world.rank());
    world.all_reduce_max(&first, 1);
    const int r = int(-first);
    if (r >= size) return "";
    char buf[256] = {0};
    if (world.rank() == r) std::snprintf(buf, sizeof buf, "%s", name.c_str());
    world.broadcast(buf, sizeof buf, r);
    return "rank " + std::to_string(r) + ", " + buf;
}

NonFinitePolicy::NonFinitePolicy(const TrainConfig& train, std::string run_dir, int rank, SkipBudget& skips,
                                 std::function<void(const std::string&)> log)
    : t_(train), run_dir_(std::move(run_dir)), rank_(rank), skips_(skips), log_(std::move(log)) {}

StepStats NonFinitePolicy::handle(int64_t s, const StepStats& first,
                                  const std::function<StepStats(bool locate)>& rerun,
                                  const std::string& last_checkpoint, bool* skipped) {
    *skipped = false;
    // Re-run once from the same state: finite now = a transient fault. (The rerun is the same
    // computation, so it continues the unbroken curve bit for bit.)
    StepStats again = rerun(false);
    if (again.nonfinite) again = rerun(true);  // reproduced: once more, to find where it starts
    if (!again.nonfinite) {
        log_("warning: step " + std::to_string(s + 1) + ": " + first.what +
             " was not finite, and is finite when the step is re-run from the same state: a "
             "transient fault (suspect this job's hardware); continuing");
        if (rank_ == 0)
            write_fault_file(run_dir_, "transient_nonfinite", s + 1, -1, first.what + " not finite once; the rerun was finite");
        return again;
    }
    const std::string msg = "step " + std::to_string(s + 1) + ": " + again.what +
                            " is not finite, also when the step is re-run from the same state; "
                            "it first appears on " + (again.origin.empty() ? "no rank's local values (in a reduction)" : again.origin);
    int origin_rank = -1;
    std::sscanf(again.origin.c_str(), "rank %d", &origin_rank);
    if (t_.on_nonfinite == "stop" || skips_.exhausted()) {
        if (rank_ == 0) write_fault_file(run_dir_, "diverged", s + 1, origin_rank, msg);
        throw DivergedError(msg + (t_.on_nonfinite == "skip" ? "; " + std::to_string(t_.max_skips) +
                                       " steps in a row skipped (train.max_skips)" : "") +
                            ". No update was applied and no checkpoint written; the last good one is " +
                            (last_checkpoint.empty() ? "none" : last_checkpoint) +
                            " (train.on_nonfinite = " + t_.on_nonfinite + ")");
    }
    skips_.skipped();
    log_("warning: " + msg + "; the update is skipped (train.on_nonfinite = skip, " +
         std::to_string(skips_.in_row()) + " in a row of at most " + std::to_string(t_.max_skips) + ")");
    *skipped = true;
    return again;
}

FaultInjection::FaultInjection(int rank) : rank_(rank) {
    const char* spec = std::getenv("QUINTET_INJECT_FAULT");
    if (!spec) return;
    int r = -1;
    long long step = -1, until = -1;
    std::string mode = "fail";
    double factor = 1;
    // key=value pairs separated by commas; rank and step required.
    std::string text = spec;
    size_t at = 0;
    while (at <= text.size()) {
        const size_t end = std::min(text.find(',', at), text.size());
        const std::string kv = text.substr(at, end - at);
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) return;
        const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
        char* stop = nullptr;
        if (key == "rank") r = int(std::strtol(value.c_str(), &stop, 10));
        else if (key == "step") step = std::strtoll(value.c_str(), &stop, 10);
        else if (key == "until") until = std::strtoll(value.c_str(), &stop, 10);
        else if (key == "factor") factor = std::strtod(value.c_str(), &stop);
        else if (key == "mode") mode = value;
        else return;
        if (stop && *stop) return;
        at = end + 1;
    }
    if (r < 0 || step < 0) return;
    target_ = r, step_ = step, until_ = until, mode_ = mode, factor_ = factor;
    if (mode_ == "slow") {  // until the end without until; a factor of 1 or less is malformed: nothing
        if (until < 0) until_ = INT64_MAX;
        if (factor_ <= 1.0) target_ = -1;
    }
}

bool FaultInjection::hits(int64_t s) const {
    return target_ >= 0 && rank_ == target_ && s >= step_ && s <= std::max(step_, until_);
}

StepFault FaultInjection::at_step_start(int64_t s) {
    StepFault f;
    if (mode_ == "slow") {  // this rank's compute spans spin (core/trace.hpp) for the steps it hits
        if (target_ >= 0 && rank_ == target_) trace::set_stretch(hits(s) ? factor_ : 1.0);
        return f;
    }
    if (!hits(s)) return f;
    if (mode_ == "nan" || mode_ == "spike" || ((mode_ == "nan_once" || mode_ == "spike_once") && !fired_once_)) {
        fired_once_ = true;
        if (mode_.rfind("nan", 0) == 0) f.nan = true;
        else f.grad_factor = float(factor_);
        return f;
    }
    if (mode_ == "nan_once" || mode_ == "spike_once") return f;
    if (mode_ == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    if (mode_ == "stop") std::raise(SIGSTOP);  // the whole process, watchdog thread included
    if (mode_ == "kill") std::raise(SIGKILL);  // a dying rank
    if (mode_ == "stop_checkpoint" || mode_ == "hang_checkpoint") return f;  // at that step's checkpoint (in_checkpoint)
    rank_fail("injected fault (QUINTET_INJECT_FAULT) at step " + std::to_string(s));
}

void FaultInjection::in_checkpoint(int64_t step) const {
    if (!hits(step - 1)) return;
    // The others wait for this rank in the write's barrier (or the process is held there).
    if (mode_ == "stop_checkpoint") std::raise(SIGSTOP);
    // A write that never returns (a hung file system): the thread that writes sleeps.
    if (mode_ == "hang_checkpoint")
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace quintet
