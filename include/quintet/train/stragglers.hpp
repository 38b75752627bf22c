// The straggler report (docs/observability.md): from every rank's compute time of each step
// (its step time less its waits), the ranks that compute more than train.straggler_ratio times
// the median of their peers -- the other ranks of the same pipeline stage, which do the same
// work -- for several steps in a row, named with their host and grid coordinates; and at the
// end of a run the ranks ordered by compute time. Pure bookkeeping (rank 0 holds it): the
// telemetry gathers the figures and logs the lines.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/core/stats.hpp"  // median_of, which the report takes of the ranks' times
#include "quintet/parallel/layout.hpp"

namespace quintet {

// A rank's place on the grid, its axes of size > 1 in the order pp, tp, cp, dp (ep when > 1):
// "pp stage 1, tp 1"; "" on one rank.
std::string rank_place(const Layout& layout, int rank);

struct StragglerRank {
    std::string host;   // where it runs
    std::string where;  // its grid coordinates, "pp stage 1, tp 1" (axes of size > 1)
    int group = 0;      // its peers share it (the pipeline stage)
};

class StragglerReport {
public:
    // Steps over the ratio before a rank is named: in a row, where one step at its peers' pace
    // between two slow ones is forgiven (a hiccup of a peer, or of the machine).
    static constexpr int kStepsInRow = 5;
    StragglerReport(std::vector<StragglerRank> ranks, double ratio);
    // One step's figures of every rank (seconds, [world] each): the lines to log. A rank is
    // named when its run over the ratio reaches kStepsInRow slow steps, again on every
    // `log_step` while it lasts, and once more when it ends (two steps in a row at its peers'
    // pace). The ratio said is its compute over its peers' median, summed over the run.
    std::vector<std::string> observe(int64_t step, const double* compute, const double* comm_wait, bool log_step);
    // The ranks by mean compute time over the steps observed: a header and at most `rows` rows
    // (the slowest, and the fastest last); empty before any step.
    std::vector<std::string> summary(size_t rows = 10) const;
    // The current ratio of rank r to the median of its peers (0 without peers) -- for tests.
    double ratio(int r) const { return last_ratio_[size_t(r)]; }

private:
    std::string name(int r) const;
    std::vector<StragglerRank> ranks_;
    double threshold_;
    std::vector<std::vector<int>> groups_;  // ranks by group
    std::vector<double> last_ratio_;
    // The current run of slow steps per rank: slow steps in it, steps since it began, normal
    // steps in a row at its end (one is forgiven).
    std::vector<int64_t> run_, span_, gap_;
    std::vector<double> run_mine_, run_med_;  // sums over the run: own compute, peers' median
    std::vector<char> named_;
    std::vector<double> sum_compute_, sum_wait_;
    int64_t steps_ = 0;
    std::vector<double> scratch_;
};

}  // namespace quintet
