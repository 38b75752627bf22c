// `quintet laws INPUT [--bootstrap N] [--json] [-o PLOT.png] [--exclude-highest K]`: a scaling
// law fitted to a study's runs (study/law_points reads them, study/law_fit fits both ways,
// study/law_json writes the law file; scripts/plot_laws.py draws it). docs/scaling-laws.md.
// Runs without MPI.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/study/law_fit.hpp"
#include "quintet/study/law_json.hpp"
#include "quintet/study/law_points.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/tools/python.hpp"

namespace quintet {

namespace fs = std::filesystem;

namespace {

const char* kLawsUsage =
    "usage: quintet laws INPUT [--bootstrap N] [--json] [-o PLOT.png] [--exclude-highest K]\n"
    "                    [--loss val|train] [--params total|non_embedding|active] [--seed S]\n"
    "\n"
    "Fits a scaling law to the final losses of runs of N parameters trained on D tokens:\n"
    "  - IsoFLOP profiles (Hoffmann et al. 2022, approach 2): per budget C a parabola of the loss\n"
    "    in log N, its minimum N_opt(C), D_opt(C) = C / (6 N_opt), and N_opt ~ C^a, D_opt ~ C^b;\n"
    "  - the parametric law (approach 3): L(N, D) = E + A/N^alpha + B/D^beta, minimising the Huber\n"
    "    loss (delta 1e-3) of log L - log L^ by L-BFGS from 4500 starts, the best kept; the\n"
    "    compute-optimal N_opt(C) = G (C/6)^a, a = beta/(alpha+beta), b = alpha/(alpha+beta).\n"
    "Intervals: 95% percentile bootstrap over the runs resampled with replacement (IsoFLOP: within\n"
    "each budget). Runs that failed are listed and left out. docs/scaling-laws.md.\n"
    "\n"
    "  INPUT                 a study's study.h5 (or its folder) from a [laws] study deck, or a CSV\n"
    "                        whose header names its columns: N and loss, and D or C (= 6 N D);\n"
    "                        optional: budget (groups the IsoFLOP profiles; else C within 10%),\n"
    "                        run (a name), status (rows not done/ok are listed and left out)\n"
    "  --bootstrap N         resamples for the intervals (default 1000; 0: none)\n"
    "  --json                stdout is only the law as JSON: E, A, B, alpha, beta, a, b, each\n"
    "                        {\"value\", \"ci_low\", \"ci_high\"}, the points, the IsoFLOP minima,\n"
    "                        the bootstrap samples (the file quintet plan --law reads)\n"
    "  -o PLOT.png           IsoFLOP curves with their minima, loss against C with the fitted\n"
    "                        frontier, and the residuals (scripts/plot_laws.py, matplotlib)\n"
    "  --exclude-highest K   leave the K highest budgets out of both fits and report the law's\n"
    "                        prediction of their runs against the measured losses\n"
    "  --loss val|train      study.h5: the final validation loss (default) or the smoothed final\n"
    "                        training loss\n"
    "  --params KIND         study.h5: count N as total, non_embedding or active parameters\n"
    "                        (default: what the study's [laws] params said)\n"
    "  --seed S              of the bootstrap's resampling (default 0)\n";

long parse_count(const std::string& key, const std::string& v, long lo, long hi) {
    size_t pos = 0;
    long x = 0;
    try { x = std::stol(v, &pos); } catch (...) { pos = 0; }
    if (pos == 0 || pos != v.size() || x < lo || x > hi)
        throw ConfigError("laws: " + key + " = '" + v + "': expected an integer in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
    return x;
}

std::string g4(double v) {
    if (!std::isfinite(v)) return "-";
    char b[32];
    std::snprintf(b, sizeof b, std::fabs(v) >= 1e5 || (std::fabs(v) < 1e-3 && v != 0) ? "%.4e" : "%.5g", v);
    return b;
}

void row(const char* name, const Interval& iv) {
    std::printf("  %-24s %12s %12s %12s\n", name, g4(iv.value).c_str(), g4(iv.lo).c_str(), g4(iv.hi).c_str());
}

}  // namespace

int laws_main(int argc, char** argv) {
    std::string input, out_png, loss = "val", params;
    bool json = false;
    long exclude = 0;
    LawFitOptions opt;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&](const std::string& key) {
            if (a.rfind(key + "=", 0) == 0) return a.substr(key.size() + 1);
            if (a == key && i + 1 < argc) return std::string(argv[++i]);
            throw ConfigError("laws: " + key + " needs a value (see quintet laws --help)");
        };
        auto is = [&](const std::string& key) { return a == key || a.rfind(key + "=", 0) == 0; };
        if (a == "-h" || a == "--help") {
            std::cout << kLawsUsage;
            return 0;
        } else if (a == "--json") json = true;
        else if (is("--bootstrap")) opt.bootstrap = int(parse_count("--bootstrap", value("--bootstrap"), 0, 1000000));
        else if (is("--exclude-highest")) exclude = parse_count("--exclude-highest", value("--exclude-highest"), 0, 1000000);
        else if (is("--seed")) opt.seed = uint64_t(parse_count("--seed", value("--seed"), 0, 1L << 62));
        else if (is("--loss")) {
            loss = value("--loss");
            if (loss != "val" && loss != "train") throw ConfigError("laws: --loss = '" + loss + "': expected val or train");
        } else if (is("--params")) {
            params = value("--params");
            if (params != "total" && params != "non_embedding" && params != "active")
                throw ConfigError("laws: --params = '" + params + "': expected total, non_embedding or active");
        } else if (a == "-o" || is("--output")) {
            if (a == "-o") {
                if (i + 1 >= argc) throw ConfigError("laws: -o needs a value (the PNG to write)");
                out_png = argv[++i];
            } else out_png = value("--output");
        } else if (a.rfind("-", 0) == 0) throw ConfigError("laws: unknown option '" + a + "' (see quintet laws --help)");
        else if (input.empty()) input = a;
        else throw ConfigError("laws: unexpected argument '" + a + "' (one INPUT)");
    }
    if (input.empty()) throw ConfigError(std::string("laws: no INPUT given\n") + kLawsUsage);
    // Everything that can stop the command is checked before the fit, so nothing is left half-written.
    std::string python;
    if (!out_png.empty()) {
        const fs::path dir = fs::absolute(out_png).parent_path();
        if (!fs::is_directory(dir)) throw ConfigError("laws: -o " + out_png + ": the folder " + dir.string() + " does not exist");
        python = plotting_python();
    }
    LawReport rep;
    rep.options = opt;
    rep.input = read_law_input(input, loss, params);
    std::set<double> budgets;
    for (const auto& p : rep.input.points) budgets.insert(p.budget);
    if (exclude > 0) {
        if (size_t(exclude) >= budgets.size())
            throw ConfigError("laws: --exclude-highest " + std::to_string(exclude) + " leaves no budget to fit (the input has " +
                              std::to_string(budgets.size()) + ")");
        auto it = budgets.end();
        std::advance(it, -exclude);
        const double cut = *it;
        std::vector<LawPoint> keep;
        for (const auto& p : rep.input.points) (p.budget >= cut ? rep.heldout : keep).push_back(p);
        rep.input.points = keep;
        budgets.erase(it, budgets.end());
    }
    if (rep.input.points.size() < 5) {
        std::string why;
        for (const auto& [run, w] : rep.input.excluded) why += "\n  left out: " + run + ": " + w;
        throw ConfigError("laws: " + std::to_string(rep.input.points.size()) + " run(s) to fit from " + input +
                          ": the law L = E + A/N^alpha + B/D^beta has 5 parameters; give at least 5 runs" + why);
    }
    const double t0 = now_s();
    rep.fit = fit_parametric(rep.input.points, opt);
    rep.isoflop = fit_isoflop(rep.input.points, opt);
    const double took = now_s() - t0;
    const std::string text = law_json(rep);
    if (!out_png.empty()) {
        // The JSON beside the PNG's temporary name; the PNG appears whole or not at all.
        const std::string tmp_json = out_png + ".tmp.json", tmp_png = out_png + ".tmp.png";
        std::ofstream(tmp_json) << text;
        const int rc = run_process({python, project_script("plot_laws.py"), tmp_json, tmp_png});
        fs::remove(tmp_json);
        if (rc != 0 || !fs::exists(tmp_png)) {
            fs::remove(tmp_png);
            throw ConfigError("laws: plot_laws.py exited " + std::to_string(rc) + "; no " + out_png + " written");
        }
        fs::rename(tmp_png, out_png);
    }
    auto warnings = [&] {
        std::fflush(stdout);
        for (const auto& w : rep.fit.warnings) std::fprintf(stderr, "laws: warning: %s\n", w.c_str());
        for (const auto& w : rep.isoflop.warnings) std::fprintf(stderr, "laws: warning: %s\n", w.c_str());
    };
    if (json) {
        warnings();
        std::cout << text;
        return 0;
    }
    const ParametricFit& f = rep.fit;
    std::printf("quintet laws %s: %zu run(s) in %zu budget(s); N = %s, loss = %s\n", input.c_str(), rep.input.points.size(),
                budgets.size(), rep.input.params.empty() ? "the CSV's N" : (rep.input.params + " parameters").c_str(),
                rep.input.loss.c_str());
    for (const auto& [run, w] : rep.input.excluded) std::printf("left out: %s: %s\n", run.c_str(), w.c_str());
    std::printf("\nparametric law L(N, D) = E + A/N^alpha + B/D^beta (approach 3): Huber delta %g on log L, L-BFGS from %d "
                "starts, best kept\n", opt.huber_delta, f.starts);
    if (opt.bootstrap > 0)
        std::printf("intervals: %.0f%% percentile bootstrap, %d of %d resamples of the runs converged\n", 100 * opt.confidence,
                    f.replicates, opt.bootstrap);
    std::printf("  %-24s %12s %12s %12s\n", "parameter", "value", "ci_low", "ci_high");
    row("E", f.E), row("A", f.A), row("B", f.B), row("alpha", f.alpha), row("beta", f.beta);
    row("a = beta/(alpha+beta)", f.a), row("b = alpha/(alpha+beta)", f.b), row("G", f.G);
    double ss = 0;
    for (const auto& p : rep.input.points) {
        const double r = std::log(p.loss) - std::log(law_loss(f.p, p.N, p.D));
        ss += r * r;
    }
    std::printf("compute-optimal: N_opt(C) = G (C/6)^a, D_opt(C) = C / (6 N_opt); rms residual of log L %.3g; "
                "fitted in %.2f s\n", std::sqrt(ss / double(rep.input.points.size())), took);
    std::printf("\nIsoFLOP profiles (approach 2): a parabola of the loss in log N per budget\n");
    std::printf("  %-12s %5s %12s %12s %12s\n", "budget C", "runs", "N_opt", "D_opt", "loss at N_opt");
    for (const auto& b : rep.isoflop.budgets) {
        if (b.ok)
            std::printf("  %-12s %5d %12s %12s %12s%s\n", g4(b.C).c_str(), b.points, g4(b.N_opt).c_str(), g4(b.D_opt).c_str(),
                        g4(b.loss_opt).c_str(), b.used ? "" : "  (outside the sampled N: not in a, b)");
        else std::printf("  %-12s %5d  no minimum: %s\n", g4(b.C).c_str(), b.points, b.why.c_str());
    }
    if (rep.isoflop.ok) {
        std::printf("  %-24s %12s %12s %12s\n", "", "value", "ci_low", "ci_high");
        row("a (N_opt ~ C^a)", rep.isoflop.a), row("b (D_opt ~ C^b)", rep.isoflop.b);
        std::printf("  the parametric law's a = %s, b = %s for comparison\n", g4(f.a.value).c_str(), g4(f.b.value).c_str());
    } else std::printf("  a, b: %s\n", rep.isoflop.why.c_str());
    if (!rep.heldout.empty()) {
        std::printf("\nheld out (--exclude-highest %ld): the law fitted without them, against their measured loss\n", exclude);
        std::printf("  %-28s %12s %12s %10s %10s %9s\n", "run", "C", "N", "measured", "predicted", "error");
        for (const auto& p : rep.heldout) {
            const double pred = law_loss(f.p, p.N, p.D);
            std::printf("  %-28s %12s %12s %10.4f %10.4f %8.2f%%\n", p.run.c_str(), g4(p.C).c_str(), g4(p.N).c_str(), p.loss, pred,
                        100 * (pred - p.loss) / p.loss);
        }
    }
    if (!out_png.empty()) std::printf("\nwrote %s\n", out_png.c_str());
    warnings();
    return 0;
}

}  // namespace quintet
