// `quintet plan DECK [--section.key=value ...] --world N [--json]`: every layout of N ranks with
// its memory, traffic, bubble and predicted speed (docs/planner.md; the model in
// perf/planner.cpp, perf/gpu_cost.cpp).
// Runs without MPI (no mpirun): --measure launches `mpirun -n 2 quintet peak --links` itself.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/core/process.hpp"
#include "quintet/core/text.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/data/dataset.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/perf/hardware.hpp"
#include "quintet/perf/host_peak.hpp"
#include "quintet/perf/planner.hpp"
#include "quintet/study/law_fit.hpp"
#include "quintet/study/law_json.hpp"
#include "quintet/study/laws_study.hpp"
#include "quintet/tools/commands.hpp"

namespace quintet {

namespace {

const char* kPlanUsage =
    "usage: quintet plan DECK [--section.key=value ...] --world N [options]\n"
    "\n"
    "Every (tp, cp, dp, pp, ep) of N ranks for the deck's model and batch: memory per rank by\n"
    "category (the largest rank), bytes per step on each axis, the pipeline bubble and the\n"
    "predicted step time and tokens/s, sorted by tokens/s; invalid layouts are listed with the\n"
    "reason. Micro-batch size, microbatches, ZeRO and recompute are the deck's unless --sweep lists them (with\n"
    "train.global_batch set, each layout's microbatches follow from its dp). A --parallel.KEY=V\n"
    "(tp, cp, dp, pp, ep) on the command line keeps only the layouts with that value. Runs without\n"
    "mpirun. docs/planner.md derives every term.\n"
    "\n"
    "options:\n"
    "  --world N              ranks (required; a positive integer up to 10000000)\n"
    "  --hardware NAME|FILE   host (this machine, measured; the default), a100-sxm-80g, h100-sxm,\n"
    "                         h200, or a hardware file (docs/planner.md §6)\n"
    "  --vocab-size V         the vocabulary size, instead of the token file's (model.vocab_size)\n"
    "  --json                 stdout is only a JSON list, one object per row (docs/planner.md)\n"
    "  --top K                show the K fastest layouts (table default 20; JSON default all;\n"
    "                         0 = all)\n"
    "  --sweep KEY=V1,V2,...  also vary parallel.microbatches, parallel.zero, train.recompute or\n"
    "                         data.micro_batch_size (repeatable)\n"
    "  --device-memory GiB    the memory a layout must fit in (default: the device's; host: none)\n"
    "  --overlap LIST         GPU: the axes whose collectives overlap compute (tp, cp, dp, ep, pp or\n"
    "                         none; default quintet's: dp buckets, cp ring, ep exchange)\n"
    "  --attention KIND       GPU: flash (default, quintet's) or unfused (scores materialised)\n"
    "host only:\n"
    "  --matmul-gflops G      one core's sgemm rate (default: `quintet peak`'s, cached per host)\n"
    "  --cores C              cores per node (default: this host's)\n"
    "  --ranks-per-node R     (default: all ranks on one node)\n"
    "  --threads T            threads per rank (default: cores / ranks per node)\n"
    "  --link-gbs B           link bandwidth per rank, GB/s (default: measured and cached, else 10)\n"
    "  --latency-us L         per-message latency (default: measured and cached, else 5)\n"
    "  --measure              measure the link now (mpirun -n 2 quintet peak --links) and cache it\n"
    "  --runtime-mib M        a rank's resident set besides the model (default: calibrated)\n"
    "from a scaling law (docs/scaling-laws.md, \"Reading quintet plan --budget\"):\n"
    "  --budget FLOPS         the compute-optimal N, D and loss (with its interval) of C = 6 N D\n"
    "                         FLOPs under --law; the family's shape nearest to N is planned, and\n"
    "                         each layout's row gets the days its D tokens take\n"
    "  --target-loss L        instead of --budget: the smallest budget whose optimum reaches L\n"
    "  --law LAW.json         a law from quintet laws --json\n"
    "  --family RULE          the shapes to pick from: [widths=W1,W2,...] [aspect=A] [head_dim=H]\n"
    "                         [ffn_ratio=R] [q_per_kv=G] (default: the law's rule, else the deck's\n"
    "                         own ratios; without widths every width of whole heads is a candidate)\n";

double parse_number(const std::string& key, const std::string& v) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(x > 0) || !std::isfinite(x))
        throw ConfigError("plan: " + key + " = '" + v + "': expected a positive number");
    return x;
}

int parse_count(const std::string& key, const std::string& v, long lo, long hi) {
    size_t pos = 0;
    long x = 0;
    try { x = std::stol(v, &pos); } catch (...) { pos = 0; }
    if (pos == 0 || pos != v.size() || x < lo || x > hi || std::to_string(x) != v)
        throw ConfigError("plan: " + key + " = '" + v + "': expected an integer in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
    return int(x);
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

// Human units, 3 significant digits: nothing prints as 0 or 1 that is not.
std::string si(double v, const char* unit = "") {
    if (!std::isfinite(v)) return "-";
    static const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
    int i = 0;
    double a = std::fabs(v);
    while (a >= 999.5 && i < 6) a /= 1000, v /= 1000, ++i;
    char b[32];
    if (a == 0) std::snprintf(b, sizeof b, "0%s", unit);
    else if (a < 1 && i == 0) std::snprintf(b, sizeof b, "%.3g%s", v, unit);
    else std::snprintf(b, sizeof b, a < 10 ? "%.2f%s%s" : a < 100 ? "%.1f%s%s" : "%.0f%s%s", v, prefixes[i], unit);
    return b;
}
std::string bytes(double v) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    while (std::fabs(v) >= 1023.5 && i < 5) v /= 1024, ++i;
    char b[32];
    std::snprintf(b, sizeof b, std::fabs(v) < 10 && i > 0 ? "%.2f %s" : std::fabs(v) < 100 && i > 0 ? "%.1f %s" : "%.0f %s",
                  v, units[i]);
    return b;
}
// Wall-clock time of a run: "3.2 days", "5.1 hours", "12 min".
std::string days(double s) {
    char b[32];
    if (!std::isfinite(s)) return "-";
    if (s >= 86400) std::snprintf(b, sizeof b, "%.3g days", s / 86400);
    else if (s >= 3600) std::snprintf(b, sizeof b, "%.3g hours", s / 3600);
    else std::snprintf(b, sizeof b, "%.3g min", s / 60);
    return b;
}

std::string seconds(double s) {
    char b[32];
    if (!std::isfinite(s)) return "-";
    if (s == 0) return "0";
    if (s >= 100) std::snprintf(b, sizeof b, "%.0f s", s);
    else if (s >= 1) std::snprintf(b, sizeof b, "%.3g s", s);
    else if (s >= 1e-3) std::snprintf(b, sizeof b, "%.3g ms", s * 1e3);
    else std::snprintf(b, sizeof b, "%.3g us", s * 1e6);
    return b;
}

// --budget / --target-loss: the law's compute-optimal allocation and the family's nearest shape.
struct BudgetChoice {
    double flops = 0, n = 0, d = 0, loss = 0, loss_lo = NAN, loss_hi = NAN;
    Shape shape;
    double shape_n = 0, shape_d = 0, shape_loss = 0;
    std::string params, family;  // how N is counted; where the shapes came from
};

BudgetChoice choose_budget(const LawFile& law, double budget, double target_loss, const std::string& family_arg,
                           const Deck& deck, const std::string& law_path) {
    BudgetChoice b;
    b.params = law.params.empty() ? "active" : law.params;
    if (b.params != "total" && b.params != "non_embedding" && b.params != "active")
        throw ConfigError("plan: --law " + law_path + ": params = '" + b.params + "' (expected total, non_embedding or active)");
    if (target_loss > 0) {
        b.flops = law_budget_for_loss(law.p, target_loss);
        if (!std::isfinite(b.flops))
            throw ConfigError("plan: --target-loss " + std::to_string(target_loss) + ": at or below the law's irreducible loss E = " +
                              std::to_string(law.p.E) + " (no budget reaches it)");
    } else b.flops = budget;
    b.n = law_n_opt(law.p, b.flops), b.d = law_d_opt(law.p, b.flops), b.loss = law_loss(law.p, b.n, b.d);
    // The loss's interval: each bootstrap law's prediction at the central allocation.
    std::vector<double> losses;
    for (const auto& x : law.samples) losses.push_back(law_loss({x[0], x[1], x[2], x[3], x[4]}, b.n, b.d));
    if (losses.size() >= 2) std::tie(b.loss_lo, b.loss_hi) = percentile_interval(losses, law.confidence);
    // The family: --family, else the law's rule (its widths left out: the plan's N is not the study's),
    // else the deck's own ratios.
    FamilyRule rule;
    std::vector<Shape> shapes;
    if (!family_arg.empty()) {
        rule = parse_family(family_arg, "plan: --family");
        b.family = "--family " + family_arg;
        shapes = family_candidates(rule, deck);
    } else if (!law.family.empty() && law.family.find("widths=") != std::string::npos) {
        rule = parse_family(law.family, "plan: the law's family");
        rule.widths.clear();
        std::string ratios;  // the rule without its study's widths
        for (const auto& item : split_list(law.family, ' '))
            if (item.rfind("widths=", 0) != 0) ratios += (ratios.empty() ? "" : " ") + item;
        b.family = "the law's family rule at any width (" + (ratios.empty() ? "the deck's ratios" : ratios) + ")";
        shapes = family_candidates(rule, deck);
    } else {
        b.family = "the deck's shape ratios at every width";
        shapes = family_candidates(rule, deck);
    }
    double best = INFINITY;
    for (const Shape& s : shapes) {
        Deck d = deck;
        for (const auto& [k, v] : s.keys)
            for (auto& o : deck_options(d))
                if (o.key == k) o.set(v);
        const double n = count_params(d.model).of(b.params);
        const double dist = std::fabs(std::log(n / b.n));
        if (dist < best) best = dist, b.shape = s, b.shape_n = n;
        // Enumerated widths ascend and N grows with them: past N_opt and getting farther, stop.
        if (rule.widths.empty() && n > b.n && dist > best) break;
    }
    if (!std::isfinite(best)) throw ConfigError("plan: the family has no shape to choose from");
    b.shape_d = b.flops / (6.0 * b.shape_n);
    b.shape_loss = law_loss(law.p, b.shape_n, b.shape_d);
    return b;
}

std::string budget_json(const BudgetChoice& b, const std::vector<PlanRow>& rows) {
    using nlohmann::ordered_json;
    auto num = [](double v) { return std::isfinite(v) ? ordered_json(v) : ordered_json(nullptr); };
    ordered_json shape = ordered_json::object();
    for (const auto& [k, v] : b.shape.keys) {
        char* end = nullptr;
        const long x = std::strtol(v.c_str(), &end, 10);
        shape[k] = *end ? ordered_json(v) : ordered_json(x);
    }
    ordered_json j;
    j["budget"] = {{"flops", b.flops},          {"N", b.n},
                   {"D", b.d},                  {"loss", b.loss},
                   {"loss_ci", {num(b.loss_lo), num(b.loss_hi)}},
                   {"shape", shape},            {"shape_N", b.shape_n},
                   {"shape_D", b.shape_d},      {"shape_loss", b.shape_loss},
                   {"params", b.params}};
    ordered_json layouts = ordered_json::parse(plan_json(rows));
    for (size_t i = 0; i < rows.size() && i < layouts.size(); ++i)
        layouts[i]["days"] = rows[i].valid && rows[i].tokens_per_s > 0 ? ordered_json(b.shape_d / rows[i].tokens_per_s / 86400.0)
                                                                       : ordered_json(nullptr);
    j["layouts"] = layouts;
    return j.dump(1) + "\n";
}

}  // namespace

int plan_main(int argc, char** argv) {
    runtime_base_estimate();  // this process's size before it plans anything
    std::string deck_path, hardware_name = "host", overlap_list, attention = "flash";
    std::vector<std::string> overrides;
    int world = 0, top = -1, vocab = 0;
    bool json = false, measure = false;
    PlanSweep sweep;
    MachineModel mm;
    mm.cores = host_cores();
    double device_gib = 0, runtime_mib = -1, budget = 0, target_loss = 0;
    std::string law_path, family_arg;
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
            world = parse_count("--world", v, 1, 10000000);
        } else if (a == "--json") json = true;
        else if (a == "--measure") measure = true;
        else if (is("--hardware")) hardware_name = value("--hardware");
        else if (is("--vocab-size")) vocab = parse_count("--vocab-size", value("--vocab-size"), 1, 1 << 30);
        else if (is("--top")) top = parse_count("--top", value("--top"), 0, 1 << 30);
        else if (is("--overlap")) overlap_list = value("--overlap");
        else if (is("--attention")) {
            attention = value("--attention");
            if (attention != "flash" && attention != "unfused")
                throw ConfigError("plan: --attention = '" + attention + "': expected flash or unfused");
        } else if (is("--sweep")) {
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
                if (key == "parallel.microbatches") sweep.microbatches.push_back(probe.parallel.microbatches);
                else if (key == "parallel.zero") sweep.zero.push_back(probe.parallel.zero);
                else if (key == "train.recompute") sweep.recompute.push_back(x);
                else if (key == "data.micro_batch_size") sweep.micro_batch_size.push_back(probe.data.micro_batch_size);
                else
                    throw ConfigError("plan: --sweep key '" + key +
                                      "': expected parallel.microbatches, parallel.zero, train.recompute or data.micro_batch_size");
            }
        } else if (is("--device-memory")) device_gib = parse_number("--device-memory", value("--device-memory"));
        else if (is("--matmul-gflops")) mm.matmul_gflops_per_core = parse_number("--matmul-gflops", value("--matmul-gflops")), have_matmul = true;
        else if (is("--cores")) mm.cores = parse_count("--cores", value("--cores"), 1, 1 << 20);
        else if (is("--ranks-per-node")) mm.ranks_per_node = parse_count("--ranks-per-node", value("--ranks-per-node"), 1, 1 << 20);
        else if (is("--threads")) mm.threads_per_rank = parse_count("--threads", value("--threads"), 1, 1 << 20);
        else if (is("--link-gbs")) mm.link_gbs = parse_number("--link-gbs", value("--link-gbs")), have_link = true;
        else if (is("--latency-us")) mm.link_latency_s = parse_number("--latency-us", value("--latency-us")) * 1e-6, have_latency = true;
        else if (is("--runtime-mib")) runtime_mib = parse_number("--runtime-mib", value("--runtime-mib"));
        else if (is("--budget")) budget = parse_number("--budget", value("--budget"));
        else if (is("--target-loss")) target_loss = parse_number("--target-loss", value("--target-loss"));
        else if (is("--law")) law_path = value("--law");
        else if (is("--family")) family_arg = value("--family");
        else if (a.rfind("--", 0) == 0 && a.find('.') != std::string::npos) overrides.push_back(a);
        else if (a.rfind("--", 0) == 0) throw ConfigError("plan: unknown option '" + a + "' (see quintet plan --help)");
        else if (deck_path.empty()) deck_path = a;
        else throw ConfigError("plan: unexpected argument '" + a + "' (one DECK)");
    }
    if (deck_path.empty()) throw ConfigError(std::string("plan: no DECK given\n") + kPlanUsage);
    if (world == 0) throw ConfigError("plan: --world N is required (the number of ranks to plan for)");
    if (budget > 0 && target_loss > 0) throw ConfigError("plan: --budget and --target-loss: give one (a budget, or the loss to reach)");
    const bool from_law = budget > 0 || target_loss > 0;
    if (from_law && law_path.empty())
        throw ConfigError(std::string("plan: ") + (budget > 0 ? "--budget" : "--target-loss") + " needs --law LAW.json (from quintet laws --json)");
    if (!from_law && (!law_path.empty() || !family_arg.empty()))
        throw ConfigError(std::string("plan: ") + (law_path.empty() ? "--family" : "--law") + " is used with --budget or --target-loss");
    LawFile law;
    if (from_law) law = read_law_file(law_path);
    if (!family_arg.empty()) parse_family(family_arg, "plan: --family");  // a bad rule stops before any work
    PlanTarget target;
    target.hardware = hardware_load(hardware_name);
    if (!overlap_list.empty()) target.framework = parse_overlap(overlap_list, target.framework);
    target.framework.unfused_attention = attention == "unfused";
    Deck deck = deck_load(deck_path, overrides);
    if (!sweep.microbatches.empty() && deck.train.global_batch > 0)
        throw ConfigError("plan: --sweep parallel.microbatches with train.global_batch = " +
                          std::to_string(deck.train.global_batch) +
                          ": each layout's microbatches follow from the global batch (set train.global_batch = 0 to sweep them)");
    // A --parallel.KEY=V given on the command line keeps the layouts with that value.
    PlanOnly only;
    for (const auto& o : overrides) {
        auto given = [&](const char* key) { return o.rfind(std::string("--") + key + "=", 0) == 0; };
        if (given("parallel.tp")) only.tp = deck.parallel.tp;
        if (given("parallel.cp")) only.cp = deck.parallel.cp;
        if (given("parallel.pp")) only.pp = deck.parallel.pp;
        if (given("parallel.ep")) only.ep = deck.parallel.ep;
        if (given("parallel.dp")) only.dp = deck.parallel.dp;
    }
    // The vocabulary: --vocab-size, model.vocab_size, or the token file's header.
    std::string notes;
    if (vocab > 0) deck.model.vocab_size = vocab;
    if (deck.model.vocab_size == 0) {
        const DataInfo data = data_info(deck.data.path);
        deck.model.vocab_size = data.vocab_size;
        // The sampler's two prefetch buffers of a replica's samples (the corpus is streamed).
        mm.data_bytes = data_buffer_bytes(deck.data, int64_t(deck.parallel.microbatches) * deck.data.micro_batch_size,
                                          data.vocab_size);
    }
    if (device_gib > 0) target.device_memory_bytes = device_gib * 1073741824.0;
    if (target.hardware.host) {
        mm.runtime_base_bytes = runtime_mib >= 0 ? runtime_mib * 1048576 : runtime_base_estimate();
        if (!have_matmul) {
            std::string from;
            mm.matmul_gflops_per_core = host_sgemm_gflops_per_core(&from);
            char b[64];
            std::snprintf(b, sizeof b, "sgemm %.4g GFLOP/s per core: ", mm.matmul_gflops_per_core);
            notes += b + from + "; ";
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
        target.machine = mm;
    }
    BudgetChoice choice;
    if (from_law) {
        choice = choose_budget(law, budget, target_loss, family_arg, deck, law_path);
        for (const auto& [k, v] : choice.shape.keys)
            for (auto& o : deck_options(deck))
                if (o.key == k) o.set(v);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<PlanRow> rows = plan_all(deck, world, target, sweep, only);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rows.empty()) {
        // The --parallel.KEY=V restrictions leave no (tp, cp, dp, pp, ep) of this world size.
        std::string given, divs;
        for (const auto& [key, v] : {std::pair<const char*, int>{"tp", only.tp}, {"cp", only.cp}, {"pp", only.pp},
                                     {"dp", only.dp}, {"ep", only.ep}})
            if (v) given += std::string(given.empty() ? "" : ", ") + "parallel." + key + " = " + std::to_string(v);
        for (int d = 1; d <= world && divs.size() < 80; ++d)
            if (world % d == 0) divs += (divs.empty() ? "" : ", ") + std::to_string(d);
        throw ConfigError("plan: no layout of " + std::to_string(world) + " ranks has " + given +
                          ": tp x cp x pp x dp must be " + std::to_string(world) + " (each a divisor of it: " + divs +
                          (divs.size() >= 80 ? ", ..." : "") + "), ep must divide dp x cp, and ep > 1 needs moe.experts > 0");
    }
    const bool none_valid = !rows.front().valid;  // sorted: valid rows first
    const std::string no_valid = "plan: none of the " + std::to_string(rows.size()) + " layouts of " +
                                 std::to_string(world) + " ranks is valid for this deck (" +
                                 (json ? "each row's reason is in the JSON" : "the reasons are listed above") + ")";
    if (json) {
        if (top > 0 && size_t(top) < rows.size()) rows.resize(size_t(top));
        std::cout << (from_law ? budget_json(choice, rows) : plan_json(rows)) << std::flush;  // before the error on stderr
        if (none_valid) throw ConfigError(no_valid);
        return 0;
    }
    const Hardware& hw = target.hardware;
    if (hw.host)
        std::printf("quintet plan %s for %d rank(s) on this host: %d cores/node, sgemm %.1f GFLOP/s per core, link %.1f GB/s, "
                    "latency %.1f us\n", deck_path.c_str(), world, mm.cores, mm.matmul_gflops_per_core, mm.link_gbs,
                    mm.link_latency_s * 1e6);
    else
        std::printf("quintet plan %s for %d %s: %s peak %sFLOP/s, %s memory, %s/s HBM; %d per node, NVLink %s/s, network %s/s "
                    "per device\n", deck_path.c_str(), world, hw.name.c_str(), deck.train.precision.c_str(),
                    si(hw.peak_tflops(deck.train.precision == "bf16") * 1e12).c_str(), bytes(hw.memory_bytes()).c_str(),
                    si(hw.memory_gbs * 1e9, "B").c_str(), hw.devices_per_node, si(hw.link_gbs * 1e9, "B").c_str(),
                    si(hw.network_gbs * 1e9, "B").c_str());
    size_t valid = 0, fitting = 0, ties = 0;
    for (const auto& r : rows) valid += r.valid, fitting += r.valid && r.fits, ties += r.tie;
    const PlanRow* any = nullptr;
    for (const auto& r : rows)
        if (r.valid) { any = &r; break; }
    if (any)
        std::printf("model: %s parameters (%s active per token), %s tokens per sample; %zu layouts, %zu valid, %zu fit; "
                    "planned in %.2f s\n", si(any->params_total).c_str(), si(any->params_active).c_str(),
                    si(deck.data.seq_len).c_str(), rows.size(), valid, fitting, took);
    if (!notes.empty()) std::printf("note: %s\n", notes.c_str());
    if (any && deck.train.optimizer == "muon")
        std::printf("optimizer: Muon; its Newton-Schulz iterations add %s FLOPs per step on the busiest rank of the "
                    "first layout (in the step time, not in MFU; its momentum, exchange and FLOPs: docs/planner.md)\n",
                    si(any->optimizer_flops).c_str());
    if (from_law) {
        const BudgetChoice& b = choice;
        std::printf("\n");
        if (target_loss > 0)
            std::printf("target loss %.4g: the smallest budget whose compute-optimal model reaches it is C = %.4g FLOPs\n",
                        target_loss, b.flops);
        std::printf("law %s (N = %s parameters), budget C = %.4g FLOPs (C = 6 N D):\n", law_path.c_str(), b.params.c_str(),
                    b.flops);
        std::printf("  compute-optimal: N = %s, D = %s tokens, loss %.4f", si(b.n).c_str(), si(b.d).c_str(), b.loss);
        if (std::isfinite(b.loss_lo))
            std::printf(" (%.0f%% interval %.4f to %.4f, over the law's bootstrap fits)", 100 * law.confidence, b.loss_lo, b.loss_hi);
        std::printf("\n  nearest shape of %s:\n    %s\n", b.family.c_str(), b.shape.text().c_str());
        std::printf("    N = %s, trained on D = C / 6N = %s tokens: predicted loss %.4f; the layouts below are this "
                    "model's, days = D / tokens per second\n", si(b.shape_n).c_str(), si(b.shape_d).c_str(), b.shape_loss);
    }
    const size_t show = top == 0 ? rows.size() : size_t(top < 0 ? 20 : top);
    std::printf("\n%4s %4s %5s %4s %4s %4s %5s %4s %-9s %6s | %9s %9s %9s %9s %9s %9s %9s | %5s %8s %8s %8s %8s %8s | %6s %8s %8s %7s %5s%s\n",
                "tp", "cp", "dp", "pp", "ep", "mbs", "mb", "zero", "recompute", "gbs", "params", "grads", "optim", "activ",
                "buffers", "runtime", "total", "links", "tp s", "cp s", "dp s", "ep s", "pp s", "bubble", "step", "tokens/s",
                "TFLOP/s", "MFU", from_law ? "  wall clock" : "");
    size_t shown = 0, invalid = 0;
    for (const auto& r : rows) {
        if (!r.valid) {
            ++invalid;
            continue;
        }
        if (shown >= show) continue;
        ++shown;
        const MemoryBytes& m = r.memory;
        std::string links;
        for (const auto& l : r.link) links += l == "nvlink" ? 'N' : l == "network" ? 'W' : l == "host" ? 'h' : '-';
        std::printf("%4d %4d %5d %4d %4d %4d %5d %4d %-9s %6s | %9s %9s %9s %9s %9s %9s %9s | %5s %8s %8s %8s %8s %8s | %6.3f %8s %8s %7s %4.1f%%%s",
                    r.tp, r.cp, r.dp, r.pp, r.ep, r.micro_batch_size, r.microbatches, r.zero, r.recompute.c_str(),
                    si(double(r.global_batch)).c_str(), bytes(m.params).c_str(), bytes(m.grads).c_str(),
                    bytes(m.optimizer).c_str(), bytes(m.activations).c_str(), bytes(m.buffers).c_str(),
                    bytes(m.runtime).c_str(), bytes(m.total).c_str(), links.c_str(), seconds(r.comm_s.tp).c_str(),
                    seconds(r.comm_s.cp).c_str(), seconds(r.comm_s.dp).c_str(), seconds(r.comm_s.ep).c_str(),
                    seconds(r.comm_s.pp).c_str(), r.bubble, seconds(r.step_time_s).c_str(), si(r.tokens_per_s).c_str(),
                    si(r.tflops_per_device).c_str(), r.mfu * 100,
                    from_law ? ("  " + days(choice.shape_d / r.tokens_per_s)).c_str() : "");
        if (!r.fits) std::printf("%s", hw.host ? "  (does not fit --device-memory)" : "  (does not fit the device's memory)");
        else if (r.tie && ties > 1) std::printf("  tie");
        std::printf("\n");
    }
    std::printf("(memory of the largest rank; links: the link each of tp, cp, dp, ep, pp crosses: N NVLink, W network, "
                "h this host, - none; comm: exposed seconds per step on each axis)\n");
    if (ties > 1)
        std::printf("tie: %zu layouts are predicted within %.1f%% of the fastest, the planner's validated error "
                    "(docs/planner.md): their order is not a prediction\n", ties, 100 * plan_error(target));
    if (valid > shown) std::printf("%zu more valid layout(s) not shown (--top K, --top 0 for all)\n", valid - shown);
    if (invalid) {
        // The reasons, most frequent first, with one example each.
        std::map<std::string, std::pair<size_t, const PlanRow*>> why;
        for (const auto& r : rows)
            if (!r.valid) {
                std::string key = r.reason.substr(0, r.reason.find('\''  , r.reason.find('\'') + 1));
                auto& w = why[key];
                if (!w.second) w.second = &r;
                ++w.first;
            }
        std::vector<std::pair<size_t, const PlanRow*>> sorted;
        for (const auto& [k, w] : why) sorted.push_back(w);
        std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        std::printf("\n%zu invalid layout(s)%s:\n", invalid, sorted.size() > 10 ? " (the 10 most frequent reasons)" : "");
        for (size_t i = 0; i < sorted.size() && i < 10; ++i) {
            const PlanRow& r = *sorted[i].second;
            std::printf("  %zu like tp=%d cp=%d dp=%d pp=%d ep=%d mbs=%d mb=%d zero=%d recompute=%s: %s\n", sorted[i].first,
                        r.tp, r.cp, r.dp, r.pp, r.ep, r.micro_batch_size, r.microbatches, r.zero, r.recompute.c_str(),
                        r.reason.c_str());
        }
    }
    if (none_valid) {
        std::fflush(stdout);  // the reasons before the error on stderr
        throw ConfigError(no_valid);
    }
    return 0;
}

}  // namespace quintet
