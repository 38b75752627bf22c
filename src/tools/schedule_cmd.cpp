// `quintet schedule`: prints a pipeline schedule without running a model: the simulated timeline
// of every stage, each stage's action list, idle (bubble) fractions and peak in-flight
// activations, and the bubble beside its formula (parallel/pipeline_schedule.hpp, docs/math.md
// §7.1). Runs on one process (rank 0) and makes no MPI calls; bad values are ConfigErrors.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "quintet/core/error.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"
#include "quintet/tools/commands.hpp"

namespace quintet {
namespace {

namespace po = boost::program_options;

const char* kUsage =
    "quintet schedule: simulate a pipeline schedule and print its timeline and bubble.\n"
    "\n"
    "Usage: quintet schedule --pp P --microbatches M [--schedule 1f1b|gpipe|interleaved|zb_h1|zbv]\n"
    "                        [--virtual-stages V] [--forward-cost 1 --backward-cost 2]\n"
    "                        [--weight-cost W]\n"
    "\n"
    "All stages run their action lists together; transfers take no time and a stage waits in a\n"
    "recv until its input was sent. Costs are one microbatch through one stage's layers (a chunk\n"
    "of an interleaved or zbv stage costs 1/V of it). The zero-bubble schedules split each\n"
    "backward into B (the input's gradient, --backward-cost minus --weight-cost) and W (the\n"
    "weights' gradients, --weight-cost, default half the backward). The bubble is the idle\n"
    "fraction of the step, theory (p-1)/(m+p-1) for 1f1b and gpipe, (p-1)/(V*m+p-1) for\n"
    "interleaved, (p-1)/(3m+p-1) for zb_h1 (m >= p) and (p-1)/(6m+p-1) for zbv (m >= 2p-1), the\n"
    "last two with forward = B = W.\n"
    "\n"
    "Options";

[[noreturn]] void bad_option(const std::string& option, const std::string& value,
                             const std::string& valid) {
    throw ConfigError("schedule option --" + option + " = '" + value + "': " + valid);
}

}  // namespace

int schedule_main(int argc, char** argv) {
    int pp = 0, m = 0, v = 0, width = 0;
    double tf = 1.0, tb = 2.0, tw = -1.0;
    std::string kind;
    bool transfers = false;
    po::options_description opts(kUsage);
    opts.add_options()
        ("help,h", "print this help")
        ("pp", po::value<int>(&pp)->required(), "pipeline stages P (parallel.pp)")
        ("microbatches", po::value<int>(&m)->required(), "microbatches per step M (parallel.microbatches)")
        ("schedule", po::value<std::string>(&kind),
         "1f1b | gpipe | interleaved | zb_h1 | zbv (parallel.schedule); default interleaved when "
         "--virtual-stages > 1, else 1f1b")
        ("virtual-stages", po::value<int>(&v),
         "chunks per stage V (parallel.virtual_stages); default 2 for interleaved and zbv, else 1")
        ("forward-cost", po::value<double>(&tf)->default_value(1.0, "1"), "forward time of one microbatch on one stage")
        ("backward-cost", po::value<double>(&tb)->default_value(2.0, "2"), "backward time of one microbatch on one stage")
        ("weight-cost", po::value<double>(&tw),
         "zb_h1, zbv: the weight-gradient part W of the backward (default half of it)")
        ("width", po::value<int>(&width)->default_value(160),
         "wrap the chart at this many characters (0 = never)")
        ("transfers", po::bool_switch(&transfers), "list sends and recvs too (rF/sF recv/send fwd, rB/sB bwd)");
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(argc, argv).options(opts).run(), vm);
        if (vm.count("help")) {
            std::cout << opts << '\n';
            return 0;
        }
        po::notify(vm);
    } catch (const po::error& e) {
        throw ConfigError(std::string("schedule: ") + e.what() + " (see quintet schedule --help)");
    }
    if (kind.empty()) kind = vm.count("virtual-stages") && v > 1 ? "interleaved" : "1f1b";
    if (!vm.count("virtual-stages")) v = kind == "interleaved" || kind == "zbv" ? 2 : 1;
    auto num = [](double x) {
        char b[32];
        std::snprintf(b, sizeof b, "%g", x);
        return std::string(b);
    };
    if (!(tf > 0)) bad_option("forward-cost", num(tf), "must be > 0");
    if (!(tb > 0)) bad_option("backward-cost", num(tb), "must be > 0");
    if (!vm.count("weight-cost")) tw = tb / 2;
    if (!(tw > 0 && tw < tb)) bad_option("weight-cost", num(tw), "must be > 0 and < --backward-cost");
    if (width < 0) bad_option("width", std::to_string(width), "must be >= 0");
    if (pp > 64) bad_option("pp", std::to_string(pp), "must be <= 64 for a chart");
    if (m > 1024) bad_option("microbatches", std::to_string(m), "must be <= 1024 for a chart");
    // The options set the deck keys of the same name (--pp = parallel.pp, ...).
    if (std::string err = schedule_check(kind, pp, m, v, 0); !err.empty())
        throw ConfigError("schedule: " + err);

    const Simulation sim = simulate(kind, pp, m, v, tf, tb, tw);
    const double theory = bubble_theory(kind, pp, m, v);
    const bool split = schedule_splits_backward(kind);
    if (split)
        std::printf("schedule %s: pp=%d microbatches=%d virtual_stages=%d forward=%g backward=%g (B %g + W %g)\n\n",
                    kind.c_str(), pp, m, v, tf, tb, tb - tw, tw);
    else
        std::printf("schedule %s: pp=%d microbatches=%d virtual_stages=%d forward=%g backward=%g\n\n",
                    kind.c_str(), pp, m, v, tf, tb);
    std::fputs(render_timeline(sim, pp, width).c_str(), stdout);
    std::printf("\nactions (compute order%s):\n", transfers ? ", with transfers" : "");
    for (int s = 0; s < pp; ++s)
        std::printf("stage %d: %s\n", s,
                    format_actions(make_schedule(kind, pp, s, m, v), v, transfers).c_str());
    // Interleaved peaks count chunk-microbatches, each 1/v of a stage's activations.
    std::printf("\nstage      busy     idle  peak in-flight %s\n",
                v > 1 ? "(chunk-microbatches = x/v microbatches)" : "(microbatches)");
    double idle_sum = 0;
    for (int s = 0; s < pp; ++s) {
        const StageTimeline& T = sim.stages[s];
        idle_sum += T.idle_fraction;
        std::printf("%5d %9g %7.2f%%  %d", s, T.busy, 100 * T.idle_fraction, T.peak_in_flight);
        if (v > 1) std::printf(" (%g)", double(T.peak_in_flight) / v);
        std::printf("\n");
    }
    std::printf("\nmakespan %g (ideal %g)\n", sim.makespan, m * (tf + tb));
    const char* formula = kind == "interleaved" ? "(p-1)/(v*m+p-1)"
                          : kind == "zb_h1"     ? "(p-1)/(3m+p-1), with forward = B = W, m >= p"
                          : kind == "zbv"       ? "(p-1)/(6m+p-1), with forward = B = W, m >= 2p-1"
                                                : "(p-1)/(m+p-1)";
    std::printf("bubble: simulated %.4f (mean over stages), theory %.4f = %s\n", idle_sum / pp,
                theory, formula);
    return 0;
}

}  // namespace quintet
