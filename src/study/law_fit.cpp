#include "quintet/study/law_fit.hpp"

#include <lbfgs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {

std::string fmt(double v) {
    char b[40];
    std::snprintf(b, sizeof b, "%.4g", v);
    return b;
}

// ---- the parametric law ---------------------------------------------------------------------
//
// Fitted coordinates x = (log E, log A, log B, alpha, beta). Inside the optimiser log N and
// log D are centred on their means (xbar, ybar) and log A, log B shifted to match
// (a' = log A - alpha xbar, since log A - alpha log N = a' - alpha (log N - xbar)): the same minima, but the columns of the Jacobian are no longer
// nearly collinear (log N ~ 12 to 20 made log A and alpha move together), which L-BFGS needs
// for the 1e-6 recovery the tests ask of it.

struct Data {
    std::vector<double> xc, yc, logL, w;  // centred log N, log D; log loss; weights (bootstrap counts)
    double xbar = 0, ybar = 0, delta = 1e-3;
};

Data make_data(const std::vector<LawPoint>& pts, double delta) {
    Data d;
    d.delta = delta;
    for (const auto& p : pts) d.xbar += std::log(p.N), d.ybar += std::log(p.D);
    d.xbar /= double(pts.size()), d.ybar /= double(pts.size());
    for (const auto& p : pts) {
        d.xc.push_back(std::log(p.N) - d.xbar);
        d.yc.push_back(std::log(p.D) - d.ybar);
        d.logL.push_back(std::log(p.loss));
        d.w.push_back(1.0);
    }
    return d;
}

using Vec5 = std::array<double, 5>;

// Between the fitted coordinates and the optimiser's (centred) ones.
Vec5 to_inner(const Vec5& x, const Data& d) { return {x[0], x[1] - x[3] * d.xbar, x[2] - x[4] * d.ybar, x[3], x[4]}; }
Vec5 to_outer(const Vec5& z, const Data& d) { return {z[0], z[1] + z[3] * d.xbar, z[2] + z[4] * d.ybar, z[3], z[4]}; }

// Sum of w_i Huber(r_i), r_i = LSE(a' - alpha xc_i, b' - beta yc_i, e) - log L_i, and its gradient.
double objective(const Data& d, const double* z, double* g) {
    const double e = z[0], a = z[1], b = z[2], al = z[3], be = z[4], delta = d.delta;
    double f = 0, g0 = 0, g1 = 0, g2 = 0, g3 = 0, g4 = 0;
    const size_t n = d.xc.size();
    for (size_t i = 0; i < n; ++i) {
        const double w = d.w[i];
        if (w == 0) continue;
        const double t1 = a - al * d.xc[i], t2 = b - be * d.yc[i], t3 = e;
        const double m = std::max(t1, std::max(t2, t3));
        const double e1 = std::exp(t1 - m), e2 = std::exp(t2 - m), e3 = std::exp(t3 - m);
        const double s = e1 + e2 + e3;
        const double r = m + std::log(s) - d.logL[i];
        double h, dh;
        if (std::fabs(r) <= delta) h = 0.5 * r * r, dh = r;
        else h = delta * (std::fabs(r) - 0.5 * delta), dh = r > 0 ? delta : -delta;
        f += w * h;
        const double c = w * dh / s;
        g1 += c * e1, g3 -= c * e1 * d.xc[i];
        g2 += c * e2, g4 -= c * e2 * d.yc[i];
        g0 += c * e3;
    }
    if (g) g[0] = g0, g[1] = g1, g[2] = g2, g[3] = g3, g[4] = g4;
    return f;
}

lbfgsfloatval_t evaluate(void* instance, const lbfgsfloatval_t* x, lbfgsfloatval_t* g, const int, const lbfgsfloatval_t) {
    return objective(*static_cast<const Data*>(instance), x, g);
}

struct Local {
    Vec5 z{};  // optimiser coordinates
    double f = INFINITY;
};

// One L-BFGS run from z0. libLBFGS's return codes past convergence (a line search that can no
// longer decrease the objective in floating point, the iteration limit) still leave x at its
// best point, which is what is wanted from each start; only a non-finite result is dropped.
Local minimise(const Data& d, const Vec5& z0, double epsilon, int max_iterations) {
    lbfgs_parameter_t param;
    lbfgs_parameter_init(&param);
    param.epsilon = epsilon;
    param.max_iterations = max_iterations;
    param.m = 6;
    lbfgsfloatval_t x[5];
    for (int k = 0; k < 5; ++k) x[k] = z0[size_t(k)];
    lbfgsfloatval_t fx = 0;
    lbfgs(5, x, &fx, evaluate, nullptr, const_cast<Data*>(&d), &param);
    Local out;
    for (int k = 0; k < 5; ++k) out.z[size_t(k)] = x[k];
    out.f = objective(d, x, nullptr);
    bool finite = std::isfinite(out.f);
    for (double v : out.z) finite = finite && std::isfinite(v);
    if (!finite) out.f = INFINITY;
    return out;
}

// Repeated restarts from the best point (a restart forgets L-BFGS's curvature pairs, which
// lets it go on where the line search stalled) until the objective stops falling.
Local polish(const Data& d, Local best) {
    for (int round = 0; round < 6; ++round) {
        const Local next = minimise(d, best.z, 1e-15, 2000);
        if (!(next.f < best.f)) break;
        const bool small = best.f - next.f <= 1e-15 * std::max(1.0, best.f);
        best = next;
        if (small) break;
    }
    return best;
}

bool distinct(const Vec5& a, const Vec5& b) {
    for (size_t k = 0; k < 5; ++k)
        if (std::fabs(a[k] - b[k]) > 1e-3 * std::max(1.0, std::fabs(a[k]))) return true;
    return false;
}

LawParams params_of(const Vec5& outer) {
    return {std::exp(outer[0]), std::exp(outer[1]), std::exp(outer[2]), outer[3], outer[4]};
}

}  // namespace

// ---- the law's algebra ----------------------------------------------------------------------

double law_loss(const LawParams& p, double N, double D) { return p.E + p.A / std::pow(N, p.alpha) + p.B / std::pow(D, p.beta); }

double law_G(const LawParams& p) { return std::pow(p.alpha * p.A / (p.beta * p.B), 1.0 / (p.alpha + p.beta)); }

double law_n_opt(const LawParams& p, double C) { return law_G(p) * std::pow(C / 6.0, p.beta / (p.alpha + p.beta)); }

double law_d_opt(const LawParams& p, double C) { return C / (6.0 * law_n_opt(p, C)); }

double law_frontier(const LawParams& p, double C) { return law_loss(p, law_n_opt(p, C), law_d_opt(p, C)); }

double law_budget_for_loss(const LawParams& p, double loss) {
    if (!(loss > p.E) || !std::isfinite(loss)) return std::nan("");
    // The frontier falls monotonically from +inf towards E as C grows: bisection in log C.
    double lo = std::log(1.0), hi = std::log(1e60);
    if (law_frontier(p, std::exp(lo)) <= loss) return std::exp(lo);
    if (law_frontier(p, std::exp(hi)) > loss) return std::nan("");
    for (int i = 0; i < 200; ++i) {
        const double mid = 0.5 * (lo + hi);
        (law_frontier(p, std::exp(mid)) > loss ? lo : hi) = mid;
    }
    return std::exp(hi);
}

bool Interval::has_ci() const { return std::isfinite(lo) && std::isfinite(hi); }

std::pair<double, double> percentile_interval(std::vector<double> v, double confidence) {
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
    if (v.empty()) return {std::nan(""), std::nan("")};
    std::sort(v.begin(), v.end());
    auto q = [&](double p) {
        const double at = p * double(v.size() - 1);
        const size_t i = size_t(std::floor(at));
        const double f = at - double(i);
        return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
    };
    const double tail = 0.5 * (1.0 - confidence);
    return {q(tail), q(1.0 - tail)};
}

double law_objective(const std::vector<LawPoint>& points, const std::array<double, 5>& x, double delta,
                     std::array<double, 5>* grad) {
    const Data d = make_data(points, delta);
    const Vec5 z = to_inner(x, d);
    double g[5];
    const double f = objective(d, z.data(), g);
    if (grad) {
        // Back to the fitted coordinates: a' = log A - alpha xbar, so df/dalpha loses xbar df/da'.
        *grad = {g[0], g[1], g[2], g[3] - d.xbar * g[1], g[4] - d.ybar * g[2]};
    }
    return f;
}

// ---- approach 3 -----------------------------------------------------------------------------

ParametricFit fit_parametric(const std::vector<LawPoint>& points, const LawFitOptions& opt) {
    if (points.size() < 5)
        throw ConfigError("laws: " + std::to_string(points.size()) +
                          " run(s) to fit: the law L = E + A/N^alpha + B/D^beta has 5 parameters; give at least 5 runs "
                          "(Hoffmann et al. used hundreds; a study of 3 budgets x 5 shapes gives 15)");
    const LawGrid& G = opt.grid;
    if (G.size() == 0) throw ConfigError("laws: the grid of starts is empty");
    Data d = make_data(points, opt.huber_delta);
    ParametricFit fit;
    std::vector<Local> all;
    all.reserve(G.size());
    for (double e : G.log_E)
        for (double a : G.log_A)
            for (double b : G.log_B)
                for (double al : G.alpha)
                    for (double be : G.beta) {
                        const Local l = minimise(d, to_inner({e, a, b, al, be}, d), 1e-9, 400);
                        ++fit.starts;
                        if (std::isfinite(l.f)) all.push_back(l);
                    }
    if (all.empty()) throw ConfigError("laws: no start of the grid converged to finite parameters");
    std::sort(all.begin(), all.end(), [](const Local& x, const Local& y) { return x.f < y.f; });
    // The best few distinct minima: the best is polished and kept; resamples start from all of them.
    std::vector<Local> minima;
    for (const Local& l : all) {
        bool is_new = true;
        for (const Local& m : minima) is_new = is_new && distinct(to_outer(l.z, d), to_outer(m.z, d));
        if (is_new) minima.push_back(l);
        if (int(minima.size()) >= std::max(1, opt.bootstrap_starts)) break;
    }
    for (Local& m : minima) m = polish(d, m);
    std::sort(minima.begin(), minima.end(), [](const Local& x, const Local& y) { return x.f < y.f; });
    const Vec5 best = to_outer(minima[0].z, d);
    fit.p = params_of(best);
    fit.objective = minima[0].f;
    auto derived = [](const LawParams& p) {
        return std::array<double, 3>{p.beta / (p.alpha + p.beta), p.alpha / (p.alpha + p.beta), law_G(p)};
    };
    const auto dv = derived(fit.p);
    fit.E.value = fit.p.E, fit.A.value = fit.p.A, fit.B.value = fit.p.B;
    fit.alpha.value = fit.p.alpha, fit.beta.value = fit.p.beta;
    fit.a.value = dv[0], fit.b.value = dv[1], fit.G.value = dv[2];
    for (Interval* iv : {&fit.E, &fit.A, &fit.B, &fit.alpha, &fit.beta, &fit.a, &fit.b, &fit.G})
        iv->lo = iv->hi = std::nan("");

    // Bootstrap: the runs resampled with replacement (as counts: weights of the same data).
    if (opt.bootstrap > 0) {
        std::mt19937_64 rng(opt.seed);
        std::uniform_int_distribution<size_t> pick(0, points.size() - 1);
        std::vector<std::vector<double>> cols(8);
        for (int r = 0; r < opt.bootstrap; ++r) {
            std::fill(d.w.begin(), d.w.end(), 0.0);
            for (size_t i = 0; i < points.size(); ++i) d.w[pick(rng)] += 1.0;
            Local bestr;
            for (const Local& m : minima) {
                const Local l = minimise(d, m.z, 1e-10, 1000);
                if (l.f < bestr.f) bestr = l;
            }
            if (!std::isfinite(bestr.f)) continue;
            const LawParams p = params_of(to_outer(bestr.z, d));
            const auto dr = derived(p);
            const double vals[8] = {p.E, p.A, p.B, p.alpha, p.beta, dr[0], dr[1], dr[2]};
            bool finite = true;
            for (double v : vals) finite = finite && std::isfinite(v);
            if (!finite) continue;
            for (int k = 0; k < 8; ++k) cols[size_t(k)].push_back(vals[k]);
            fit.samples.push_back({p.E, p.A, p.B, p.alpha, p.beta});
            ++fit.replicates;
        }
        Interval* ivs[8] = {&fit.E, &fit.A, &fit.B, &fit.alpha, &fit.beta, &fit.a, &fit.b, &fit.G};
        if (fit.replicates >= 2)
            for (int k = 0; k < 8; ++k) std::tie(ivs[k]->lo, ivs[k]->hi) = percentile_interval(cols[size_t(k)], opt.confidence);
        if (fit.replicates < opt.bootstrap)
            fit.warnings.push_back(std::to_string(opt.bootstrap - fit.replicates) + " of " + std::to_string(opt.bootstrap) +
                                   " bootstrap resamples did not converge to finite parameters and are left out of the intervals");
    }

    // Warnings: a parameter on or beyond the edge of the grid of starts, an interval wider than its value.
    const struct {
        const char* name;
        double v;
        const std::vector<double>& g;
    } coords[5] = {{"log E", best[0], G.log_E}, {"log A", best[1], G.log_A}, {"log B", best[2], G.log_B},
                   {"alpha", best[3], G.alpha}, {"beta", best[4], G.beta}};
    for (const auto& c : coords) {
        if (c.g.empty()) continue;
        const auto [lo, hi] = std::minmax_element(c.g.begin(), c.g.end());
        const double tol = 0.02 * std::max(*hi - *lo, 1e-12);
        if (c.v <= *lo + tol || c.v >= *hi - tol)
            fit.warnings.push_back(std::string(c.name) + " = " + fmt(c.v) + " lies on or beyond the boundary of the grid of starts [" +
                                   fmt(*lo) + ", " + fmt(*hi) + "]: the data hardly constrain it, or the grid is too narrow");
    }
    const std::pair<const char*, const Interval*> named[7] = {{"E", &fit.E},         {"A", &fit.A},         {"B", &fit.B},
                                                              {"alpha", &fit.alpha}, {"beta", &fit.beta}, {"a", &fit.a},
                                                              {"b", &fit.b}};
    for (const auto& [name, iv] : named)
        if (iv->has_ci() && iv->hi - iv->lo > std::fabs(iv->value))
            fit.warnings.push_back(std::string("the ") + fmt(100 * opt.confidence) + "% interval of " + name + " [" + fmt(iv->lo) +
                                   ", " + fmt(iv->hi) + "] is wider than its value " + fmt(iv->value));
    return fit;
}

// ---- approach 2 -----------------------------------------------------------------------------

namespace {

struct Profile {
    bool ok = false;
    std::string why;
    std::array<double, 3> p{0, 0, 0};  // in uncentred log N
    double x_opt = 0, loss_opt = 0;
};

// Least-squares parabola of loss in log N over the given points (with multiplicities).
Profile parabola(const std::vector<const LawPoint*>& pts) {
    Profile out;
    std::set<double> distinct_n;
    for (const auto* p : pts) distinct_n.insert(p->N);
    if (distinct_n.size() < 3) {
        out.why = std::to_string(distinct_n.size()) + " distinct N (a parabola needs 3)";
        return out;
    }
    double xbar = 0;
    for (const auto* p : pts) xbar += std::log(p->N);
    xbar /= double(pts.size());
    // Normal equations of c0 + c1 u + c2 u^2, u = log N - xbar.
    double S[5] = {0, 0, 0, 0, 0}, T[3] = {0, 0, 0};
    for (const auto* p : pts) {
        const double u = std::log(p->N) - xbar;
        double up = 1;
        for (int k = 0; k < 5; ++k) {
            S[k] += up;
            if (k < 3) T[k] += up * p->loss;
            up *= u;
        }
    }
    const double M[3][3] = {{S[0], S[1], S[2]}, {S[1], S[2], S[3]}, {S[2], S[3], S[4]}};
    auto det3 = [](const double m[3][3]) {
        return m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
               m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
    };
    const double det = det3(M);
    if (!(std::fabs(det) > 0)) {
        out.why = "the points do not determine a parabola";
        return out;
    }
    double c[3];
    for (int k = 0; k < 3; ++k) {
        double Mk[3][3];
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j) Mk[i][j] = j == k ? T[i] : M[i][j];
        c[k] = det3(Mk) / det;
    }
    out.p = {c[0] - c[1] * xbar + c[2] * xbar * xbar, c[1] - 2 * c[2] * xbar, c[2]};
    if (!(c[2] > 0)) {
        out.why = "the parabola opens downwards (no minimum: loss does not rise on both sides of the sampled N)";
        return out;
    }
    const double u = -c[1] / (2 * c[2]);
    out.x_opt = u + xbar;
    out.loss_opt = c[0] + c[1] * u + c[2] * u * u;
    out.ok = true;
    return out;
}

// Least-squares slope and intercept of y on x.
std::pair<double, double> line(const std::vector<double>& x, const std::vector<double>& y) {
    double mx = 0, my = 0;
    for (size_t i = 0; i < x.size(); ++i) mx += x[i], my += y[i];
    mx /= double(x.size()), my /= double(y.size());
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < x.size(); ++i) sxx += (x[i] - mx) * (x[i] - mx), sxy += (x[i] - mx) * (y[i] - my);
    const double slope = sxy / sxx;
    return {slope, my - slope * mx};
}

}  // namespace

IsoflopFit fit_isoflop(const std::vector<LawPoint>& points, const LawFitOptions& opt) {
    IsoflopFit fit;
    fit.a.lo = fit.a.hi = fit.b.lo = fit.b.hi = std::nan("");
    std::map<double, std::vector<const LawPoint*>> by_budget;
    for (const auto& p : points) by_budget[p.budget].push_back(&p);
    std::vector<double> logC, logN, logD;
    for (const auto& [C, pts] : by_budget) {
        IsoflopBudget b;
        b.C = C, b.points = int(pts.size());
        const Profile pr = parabola(pts);
        b.parabola = pr.p;
        if (!pr.ok) {
            b.why = pr.why;
            fit.warnings.push_back("IsoFLOP budget " + fmt(C) + ": " + pr.why + "; left out of a and b");
        } else {
            b.ok = true;
            b.N_opt = std::exp(pr.x_opt), b.D_opt = C / (6.0 * b.N_opt), b.loss_opt = pr.loss_opt;
            double nlo = INFINITY, nhi = 0;
            for (const auto* p : pts) nlo = std::min(nlo, p->N), nhi = std::max(nhi, p->N);
            if (b.N_opt < nlo || b.N_opt > nhi) {
                // Not a measured minimum: reported, but a and b (and their resamples) leave it out.
                fit.warnings.push_back("IsoFLOP budget " + fmt(C) + ": the minimum N_opt = " + fmt(b.N_opt) +
                                       " lies outside the sampled N [" + fmt(nlo) + ", " + fmt(nhi) +
                                       "] (extrapolated: left out of a and b; add shapes on that side)");
            } else {
                b.used = true;
                logC.push_back(std::log(C)), logN.push_back(std::log(b.N_opt)), logD.push_back(std::log(b.D_opt));
            }
        }
        fit.budgets.push_back(b);
    }
    if (logC.size() < 2) {
        fit.why = by_budget.size() < 2 ? "one budget: the exponents a and b need the minima of at least two budgets"
                                       : "fewer than two budgets have a minimum inside their sampled N: a and b need at least two";
        fit.warnings.push_back("IsoFLOP: " + fit.why);
        return fit;
    }
    fit.ok = true;
    std::tie(fit.a.value, fit.log_kN) = line(logC, logN);
    std::tie(fit.b.value, fit.log_kD) = line(logC, logD);
    std::set<double> used;
    for (const auto& b : fit.budgets)
        if (b.used) used.insert(b.C);
    // Bootstrap: each budget's runs resampled with replacement (the budgets themselves are fixed);
    // a resample needs two budgets with a minimum inside their sampled N.
    if (opt.bootstrap > 0) {
        std::mt19937_64 rng(opt.seed + 1);
        std::vector<double> as, bs;
        for (int r = 0; r < opt.bootstrap; ++r) {
            std::vector<double> lc, ln, ld;
            for (const auto& [C, pts] : by_budget) {
                if (!used.count(C)) continue;  // the budgets the fit itself used
                std::uniform_int_distribution<size_t> pick(0, pts.size() - 1);
                std::vector<const LawPoint*> sample;
                for (size_t i = 0; i < pts.size(); ++i) sample.push_back(pts[pick(rng)]);
                const Profile pr = parabola(sample);
                if (!pr.ok) continue;
                // A minimum outside the resample's N is an extrapolation, not a measured
                // minimum (the full fit warns of it): that budget sits this resample out.
                double nlo = INFINITY, nhi = 0;
                for (const auto* p : sample) nlo = std::min(nlo, std::log(p->N)), nhi = std::max(nhi, std::log(p->N));
                if (pr.x_opt < nlo || pr.x_opt > nhi) continue;
                lc.push_back(std::log(C)), ln.push_back(pr.x_opt), ld.push_back(std::log(C / 6.0) - pr.x_opt);
            }
            if (lc.size() < 2) continue;
            as.push_back(line(lc, ln).first), bs.push_back(line(lc, ld).first);
        }
        fit.replicates = int(as.size());
        if (fit.replicates >= 2) {
            std::tie(fit.a.lo, fit.a.hi) = percentile_interval(as, opt.confidence);
            std::tie(fit.b.lo, fit.b.hi) = percentile_interval(bs, opt.confidence);
        }
    }
    for (const auto& [name, iv] : {std::pair<const char*, const Interval*>{"a", &fit.a}, {"b", &fit.b}})
        if (iv->has_ci() && iv->hi - iv->lo > std::fabs(iv->value))
            fit.warnings.push_back(std::string("IsoFLOP: the ") + fmt(100 * opt.confidence) + "% interval of " + name + " [" +
                                   fmt(iv->lo) + ", " + fmt(iv->hi) + "] is wider than its value " + fmt(iv->value));
    return fit;
}

}  // namespace quintet
