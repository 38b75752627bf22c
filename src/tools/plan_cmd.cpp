// `quintet plan DECK [--section.key=value ...] --world N [--json]`: every layout of N ranks with
// its memory, traffic, bubble and predicted speed (docs/planner.md; the model in
// train/planner.cpp).
// Runs without MPI (no mpirun): --measure launches `mpirun -n 2 quintet peak --links` itself.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/perf/host_peak.hpp"
#include "quintet/perf/planner.hpp"

namespace quintet {

namespace {

const char* kPlanUsage =
    "usage: quintet plan DECK [--section.key=value ...] --world N [options]\n"
    "\n"
    "Every (tp, cp, dp, pp, ep) of N ranks for the deck's model and batch: memory per rank by\n"
    "category (the largest rank), bytes per step on each axis, the pipeline bubble and the\n"
    "predicted step time and tokens/s, sorted by tokens/s; invalid layouts are listed with the\n"
    "reason. Microbatches, ZeRO and recompute are the deck's unless --sweep lists them. Runs\n"
    "without mpirun. docs/planner.md derives every term.\n"
    "\n"
    "options:\n"
    "  --world N              ranks (required)\n"
    "  --json                 stdout is only a JSON list, one object per row (docs/planner.md)\n"
    "  --sweep KEY=V1,V2,...  also vary parallel.microbatches, parallel.zero or train.recompute\n"
    "                         (repeatable)\n"
    "  --device-memory GiB    mark layouts whose peak resident set exceeds it\n"
    "  --matmul-gflops G      one core's sgemm rate (default: `quintet peak`'s, cached per host)\n"
    "  --cores C              cores per node (default: this host's)\n"
    "  --ranks-per-node R     (default: all ranks on one node)\n"
    "  --threads T            threads per rank (default: cores / ranks per node)\n"
    "  --link-gbs B           link bandwidth per rank, GB/s (default: measured and cached, else 10)\n"
    "  --latency-us L         per-message latency (default: measured and cached, else 5)\n"
    "  --measure              measure the link now (mpirun -n 2 quintet peak --links) and cache it\n"
    "  --runtime-mib M        a rank's resident set besides the model (default: calibrated)\n";

double parse_number(const std::string& key, const std::string& v) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(x > 0))
        throw ConfigError("plan: " + key + " = '" + v + "': expected a positive number");
    return x;
}

// This executable's path, for launching it under mpirun.
std::string self_exe() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, size_t(n)) : "quintet";
}

// Runs `mpirun -n 2 quintet peak --links` and parses its last line.
LinkFigures measure_links() {
    const std::string cmd = "mpirun --oversubscribe -n 2 " + self_exe() + " peak --links 2>&1";
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) throw ConfigError("plan --measure: cannot run '" + cmd + "'");
    std::string out, last;
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
        out += line;
        if (std::string(line).rfind("link_gbs=", 0) == 0) last = line;
    }
    const int rc = pclose(f);
    LinkFigures l;
    if (rc != 0 || std::sscanf(last.c_str(), "link_gbs=%lf latency_s=%lf", &l.gbs, &l.latency_s) != 2)
        throw ConfigError("plan --measure: '" + cmd + "' failed:\n" + out);
    return l;
}

std::string mib(double b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.0f", b / 1048576);
    return s;
}

}  // namespace

int plan_main(int argc, char** argv) {
    runtime_base_estimate();  // this process's size before it plans anything
    std::string deck_path;
    std::vector<std::string> overrides;
    int world = 0;
    bool json = false, measure = false;
    PlanSweep sweep;
    MachineModel mm;
    mm.cores = host_cores();
    double device_gib = 0, runtime_mib = -1;
    bool have_matmul = false, have_link = false, have_latency = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i], v;
        auto value = [&](const std::string& key) {
            if (a.rfind(key + "=", 0) == 0) return a.substr(key.size() + 1);
            if (a == key && i + 1 < argc) return std::string(argv[++i]);
            throw ConfigError("plan: " + key + " needs a value (see quintet plan --help)");
        };
        auto is = [&](const std::string& key) { return a == key || a.rfind(key + "=", 0) == 0; };
        if (a == "-h" || a == "--help") {
            std::cout << kPlanUsage;
            return 0;
        } else if (is("--world")) {
            v = value("--world");
            world = std::atoi(v.c_str());
            if (world < 1 || std::to_string(world) != v)
                throw ConfigError("plan: --world = '" + v + "': expected a positive integer");
        } else if (a == "--json") json = true;
        else if (a == "--measure") measure = true;
        else if (is("--sweep")) {
            v = value("--sweep");
            const auto eq = v.find('=');
            const std::string key = v.substr(0, eq);
            const auto vals = eq == std::string::npos ? std::vector<std::string>{} : split_list(v.substr(eq + 1), ',');
            if (vals.empty()) throw ConfigError("plan: --sweep '" + v + "': expected KEY=V1,V2,...");
            Deck probe;
            auto opts = deck_options(probe);
            for (const auto& x : vals) {  // each value checked as the deck would check it
                for (auto& o : opts)
                    if (o.key == key) o.set(x);
                if (key == "parallel.microbatches") sweep.microbatches.push_back(std::atoi(x.c_str()));
                else if (key == "parallel.zero") sweep.zero.push_back(std::atoi(x.c_str()));
                else if (key == "train.recompute") sweep.recompute.push_back(x);
                else
                    throw ConfigError("plan: --sweep key '" + key +
                                      "': expected parallel.microbatches, parallel.zero or train.recompute");
            }
        } else if (is("--device-memory")) device_gib = parse_number("--device-memory", value("--device-memory"));
        else if (is("--matmul-gflops")) mm.matmul_gflops_per_core = parse_number("--matmul-gflops", value("--matmul-gflops")), have_matmul = true;
        else if (is("--cores")) mm.cores = int(parse_number("--cores", value("--cores")));
        else if (is("--ranks-per-node")) mm.ranks_per_node = int(parse_number("--ranks-per-node", value("--ranks-per-node")));
        else if (is("--threads")) mm.threads_per_rank = int(parse_number("--threads", value("--threads")));
        else if (is("--link-gbs")) mm.link_gbs = parse_number("--link-gbs", value("--link-gbs")), have_link = true;
        else if (is("--latency-us")) mm.link_latency_s = parse_number("--latency-us", value("--latency-us")) * 1e-6, have_latency = true;
        else if (is("--runtime-mib")) runtime_mib = parse_number("--runtime-mib", value("--runtime-mib"));
        else if (a.rfind("--", 0) == 0 && a.find('.') != std::string::npos) overrides.push_back(a);
        else if (a.rfind("--", 0) == 0) throw ConfigError("plan: unknown option '" + a + "' (see quintet plan --help)");
        else if (deck_path.empty()) deck_path = a;
        else throw ConfigError("plan: unexpected argument '" + a + "' (one DECK)");
    }
    if (deck_path.empty()) throw ConfigError(std::string("plan: no DECK given\n") + kPlanUsage);
    if (world == 0) throw ConfigError("plan: --world N is required (the number of ranks to plan for)");
    Deck deck = deck_load(deck_path, overrides);
    const TokenFileInfo data = token_file_info(deck.data.path);
    deck.model.vocab_size = data.vocab_size;
    mm.data_bytes = double(data.n_tokens) * 4;
    mm.runtime_base_bytes = runtime_mib >= 0 ? runtime_mib * 1048576 : runtime_base_estimate();
    std::string notes;
    if (!have_matmul) {
        double g = 0;
        if (!read_sgemm_cache(&g)) {
            auto be = make_cpu_backend(1);
            g = cpu_measure_sgemm_gflops(*be, 1024, 5);
            write_sgemm_cache(g);
            notes += "sgemm measured now (1 thread): " + std::to_string(g) + " GFLOP/s; ";
        }
        mm.matmul_gflops_per_core = g;
    }
    LinkFigures link;
    if (measure) {
        link = measure_links();
        write_link_cache(link);
    }
    if (measure || read_link_cache(&link)) {
        if (!have_link) mm.link_gbs = link.gbs;
        if (!have_latency) mm.link_latency_s = link.latency_s;
    } else if (!have_link) {
        notes += "link bandwidth assumed " + std::to_string(mm.link_gbs) + " GB/s (measure it with --measure); ";
    }
    const auto rows = plan_all(deck, world, mm, sweep, device_gib * 1073741824.0);
    if (json) {
        std::cout << plan_json(rows);
        return 0;
    }
    std::printf("quintet plan %s for %d rank(s): %d cores/node, sgemm %.1f GFLOP/s per core, link %.1f GB/s, "
                "latency %.1f us\n", deck_path.c_str(), world, mm.cores, mm.matmul_gflops_per_core, mm.link_gbs,
                mm.link_latency_s * 1e6);
    if (!notes.empty()) std::printf("note: %s\n", notes.c_str());
    std::printf("\n%-4s %-4s %-4s %-4s %-4s %4s %4s %-9s | %7s %7s %7s %7s %7s %7s %8s | %9s %9s %9s %9s %9s | %6s %8s %9s\n",
                "tp", "cp", "dp", "pp", "ep", "mb", "zero", "recompute", "params", "grads", "optim", "activ",
                "buffers", "runtime", "total", "tp MiB", "cp MiB", "dp MiB", "ep MiB", "pp MiB", "bubble",
                "step s", "tokens/s");
    int invalid = 0;
    for (const auto& r : rows) {
        if (!r.valid) {
            ++invalid;
            continue;
        }
        const MemoryBytes& m = r.memory;
        std::printf("%-4d %-4d %-4d %-4d %-4d %4d %4d %-9s | %7s %7s %7s %7s %7s %7s %8s | %9s %9s %9s %9s %9s | %6.3f %8.3f %9.0f%s\n",
                    r.tp, r.cp, r.dp, r.pp, r.ep, r.microbatches, r.zero, r.recompute.c_str(), mib(m.params).c_str(),
                    mib(m.grads).c_str(), mib(m.optimizer).c_str(), mib(m.activations).c_str(), mib(m.buffers).c_str(),
                    mib(m.runtime).c_str(), mib(m.total).c_str(), mib(r.comm_bytes.tp).c_str(), mib(r.comm_bytes.cp).c_str(),
                    mib(r.comm_bytes.dp).c_str(), mib(r.comm_bytes.ep).c_str(), mib(r.comm_bytes.pp).c_str(), r.bubble,
                    r.step_time_s, r.tokens_per_s, r.fits ? "" : "  (does not fit --device-memory)");
    }
    std::printf("(memory in MiB for the largest rank; traffic in MiB per step sent by one rank)\n");
    if (invalid) {
        std::printf("\n%d invalid layout(s):\n", invalid);
        for (const auto& r : rows)
            if (!r.valid)
                std::printf("  tp=%d cp=%d dp=%d pp=%d ep=%d mb=%d zero=%d recompute=%s: %s\n", r.tp, r.cp, r.dp, r.pp,
                            r.ep, r.microbatches, r.zero, r.recompute.c_str(), r.reason.c_str());
    }
    return 0;
}

}  // namespace quintet
