// What the trainer does when something goes wrong during a run (docs/reliability.md): the
// non-finite policy (train.on_nonfinite: re-run a step once, then skip or stop), finding where a
// non-finite value began, the run_dir/fault file job scripts read, the watchdog's last act, and
// the fault injection the reliability tests drive.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "quintet/deck/train_config.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/process_grid.hpp"
#include "quintet/train/step_stats.hpp"

namespace quintet {

// run_dir/fault for job scripts: "kind=K step=S rank=R" and the message (any rank may write it:
// a unique temporary, then a rename, so a reader never sees half a file).
void write_fault_file(const std::string& run_dir, const std::string& kind, int64_t step, int rank,
                      const std::string& what);

// run_dir/stopped: "step=S" and the checkpoint's path, written by rank 0 when a stop signal ended
// the run after that checkpoint, and removed when a run starts. A launcher that reports its own
// status after forwarding SIGTERM or SIGINT (Open MPI's mpirun returns 1) can be told apart from a
// failure by it: jobs/common.sh does.
void write_stop_file(const std::string& run_dir, int64_t step, const std::string& checkpoint);
void remove_stop_file(const std::string& run_dir);

// Prepares the grid's watchdog (if any) for this run: ranks publish where they wait under
// run_dir/.ranks, and a deadline that passes writes run_dir/fault (kind=transient, the step
// being run: *steps_done + 1) before the process ends with exit status 4.
void arm_watchdog(const ProcessGrid& grid, const std::string& run_dir, const std::atomic<int64_t>* steps_done);

// The first rank (lowest) whose local values are not finite, and what: "rank R, gradient of T"
// or "rank R, loss"; "" when every rank is finite. collective over world
std::string locate_nonfinite(const ParamTable& table, Backend& be, const float* grads, double local_loss,
                             const MpiCommunicator& world);
// The same from what each rank found itself ("" when finite), e.g. under ZeRO >= 2, whose
// gradients exist only as each rank's reduced slices. collective over world
std::string locate_nonfinite(const std::string& local_what, const MpiCommunicator& world);

// The steps skipped in a row (non-finite, or spikes: train/spikes), counted against
// train.max_skips: the max_skips-th rejected step in a row stops the run instead (exit 3).
// Checkpointed (/train_state), so a resumed run counts on.
class SkipBudget {
public:
    explicit SkipBudget(int max_skips) : max_(max_skips) {}
    bool exhausted() const { return in_row_ + 1 >= max_; }  // one more rejected step stops the run
    void skipped() { ++in_row_; }
    void accepted() { in_row_ = 0; }
    int in_row() const { return in_row_; }
    int max() const { return max_; }
    void restore(int64_t in_row) { in_row_ = int(in_row); }

private:
    int max_;
    int in_row_ = 0;
};

// train.on_nonfinite. A step whose loss or gradient norm is not finite (every rank agrees: both
// are all-reduced) left the state untouched; it is run again from the same state: finite now is a
// transient fault (logged, recorded, the run continues with the rerun's result); reproduced, it
// is run once more to locate where it starts, then the run stops (stop, or train.max_skips
// skips in a row) with DivergedError, or the step is skipped.
class NonFinitePolicy {
public:
    NonFinitePolicy(const TrainConfig& train, std::string run_dir, int rank, SkipBudget& skips,
                    std::function<void(const std::string&)> log);
    // `first` came back non-finite from step s (0-based); rerun(locate) runs it again. Returns
    // the stats to record and sets *skipped when the update is left out.
    StepStats handle(int64_t s, const StepStats& first, const std::function<StepStats(bool locate)>& rerun,
                     const std::string& last_checkpoint, bool* skipped);

private:
    const TrainConfig& t_;
    std::string run_dir_;
    int rank_;
    SkipBudget& skips_;
    std::function<void(const std::string&)> log_;
};

// QUINTET_INJECT_FAULT = "rank=R,step=S[,mode=M][,factor=F][,until=E]" (keys in any order after
// rank and step) makes world rank R, at the start of step S (0-based: the step logged as S+1;
// with until, each step S..E), do M: throw (fail, the default), stop responding (hang: its main
// thread sleeps), stop with SIGSTOP (stop), die with SIGKILL (kill), SIGSTOP inside that step's
// checkpoint write (stop_checkpoint), never return from that write (hang_checkpoint: the writing
// thread sleeps, as in a hung file system), poison one element of its gradient with NaN each time
// the step runs (nan) or only the first time (nan_once: the rerun is finite), multiply its
// gradient by F each time the step runs (spike) or only the first time (spike_once), or compute F
// times as long from step S (to E, else to the end) by spinning at the end of each compute span
// (slow: core/trace.hpp's stretch, not a sleep in a collective; a straggler to rehearse the
// straggler report on). Unset or malformed: nothing.
struct StepFault {
    bool nan = false;         // poison one gradient element
    float grad_factor = 1;    // multiply this rank's gradient
};
class FaultInjection {
public:
    explicit FaultInjection(int rank);
    // At the start of step s: acts, and returns what to do to the step's gradient.
    StepFault at_step_start(int64_t s);
    // Inside the checkpoint write of step `step` (steps done).
    void in_checkpoint(int64_t step) const;

private:
    int rank_, target_ = -1;
    long long step_ = -1, until_ = -1;
    std::string mode_ = "fail";
    double factor_ = 1.0;  // slow
    bool fired_once_ = false;
    bool hits(int64_t s) const;
};

}  // namespace quintet
