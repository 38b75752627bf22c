// `quintet study STUDY.deck [--submit local|slurm] | --collect DIR | --parity`: a scaling study.
//
// The study deck names a base training deck and what varies (layouts, world sizes, threads,
// seeds, any deck key); each combination is one run of `quintet train` in DIR/runs/<name>.
// This process never initialises MPI: it launches mpirun (local) or sbatch (a job array per
// world size and thread count, jobs/slurm/study.sbatch), then gathers every finished run into
// DIR/study.h5 (its resolved deck, layout, medians, time breakdown, memory, the planner's
// prediction) and draws the plots (scripts/plot_study.py). docs/studies.md describes it all.
#include <boost/program_options.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/io/metrics_schema.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/data/dataset.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/tools/python.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/perf/host_peak.hpp"
#include "quintet/perf/planner.hpp"


namespace quintet {

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

const char* kStudyUsage =
    "usage: quintet study STUDY.deck [--submit local|slurm] [--parity] [--dry-run]\n"
    "       quintet study --collect DIR [--parity]\n"
    "\n"
    "Runs a scaling study: every combination the study deck lists is one `quintet train` run of\n"
    "its base deck, in DIR/runs/<name>. Runs that finished before are skipped, so an interrupted\n"
    "study is simply started again. Afterwards DIR/study.h5 holds one group per run (resolved\n"
    "deck, commit, layout, median tokens/s, MFU, step-time breakdown, memory per rank and the\n"
    "planner's prediction) and DIR/plots/ the PNGs. Never initialises MPI itself.\n"
    "\n"
    "  --submit local   (default) run each case under mpirun in turn, one line per finished run\n"
    "  --submit slurm   submit one job array per (world size, threads) through\n"
    "                   jobs/slurm/study.sbatch and return; gather later with --collect DIR\n"
    "  --collect DIR    gather the finished runs of the study in DIR into study.h5 and plot\n"
    "  --parity         also run each case's single-rank equivalent (the same global batch) and\n"
    "                   report the largest relative difference of loss, grad norm and expert loads\n"
    "  --dry-run        print the cases and their commands, run nothing\n"
    "\n"
    "The study deck ([study] section; lists are comma-separated):\n"
    "  base = DECK                 the training deck (required; relative to the study deck's folder\n"
    "                              or the working directory)\n"
    "  dir = PATH                  the study folder (default runs/study_<study deck name>)\n"
    "  worlds = 1, 2, 4            world sizes\n"
    "  layouts = tp=1; tp=2; pp=2  ';'-separated [parallel] settings (tp cp pp ep dp zero\n"
    "                              microbatches sequence_parallel schedule virtual_stages); dp fills\n"
    "                              the world; a layout that does not fit a world size is skipped\n"
    "  threads = 1                 threads per rank (list)\n"
    "  seeds = 1234                train.seed (list; default the base deck's)\n"
    "  scaling = strong|weak|none  strong: the global batch stays global_batch samples (microbatches\n"
    "                              per replica = global_batch / (dp x micro_batch_size)); weak: each\n"
    "                              replica keeps the base deck's batch (the global batch grows)\n"
    "  global_batch = N            samples per step under strong scaling (default: the base deck's\n"
    "                              train.global_batch, else its micro_batch_size x microbatches);\n"
    "                              weak scaling sets train.global_batch = 0 in every run\n"
    "  steps = N                   train.steps of every run (default the base deck's)\n"
    "  mpirun_flags = ...          extra mpirun flags for --submit local (default --oversubscribe)\n"
    "  sbatch_flags = ...          extra sbatch flags for --submit slurm (partition, account, time)\n"
    "[vary] section: any deck key with a list, e.g. `data.micro_batch_size = 4, 8` (a grid).\n";

std::vector<int> int_list(const std::string& key, const std::string& s) {
    if (split_list(s, ',').empty()) throw ConfigError("study deck key '" + key + "' is empty");
    const auto v = parse_int_list(s);
    if (!v || std::any_of(v->begin(), v->end(), [](int n) { return n < 1; }))
        throw ConfigError("study deck key '" + key + "' = '" + s + "': expected positive integers, comma-separated");
    return *v;
}

struct Study {
    std::string deck_path, text, base, dir, scaling = "none", mpirun_flags = "--oversubscribe", sbatch_flags;
    std::vector<int> worlds{1}, threads{1};
    std::vector<int64_t> seeds;
    std::vector<std::map<std::string, std::string>> layouts{{}};
    std::vector<std::pair<std::string, std::vector<std::string>>> vary;
    int global_batch = 0, steps = 0;
};

const std::set<std::string> kLayoutKeys = {"tp", "cp", "pp", "ep", "dp", "zero", "microbatches", "sequence_parallel",
                                           "schedule", "virtual_stages"};

Study read_study(const std::string& path) {
    Study st;
    st.deck_path = path;
    std::ifstream f(path);
    if (!f) throw ConfigError("study: cannot read the study deck '" + path + "'");
    std::stringstream buf;
    buf << f.rdbuf();
    st.text = buf.str();
    std::istringstream in(st.text);
    po::options_description none;
    po::parsed_options parsed = po::parse_config_file(in, none, /*allow_unregistered=*/true);
    std::map<std::string, std::string> kv;
    for (const auto& o : parsed.options) {
        if (o.value.empty()) continue;
        if (kv.count(o.string_key)) throw ConfigError("study deck key '" + o.string_key + "' is given twice");
        kv[o.string_key] = o.value[0];
    }
    for (const auto& [k, v] : kv) {
        if (k.rfind("vary.", 0) == 0) {
            const std::string key = k.substr(5);
            Deck probe;
            bool known = false;
            for (auto& o : deck_options(probe))
                if (o.key == key) {
                    known = true;
                    for (const auto& x : split_list(v, ',')) o.set(x);  // checked as the deck would
                }
            if (!known) throw ConfigError("study deck key '" + k + "': '" + key + "' is not a deck key (see quintet deck --reference)");
            st.vary.push_back({key, split_list(v, ',')});
        } else if (k == "study.base") st.base = v;
        else if (k == "study.dir") st.dir = v;
        else if (k == "study.worlds") st.worlds = int_list(k, v);
        else if (k == "study.threads") st.threads = int_list(k, v);
        else if (k == "study.seeds") {
            for (int s : int_list(k, v)) st.seeds.push_back(s);
        } else if (k == "study.scaling") {
            if (v != "strong" && v != "weak" && v != "none")
                throw ConfigError("study deck key 'study.scaling' = '" + v + "': expected strong, weak or none");
            st.scaling = v;
        } else if (k == "study.global_batch") st.global_batch = int_list(k, v).at(0);
        else if (k == "study.steps") st.steps = int_list(k, v).at(0);
        else if (k == "study.mpirun_flags") st.mpirun_flags = v;
        else if (k == "study.sbatch_flags") st.sbatch_flags = v;
        else if (k == "study.layouts") {
            st.layouts.clear();
            for (const auto& l : split_list(v, ';')) {
                std::map<std::string, std::string> m;
                for (auto item : split_list(l, ' ')) {
                    for (const auto& kvp : split_list(item, ',')) {
                        const auto eq = kvp.find('=');
                        const std::string key = kvp.substr(0, eq);
                        if (eq == std::string::npos || !kLayoutKeys.count(key))
                            throw ConfigError("study deck key 'study.layouts' = '" + v + "': '" + kvp +
                                              "' is not KEY=VALUE with KEY one of tp cp pp ep dp zero microbatches "
                                              "sequence_parallel schedule virtual_stages");
                        m[key] = kvp.substr(eq + 1);
                    }
                }
                st.layouts.push_back(m);
            }
            if (st.layouts.empty()) throw ConfigError("study deck key 'study.layouts' is empty");
        } else {
            throw ConfigError("study deck key '" + k + "' is not known (see quintet study --help)");
        }
    }
    if (st.base.empty()) throw ConfigError("study deck '" + path + "': [study] base = DECK is required");
    const fs::path beside = fs::path(path).parent_path() / st.base;
    if (!fs::exists(st.base) && fs::exists(beside)) st.base = beside.string();
    if (!fs::exists(st.base)) throw ConfigError("study deck key 'study.base' = '" + st.base + "': no such file");
    if (st.dir.empty()) st.dir = "runs/study_" + fs::path(path).stem().string();
    return st;
}

struct Case {
    std::string name;
    int world = 1, threads = 1;
    std::vector<std::string> overrides;  // --section.key=value for `quintet train BASE`
    Deck deck;                           // resolved (vocab set), for the planner
    std::string skip;                    // why it does not run ("" = it runs)
    std::string reference;               // --parity: the name of its single-rank twin
    bool is_reference = false;
};

std::string run_dir(const Study& st, const Case& c) { return st.dir + "/runs/" + c.name; }

// Every case of the study (and, with parity, the single-rank references).
std::vector<Case> make_cases(const Study& st, bool parity) {
    const Deck base0 = deck_load(st.base, {});
    const DataInfo data = data_info(base0.data.path);
    std::vector<std::vector<std::pair<std::string, std::string>>> grid{{}};
    for (const auto& [key, vals] : st.vary) {
        std::vector<std::vector<std::pair<std::string, std::string>>> next;
        for (const auto& g : grid)
            for (const auto& v : vals) {
                auto h = g;
                h.push_back({key, v});
                next.push_back(h);
            }
        grid = next;
    }
    std::set<std::string> multi;  // vary keys with more than one value name the runs
    for (const auto& [key, vals] : st.vary)
        if (vals.size() > 1) multi.insert(key);
    std::vector<int64_t> seeds = st.seeds;
    if (seeds.empty()) seeds.push_back(base0.train.seed);
    std::vector<Case> cases;
    std::map<std::string, size_t> refs;
    for (int w : st.worlds)
        for (const auto& lay : st.layouts)
            for (int t : st.threads)
                for (int64_t seed : seeds)
                    for (const auto& g : grid) {
                        Case c;
                        c.world = w, c.threads = t;
                        std::vector<std::string> ov;
                        for (const auto& [k, v] : g) ov.push_back("--" + k + "=" + v);
                        for (const auto& [k, v] : lay) ov.push_back("--parallel." + k + "=" + v);
                        ov.push_back("--train.seed=" + std::to_string(seed));
                        if (st.steps > 0) ov.push_back("--train.steps=" + std::to_string(st.steps));
                        Deck d = deck_load(st.base, ov);
                        d.model.vocab_size = data.vocab_size;
                        const auto& p = d.parallel;
                        const int mp = p.tp * p.cp * p.pp;
                        int dp = p.dp > 0 ? p.dp : (w % mp == 0 ? w / mp : 0);
                        if (st.scaling == "weak" && d.train.global_batch > 0) {
                            ov.push_back("--train.global_batch=0");  // each replica keeps its batch
                            d.train.global_batch = 0;
                        }
                        if (dp > 0 && st.scaling == "strong") {
                            // study.global_batch, else the base deck's train.global_batch, else its one-replica batch.
                            const int gb = st.global_batch > 0           ? st.global_batch
                                           : base0.train.global_batch > 0 ? int(base0.train.global_batch)
                                                                          : base0.data.micro_batch_size * base0.parallel.microbatches;
                            const int per = gb / dp;
                            if (lay.count("microbatches")) {
                                // The layout fixes the microbatches: the microbatch size gives way.
                                const int mb = d.parallel.microbatches;
                                if (gb % dp || per % mb) {
                                    c.skip = "strong scaling: global_batch " + std::to_string(gb) + " is not a multiple of dp " +
                                             std::to_string(dp) + " x parallel.microbatches " + std::to_string(mb);
                                } else {
                                    ov.push_back("--data.micro_batch_size=" + std::to_string(per / mb));
                                    d.data.micro_batch_size = per / mb;
                                }
                            } else if (gb % dp || per % d.data.micro_batch_size) {
                                c.skip = "strong scaling: global_batch " + std::to_string(gb) + " is not a multiple of dp " +
                                         std::to_string(dp) + " x data.micro_batch_size " + std::to_string(d.data.micro_batch_size);
                            } else {
                                ov.push_back("--parallel.microbatches=" + std::to_string(per / d.data.micro_batch_size));
                                d.parallel.microbatches = per / d.data.micro_batch_size;
                            }
                        }
                        std::string name = "w" + std::to_string(w);
                        for (const char* k : {"tp", "cp", "pp", "ep", "dp"}) {
                            auto it = lay.find(k);
                            if (it != lay.end()) name += std::string("_") + k + it->second;
                        }
                        for (const auto& [k, v] : lay)
                            if (std::string("tp cp pp ep dp").find(k) == std::string::npos) name += "_" + k + v;
                        name += "_t" + std::to_string(t) + "_s" + std::to_string(seed);
                        for (const auto& [k, v] : g)
                            if (multi.count(k)) name += "_" + k.substr(k.find('.') + 1) + v;
                        c.name = name;
                        if (c.skip.empty()) {
                            Deck probe = d;
                            if (probe.parallel.dp == 0 && dp > 0) probe.parallel.dp = dp;
                            try {
                                if (dp == 0) throw ConfigError("tp x cp x pp = " + std::to_string(mp) +
                                                               " does not divide the world size " + std::to_string(w));
                                deck_validate(probe, w, false);
                            } catch (const ConfigError& e) {
                                c.skip = e.what();
                            }
                            d = probe;
                        }
                        ov.push_back("--output.run_dir=" + run_dir(st, c));
                        ov.push_back("--train.threads=" + std::to_string(t));
                        c.overrides = ov;
                        c.deck = d;
                        if (parity && c.skip.empty() && w > 1) {
                            // The single-rank run of the same global batch: dp x microbatches microbatches.
                            Case r;
                            r.is_reference = true;
                            r.world = 1, r.threads = t;
                            std::vector<std::string> rov;
                            for (const auto& [k, v] : g) rov.push_back("--" + k + "=" + v);
                            rov.push_back("--train.seed=" + std::to_string(seed));
                            if (st.steps > 0) rov.push_back("--train.steps=" + std::to_string(st.steps));
                            const int mb = d.parallel.dp * d.parallel.microbatches;
                            rov.push_back("--parallel.microbatches=" + std::to_string(mb));
                            r.name = "ref_mb" + std::to_string(mb) + "_t" + std::to_string(t) + "_s" + std::to_string(seed);
                            for (const auto& [k, v] : g)
                                if (multi.count(k)) r.name += "_" + k.substr(k.find('.') + 1) + v;
                            // The reference also carries the microbatch size strong scaling chose.
                            r.name += "_b" + std::to_string(d.data.micro_batch_size);
                            rov.push_back("--data.micro_batch_size=" + std::to_string(d.data.micro_batch_size));
                            c.reference = r.name;
                            if (!refs.count(r.name)) {
                                r.deck = deck_load(st.base, rov);
                                r.deck.model.vocab_size = data.vocab_size;
                                r.deck.parallel.dp = 1;
                                rov.push_back("--output.run_dir=" + run_dir(st, r));
                                rov.push_back("--train.threads=" + std::to_string(t));
                                r.overrides = rov;
                                refs[r.name] = cases.size();
                                cases.push_back(r);
                            }
                        }
                        cases.push_back(c);
                    }
    return cases;
}

std::string done_marker(const Study& st, const Case& c) { return run_dir(st, c) + "/study_done"; }

std::string self_exe() {
    std::error_code ec;
    const fs::path p = fs::read_symlink("/proc/self/exe", ec);
    return ec ? "quintet" : p.string();
}

std::string quote(const std::string& s) {
    if (s.find_first_of(" \t'\"$\\") == std::string::npos) return s;
    std::string o = "'";
    for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return o + "'";
}

std::string capture(const std::string& cmd) {
    std::string out;
    if (FILE* f = popen(cmd.c_str(), "r")) {
        char b[256];
        while (std::fgets(b, sizeof b, f)) out += b;
        pclose(f);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
}

// The commit of the source tree this binary was built from ("unknown" outside a git checkout).
std::string source_commit() {
#ifdef QUINTET_SOURCE_SCRIPTS
    const std::string root = fs::path(QUINTET_SOURCE_SCRIPTS).parent_path().string();
    std::string c = capture("git -C " + quote(root) + " rev-parse HEAD 2>/dev/null");
    if (!c.empty()) {
        if (!capture("git -C " + quote(root) + " status --porcelain --untracked-files=no 2>/dev/null").empty()) c += "-dirty";
        return c;
    }
#endif
    return "unknown";
}

std::string human(double s) {
    char b[32];
    if (s >= 3600) std::snprintf(b, sizeof b, "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
    else if (s >= 60) std::snprintf(b, sizeof b, "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
    else std::snprintf(b, sizeof b, "%.0fs", s);
    return b;
}

double median(std::vector<double> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
    if (v.empty()) return std::nan("");
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The steps a median is taken over: after the first two (start-up), or all of a short run.
std::vector<double> steady(const std::vector<double>& v) {
    return v.size() > 3 ? std::vector<double>(v.begin() + 2, v.end()) : v;
}

MachineModel machine_model() {
    MachineModel mm;
    mm.cores = host_cores();
    mm.matmul_gflops_per_core = host_sgemm_gflops_per_core();
    LinkFigures l;
    if (read_link_cache(&l)) mm.link_gbs = l.gbs, mm.link_latency_s = l.latency_s;
    mm.runtime_base_bytes = runtime_base_estimate();
    return mm;
}

struct RunResult {
    bool done = false;
    int exit_status = -1;
    std::vector<double> step, loss, grad_norm, tps, mfu, mfu_matmul, step_time, expert_load;
    std::map<std::string, std::vector<double>> timing;
    std::vector<double> memory;  // [ranks, 7] the last step's
    int ranks = 0;
};

RunResult read_run(const Study& st, const Case& c) {
    RunResult r;
    std::ifstream m(done_marker(st, c));
    if (!(m >> r.exit_status)) return r;
    const std::string path = run_dir(st, c) + "/metrics.h5";
    if (!fs::exists(path)) return r;
    h5::silence_errors();
    h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!f.valid()) return r;
    namespace ms = metrics_schema;
    auto train = [&](const char* col) { return h5::read_f64(f, ms::path(ms::kTrain, col)); };
    r.step = train(ms::kStep);
    r.loss = train(ms::kLoss);
    r.grad_norm = train(ms::kGradNorm);
    r.tps = train(ms::kTokensPerS);
    r.mfu = train(ms::kMfu);
    r.mfu_matmul = train(ms::kMfuMatmul);
    r.step_time = train(ms::kStepTime);
    r.expert_load = h5::read_f64(f, ms::kExpertLoad);
    for (const char* k : {ms::kTpComm, ms::kCpExposed, ms::kTimeDpReduce, ms::kEpDispatch, ms::kEpCombine, ms::kTimePipelineWait})
        r.timing[k] = h5::read_f64(f, ms::path(ms::kTiming, k));
    std::vector<hsize_t> dims;
    std::vector<std::vector<double>> cols;
    for (const char* k : ms::kMemoryCategories) cols.push_back(h5::read_f64(f, ms::memory_path(k), &dims));
    if (dims.size() == 2 && dims[0] > 0) {
        r.ranks = int(dims[1]);
        const size_t last = size_t(dims[0] - 1) * dims[1];
        r.memory.assign(size_t(r.ranks) * 6, 0.0);
        // study.h5 keeps params, grads, optimizer, activations, buffers, peak_rss per rank.
        const int keep[6] = {0, 1, 2, 3, 4, 6};
        for (int q = 0; q < r.ranks; ++q)
            for (int j = 0; j < 6; ++j)
                r.memory[size_t(q) * 6 + j] = cols[size_t(keep[j])].size() > last + q ? cols[size_t(keep[j])][last + q] : std::nan("");
    }
    r.done = r.exit_status == 0 && !r.loss.empty();
    return r;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
    if (a.empty() || a.size() != b.size()) return std::nan("");
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-12));
    return m;
}

// DIR/study.h5 (written whole to a temporary name and renamed) and the plots.
void collect(const Study& st, const std::vector<Case>& cases, bool parity) {
    const MachineModel mm0 = machine_model();
    const std::string commit = source_commit();
    const std::string tmp = st.dir + "/study.h5.tmp", out = st.dir + "/study.h5";
    h5::silence_errors();
    h5::Handle f = h5::file(h5::check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "create " + tmp));
    h5::write_attr_string(f, "scaling", st.scaling);
    h5::write_attr_string(f, "study", st.text);
    h5::write_attr_string(f, "base_deck", st.base);
    std::map<std::string, RunResult> results;
    int n_done = 0, n_missing = 0;
    for (const auto& c : cases) {
        if (!c.skip.empty()) continue;
        RunResult r = read_run(st, c);
        results[c.name] = r;
        if (c.is_reference) continue;
        if (r.exit_status < 0) {
            ++n_missing;
            continue;
        }
        h5::Handle g = h5::group(h5::create_groups(f, "/runs/" + c.name));
        const auto& p = c.deck.parallel;
        h5::write_attr_i64(g, "tp", p.tp), h5::write_attr_i64(g, "cp", p.cp), h5::write_attr_i64(g, "dp", p.dp);
        h5::write_attr_i64(g, "pp", p.pp), h5::write_attr_i64(g, "ep", p.ep), h5::write_attr_i64(g, "world", c.world);
        h5::write_attr_i64(g, "threads", c.threads), h5::write_attr_i64(g, "seed", c.deck.train.seed);
        h5::write_attr_i64(g, "microbatches", p.microbatches), h5::write_attr_i64(g, "exit_status", r.exit_status);
        h5::write_attr_string(g, "layout", "tp" + std::to_string(p.tp) + " cp" + std::to_string(p.cp) + " pp" +
                                               std::to_string(p.pp) + " dp" + std::to_string(p.dp) + " ep" + std::to_string(p.ep));
        h5::write_attr_string(g, "commit", commit);
        h5::write_attr_string(g, "deck", deck_to_text(c.deck));
        h5::write_attr_string(g, "status", r.done ? "done" : "failed");
        const double st_med = median(steady(r.step_time));
        h5::write_attr_f64(g, "tokens_per_s", median(steady(r.tps)));
        h5::write_attr_f64(g, "mfu", median(steady(r.mfu)));
        h5::write_attr_f64(g, "mfu_matmul", median(steady(r.mfu_matmul)));
        h5::write_attr_f64(g, "step_time_s", st_med);
        auto tmed = [&](std::initializer_list<const char*> ks) {
            double s = 0;
            for (const char* k : ks) {
                const double m = median(steady(r.timing[k]));
                if (std::isfinite(m)) s += m;
            }
            return s;
        };
        const double ttp = tmed({"tp_comm"}), tcp = tmed({"cp_exposed"}), tdp = tmed({"dp_reduce"});
        const double tep = tmed({"ep_dispatch", "ep_combine"}), tbub = tmed({"pipeline_wait"});
        h5::write_attr_f64(g, "time_tp_s", ttp), h5::write_attr_f64(g, "time_cp_s", tcp);
        h5::write_attr_f64(g, "time_dp_s", tdp), h5::write_attr_f64(g, "time_ep_s", tep);
        h5::write_attr_f64(g, "time_bubble_s", tbub);
        h5::write_attr_f64(g, "time_compute_s", std::isfinite(st_med) ? std::max(0.0, st_med - ttp - tcp - tdp - tep - tbub) : std::nan(""));
        MachineModel mm = mm0;
        mm.threads_per_rank = c.threads;
        mm.data_bytes = data_buffer_bytes(c.deck.data,
                                          int64_t(c.deck.parallel.microbatches) * c.deck.data.micro_batch_size,
                                          c.deck.model.vocab_size > 0 ? c.deck.model.vocab_size : 65536);
        const PlanRow pr = plan_layout(c.deck, c.world, mm);
        h5::write_attr_f64(g, "predicted_tokens_per_s", pr.valid ? pr.tokens_per_s : std::nan(""));
        h5::write_attr_f64(g, "predicted_step_time_s", pr.valid ? pr.step_time_s : std::nan(""));
        h5::write_attr_f64(g, "predicted_peak_rss_bytes", pr.valid ? pr.memory.total : std::nan(""));
        double rss = std::nan("");
        for (int q = 0; q < r.ranks; ++q) rss = std::isfinite(rss) ? std::max(rss, r.memory[size_t(q) * 6 + 5]) : r.memory[size_t(q) * 6 + 5];
        h5::write_attr_f64(g, "peak_rss_bytes", rss);
        h5::write_f64(g, "step", r.step), h5::write_f64(g, "loss", r.loss), h5::write_f64(g, "grad_norm", r.grad_norm);
        h5::write_f64(g, "tokens_per_s", r.tps);
        h5::write_f64(g, "memory_bytes", r.memory, {hsize_t(r.ranks), 6});
        {
            h5::Handle ds = h5::dataset(H5Dopen2(g, "memory_bytes", H5P_DEFAULT));
            h5::write_attr_string(ds, "columns", "params,grads,optimizer,activations,buffers,peak_rss");
        }
        if (r.done) ++n_done;
    }
    if (parity) {
        std::printf("\nparity against the single-rank run of the same global batch (max relative difference):\n");
        std::printf("  %-40s %12s %12s %12s\n", "run", "loss", "grad_norm", "expert_load");
        for (const auto& c : cases) {
            if (c.is_reference || !c.skip.empty() || c.reference.empty()) continue;
            const RunResult& a = results[c.name];
            const RunResult& b = results[c.reference];
            if (!a.done || !b.done) {
                std::printf("  %-40s (not finished)\n", c.name.c_str());
                continue;
            }
            const double l = max_rel(a.loss, b.loss), gn = max_rel(a.grad_norm, b.grad_norm);
            const double el = c.deck.model.moe.experts > 0 ? max_rel(a.expert_load, b.expert_load) : std::nan("");
            h5::Handle g = h5::group(h5::create_groups(f, "/parity/" + c.name));
            h5::write_attr_f64(g, "loss_rel", l), h5::write_attr_f64(g, "grad_norm_rel", gn);
            h5::write_attr_f64(g, "expert_load_rel", el);
            h5::write_attr_string(g, "reference", c.reference);
            std::printf("  %-40s %12.3g %12.3g %12s\n", c.name.c_str(), l, gn,
                        std::isfinite(el) ? std::to_string(el).c_str() : "-");
        }
    }
    f.reset();
    fs::rename(tmp, out);
    std::printf("study: %d run(s) collected into %s%s\n", n_done, out.c_str(),
                n_missing ? (" (" + std::to_string(n_missing) + " not finished yet)").c_str() : "");
    std::fflush(stdout);
    if (n_done > 0) {
        try {
            const int rc = run_python(project_script("plot_study.py"), {st.dir});
            if (rc != 0) std::fprintf(stderr, "study: warning: plot_study.py exited %d (study.h5 is complete)\n", rc);
        } catch (const ConfigError& e) {
            std::fprintf(stderr, "study: warning: no plots: %s\n", e.what());
        }
    }
}

// One job array per (world, threads): each line of the case file is one run's arguments.
int submit_slurm(const Study& st, const std::vector<Case>& cases, bool dry) {
    std::map<std::pair<int, int>, std::vector<const Case*>> groups;
    for (const auto& c : cases)
        if (c.skip.empty() && !fs::exists(done_marker(st, c))) groups[{c.world, c.threads}].push_back(&c);
    fs::create_directories(st.dir + "/slurm");
    const std::string script = project_script("../jobs/slurm/study.sbatch");
    for (const auto& [key, list] : groups) {
        const std::string file = st.dir + "/slurm/cases_w" + std::to_string(key.first) + "_t" + std::to_string(key.second) + ".txt";
        {
            std::ofstream o(file);
            for (const Case* c : list) {
                o << st.base;
                for (const auto& a : c->overrides) o << " " << a;
                o << "\n";
            }
        }
        const std::string root = fs::path(script).parent_path().parent_path().parent_path().string();
        std::string cmd = "sbatch --parsable --export=ALL,QUINTET_ROOT=" + quote(root) + ",QUINTET_BIN=" + quote(self_exe()) +
                          " --chdir=" + quote(fs::current_path().string()) + " --array=0-" + std::to_string(list.size() - 1) + " --ntasks=" +
                          std::to_string(key.first) + " --cpus-per-task=" + std::to_string(key.second) +
                          " --job-name=quintet-study --output=" + quote(st.dir + "/slurm/%x-%A_%a.out") + " " +
                          st.sbatch_flags + " " + quote(script) + " " + quote(fs::absolute(file).string());
        if (dry) {
            std::printf("%s\n", cmd.c_str());
            continue;
        }
        const std::string id = capture(cmd + " 2>&1");
        if (id.empty() || id.find_first_not_of("0123456789;") != std::string::npos)
            throw ConfigError("study: sbatch failed: " + cmd + "\n" + id);
        std::printf("study: submitted job array %s: %zu run(s) of %d rank(s) x %d thread(s)\n", id.c_str(), list.size(),
                    key.first, key.second);
    }
    std::printf("study: gather the results with: quintet study --collect %s\n", st.dir.c_str());
    return 0;
}

int run_local(const Study& st, const std::vector<Case>& cases, bool dry) {
    std::vector<const Case*> todo;
    int skipped_done = 0;
    for (const auto& c : cases) {
        if (!c.skip.empty()) continue;
        if (fs::exists(done_marker(st, c))) ++skipped_done;
        else todo.push_back(&c);
    }
    if (skipped_done) std::printf("study: %d run(s) finished before: skipped\n", skipped_done);
    const std::string self = self_exe();
    const double t0 = now_s();
    int i = 0, failed = 0;
    for (const Case* c : todo) {
        std::vector<std::string> args{"mpirun"};
        for (const auto& a : split_list(st.mpirun_flags, ' ')) args.push_back(a);
        args.insert(args.end(), {"-n", std::to_string(c->world), "-x", "OMP_NUM_THREADS=" + std::to_string(c->threads),
                                 self, "train", st.base});
        args.insert(args.end(), c->overrides.begin(), c->overrides.end());
        std::string line;
        for (const auto& a : args) {
            if (!line.empty()) line += ' ';
            line += quote(a);
        }
        if (dry) {
            std::printf("%s\n", line.c_str());
            continue;
        }
        fs::create_directories(run_dir(st, *c));
        std::ofstream(run_dir(st, *c) + "/command") << line << "\n";
        const double r0 = now_s();
        const int rc = run_process(args, run_dir(st, *c) + "/train.log", false, {"OMP_NUM_THREADS=" + std::to_string(c->threads)});
        ++i;
        const double el = (now_s() - t0);
        const double took = (now_s() - r0);
        const double eta = el / i * double(todo.size() - size_t(i));
        std::ofstream(done_marker(st, *c) + ".tmp") << rc << "\n";
        if (rc == 0) fs::rename(done_marker(st, *c) + ".tmp", done_marker(st, *c));
        else fs::remove(done_marker(st, *c) + ".tmp"), ++failed;
        const RunResult r = rc == 0 ? read_run(st, *c) : RunResult{};
        char b[400];
        if (rc == 0)
            std::snprintf(b, sizeof b, "[%d/%zu] %s: %.0f tok/s, MFU %.1f%%, final loss %.4f (%s) | ETA %s", i, todo.size(),
                          c->name.c_str(), median(steady(r.tps)), 100 * median(steady(r.mfu)),
                          r.loss.empty() ? std::nan("") : r.loss.back(), human(took).c_str(), human(eta).c_str());
        else
            std::snprintf(b, sizeof b, "[%d/%zu] %s: FAILED with exit status %d (see %s/train.log) | ETA %s", i, todo.size(),
                          c->name.c_str(), rc, run_dir(st, *c).c_str(), human(eta).c_str());
        std::printf("%s\n", b);
        std::fflush(stdout);
    }
    return failed;
}

}  // namespace

int study_main(int argc, char** argv) {
    runtime_base_estimate();  // this process's size before it does anything
    std::string deck, submit = "local", collect_dir;
    bool parity = false, dry = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&](const std::string& key) {
            if (a.rfind(key + "=", 0) == 0) return a.substr(key.size() + 1);
            if (a == key && i + 1 < argc) return std::string(argv[++i]);
            throw ConfigError("study: " + key + " needs a value (see quintet study --help)");
        };
        if (a == "-h" || a == "--help") {
            std::cout << kStudyUsage;
            return 0;
        } else if (a == "--submit" || a.rfind("--submit=", 0) == 0) {
            submit = value("--submit");
            if (submit != "local" && submit != "slurm")
                throw ConfigError("study: --submit = '" + submit + "': expected local or slurm");
        } else if (a == "--collect" || a.rfind("--collect=", 0) == 0) collect_dir = value("--collect");
        else if (a == "--parity") parity = true;
        else if (a == "--dry-run") dry = true;
        else if (a.rfind("--", 0) == 0) throw ConfigError("study: unknown option '" + a + "' (see quintet study --help)");
        else if (deck.empty()) deck = a;
        else throw ConfigError("study: unexpected argument '" + a + "'");
    }
    if (!collect_dir.empty()) {
        // The study deck travels with the study: DIR/study.deck.
        const std::string saved = collect_dir + "/study.deck";
        if (!fs::exists(saved)) throw ConfigError("study --collect " + collect_dir + ": no study.deck there (not a study folder)");
        Study st = read_study(saved);
        st.dir = collect_dir;
        const auto cases = make_cases(st, parity);
        collect(st, cases, parity);
        return 0;
    }
    if (deck.empty()) throw ConfigError(std::string("study: no STUDY.deck given\n") + kStudyUsage);
    Study st = read_study(deck);
    const auto cases = make_cases(st, parity);
    int runs = 0;
    for (const auto& c : cases) {
        if (c.skip.empty()) ++runs;
        else std::printf("study: %s skipped: %s\n", c.name.c_str(), c.skip.c_str());
    }
    std::printf("study %s: %d run(s) in %s (%s scaling)\n", deck.c_str(), runs, st.dir.c_str(), st.scaling.c_str());
    if (runs == 0) throw ConfigError("study: no case of " + deck + " can run (see the reasons above)");
    if (!dry) {
        fs::create_directories(st.dir + "/runs");
        // Keep the study deck with the study, its base made absolute, for --collect.
        std::istringstream in(st.text);
        std::ostringstream o;
        std::string line;
        while (std::getline(in, line)) {
            const auto a = line.find_first_not_of(" \t");
            if (a != std::string::npos && line.compare(a, 4, "base") == 0 &&
                line.find('=', a) != std::string::npos && line.substr(a + 4, line.find('=', a) - a - 4).find_first_not_of(" \t") == std::string::npos)
                line = "base = " + fs::absolute(st.base).string();
            o << line << "\n";
        }
        std::ofstream(st.dir + "/study.deck") << o.str();
    }
    if (submit == "slurm") return submit_slurm(st, cases, dry);
    const int failed = run_local(st, cases, dry);
    if (dry) return 0;
    collect(st, cases, parity);
    return failed ? 4 : 0;
}

}  // namespace quintet
