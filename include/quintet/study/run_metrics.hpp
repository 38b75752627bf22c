// What a study reads back from one finished run: its exit status (the study_done marker) and
// the per-step series of its metrics.h5 (names from io/metrics_schema.hpp), and the summaries a
// study stores of them.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "quintet/study/cases.hpp"

namespace quintet {

struct RunResult {
    bool done = false;     // exit status 0 and a loss curve
    int exit_status = -1;  // -1: no marker (not finished, or never started); > 0: the run failed (study_failed)
    std::vector<double> step, loss, grad_norm, tps, mfu, mfu_matmul, step_time, expert_load;
    std::vector<double> eval_loss;  // /eval/loss, one per evaluation
    std::map<std::string, std::vector<double>> timing;
    std::vector<double> memory;  // [ranks, 6] the last step's: params, grads, optimizer, activations, buffers, peak_rss
    int ranks = 0;
};

RunResult read_run(const Study& st, const Case& c);

// The median of the finite values (NaN when there are none).
double median(std::vector<double> v);
// The steps a median is taken over: after the first two (start-up), or all of a short run.
std::vector<double> steady(const std::vector<double>& v);
// The largest relative difference of two equally long series (NaN when they are not).
double max_rel(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace quintet
