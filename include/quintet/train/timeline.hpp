// train.trace_steps (docs/observability.md): the steps A..B of a run recorded on every rank's
// timeline (core/trace.hpp) and written to run_dir/trace/rank<r>.json, one Trace Event file per
// rank that `quintet trace RUN_DIR` merges. Clocks: at the window's start every rank passes two
// world barriers and takes the moment it leaves the second as its zero, so the ranks' times
// agree to the barrier's exit skew (measured with a third barrier and logged).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "quintet/deck/train_config.hpp"
#include "quintet/parallel/process_grid.hpp"

namespace quintet {

// Before any work: the trace folder run_dir/trace can be made and written (rank 0 tries, every
// rank learns the answer): ConfigError naming train.trace_steps and the folder otherwise.
// Nothing when train.trace_steps is empty. collective over world
void check_trace_folder(const Deck& deck, const MpiCommunicator& world);

class Timeline {
public:
    Timeline(const ProcessGrid& grid, const Deck& deck, std::function<void(const std::string&)> log);
    // Where the run starts (its first step, 0-based): a window wholly before it is said once.
    void begin(int64_t start_step);
    // Before step s (0-based) runs: the first step of the window aligns the clocks and starts
    // recording (collective over the world when it does).
    void before_step(int64_t s);
    // After step `done` (steps done) with its evaluation and checkpoint: the window's last step
    // stops recording and writes this rank's file.
    void after_step(int64_t done);
    // The run ends (also early, or on a fault): what was recorded is written.
    void finish();

private:
    void write();
    const ProcessGrid& grid_;
    int from_, to_;  // 1-based steps; 0 = off
    std::string dir_;
    std::function<void(const std::string&)> log_;
    bool recording_ = false, written_ = false;
    int64_t origin_ns_ = 0, run_id_ = 0;
    double spread_us_ = 0;
};

}  // namespace quintet
