// Fitting a scaling law to the final losses of runs of N parameters trained on D tokens
// (docs/scaling-laws.md derives and discusses each step):
//
//  - the parametric law (Hoffmann et al. 2022, approach 3): L(N, D) = E + A/N^alpha + B/D^beta,
//    fitted by minimising the Huber loss (delta 1e-3) of log L - log L^ with log L^ written as
//    a log-sum-exp of (log A - alpha log N, log B - beta log D, log E), by L-BFGS (libLBFGS) from
//    every point of a grid of starts, the best kept; bootstrap intervals over the runs;
//  - IsoFLOP profiles (approach 2): per budget a parabola of L in log N, its minimum N_opt(C),
//    D_opt(C) = C / (6 N_opt), and the power laws N_opt ~ C^a, D_opt ~ C^b over budgets.
//
// Pure maths: no files, no output. Warnings (a parameter on the grid's edge, an interval wider
// than its value, a budget without a minimum) are returned as text for the caller to print.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace quintet {

// One run: N parameters (as the study counted them), D tokens, C = 6 N D FLOPs, its loss.
struct LawPoint {
    double N = 0, D = 0, C = 0, loss = 0;
    double budget = 0;  // the budget it was run for (groups the IsoFLOP profiles)
    std::string run;    // a name for messages ("" = the row's number)
};

struct LawParams {
    double E = 0, A = 0, B = 0, alpha = 0, beta = 0;
};

// L(N, D) of the law.
double law_loss(const LawParams& p, double N, double D);
// The compute-optimal allocation of C FLOPs (C = 6 N D): N_opt = G (C/6)^(beta/(alpha+beta)),
// G = (alpha A / (beta B))^(1/(alpha+beta)), D_opt = C / (6 N_opt).
double law_G(const LawParams& p);
double law_n_opt(const LawParams& p, double C);
double law_d_opt(const LawParams& p, double C);
// The lowest loss C FLOPs reach: L(N_opt(C), D_opt(C)).
double law_frontier(const LawParams& p, double C);
// The smallest budget whose frontier is at or below `loss` (NaN when loss <= E: none is).
double law_budget_for_loss(const LawParams& p, double loss);

// A value and its bootstrap interval (ci_low = ci_high = NaN without a bootstrap).
struct Interval {
    double value = 0, lo = 0, hi = 0;
    bool has_ci() const;
};

// The grid of starts, in the fitted coordinates: log E, log A, log B, alpha, beta. The default
// is Hoffmann et al.'s: alpha, beta in {0, 0.5, ..., 2}, log E in {-1, -0.5, ..., 1},
// log A, log B in {0, 5, ..., 25}: 5 x 5 x 5 x 6 x 6 = 4500 starts.
struct LawGrid {
    std::vector<double> log_E{-1, -0.5, 0, 0.5, 1};
    std::vector<double> log_A{0, 5, 10, 15, 20, 25}, log_B{0, 5, 10, 15, 20, 25};
    std::vector<double> alpha{0, 0.5, 1, 1.5, 2}, beta{0, 0.5, 1, 1.5, 2};
    size_t size() const { return log_E.size() * log_A.size() * log_B.size() * alpha.size() * beta.size(); }
};

struct LawFitOptions {
    double huber_delta = 1e-3;
    LawGrid grid;
    int bootstrap = 1000;       // resamples of the runs (0: no intervals)
    uint64_t seed = 0;          // of the resampling
    double confidence = 0.95;   // the intervals' coverage (percentile bootstrap)
    int bootstrap_starts = 8;   // a resample starts from the full fit's best this many distinct minima
};

struct ParametricFit {
    LawParams p;
    double objective = 0;      // the Huber loss at the optimum
    int starts = 0;            // L-BFGS runs from the grid
    Interval E, A, B, alpha, beta, a, b, G;  // a = beta/(alpha+beta), b = alpha/(alpha+beta)
    int replicates = 0;        // bootstrap resamples whose fit converged to finite values
    std::vector<std::array<double, 5>> samples;  // their (E, A, B, alpha, beta), for predictions' intervals
    std::vector<std::string> warnings;
};

// Throws ConfigError when it cannot be fitted (fewer points than the law's 5 parameters).
ParametricFit fit_parametric(const std::vector<LawPoint>& points, const LawFitOptions& opt);

// The Huber objective and its gradient in the fitted coordinates (log E, log A, log B, alpha,
// beta), as the fitter sees them: for tests and the benchmark.
double law_objective(const std::vector<LawPoint>& points, const std::array<double, 5>& x, double delta,
                     std::array<double, 5>* grad = nullptr);

struct IsoflopBudget {
    double C = 0;          // the budget
    int points = 0;
    std::array<double, 3> parabola{0, 0, 0};  // loss = p0 + p1 log N + p2 (log N)^2
    double N_opt = 0, D_opt = 0, loss_opt = 0;
    bool ok = false;       // a minimum exists (p2 > 0, at least 3 distinct N)
    bool used = false;     // ok and inside the sampled N: it enters a and b (an extrapolated minimum does not)
    std::string why;       // why not
};

struct IsoflopFit {
    std::vector<IsoflopBudget> budgets;  // ascending C
    bool ok = false;                     // a and b were fitted (at least 2 budgets with a minimum)
    std::string why;
    Interval a, b;                       // N_opt ~ C^a, D_opt ~ C^b
    double log_kN = 0, log_kD = 0;       // the prefactors: log N_opt = log_kN + a log C
    int replicates = 0;
    std::vector<std::string> warnings;
};

// Points are grouped by `budget`. Never throws: a budget or the power laws that cannot be
// fitted say why.
IsoflopFit fit_isoflop(const std::vector<LawPoint>& points, const LawFitOptions& opt);

// The percentile interval of `values` (NaNs left out) at `confidence`.
std::pair<double, double> percentile_interval(std::vector<double> values, double confidence);

}  // namespace quintet
