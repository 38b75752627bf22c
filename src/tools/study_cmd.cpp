// `quintet study STUDY.deck [--submit local|slurm] | --collect DIR | --parity`: a scaling study.
//
// The command only reads its arguments and calls the study library (src/study/): the study deck
// (study_deck), its cases (cases), running them under mpirun or as Slurm job arrays (launch),
// gathering DIR/study.h5 (collect), then the plots (scripts/plot_study.py). This process never
// initialises MPI. docs/studies.md describes it all.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "quintet/core/error.hpp"
#include "quintet/perf/planner.hpp"
#include "quintet/study/cases.hpp"
#include "quintet/study/collect.hpp"
#include "quintet/study/launch.hpp"
#include "quintet/study/study_deck.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/tools/python.hpp"

namespace quintet {

namespace fs = std::filesystem;

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
    "[vary] section: any deck key with a list, e.g. `data.micro_batch_size = 4, 8` (a grid).\n"
    "\n"
    "A scaling-law study: a [laws] section instead of layouts and [vary] (one world, layout and\n"
    "thread count; docs/scaling-laws.md):\n"
    "  budgets = 1e13, 3e13, 1e14   FLOP budgets, C = 6 N D\n"
    "  shapes = d_model=64 n_layers=2 n_heads=2; d_model=128 n_layers=4 n_heads=4\n"
    "                              the model family as a list of shapes (';'-separated model keys), or\n"
    "  family = widths=64,96,128 aspect=32 head_dim=32 [ffn_ratio=R] [q_per_kv=G]\n"
    "                              a rule: n_layers = width / aspect, n_heads = width / head_dim (the\n"
    "                              base deck's ratios where omitted)\n"
    "  params = active             N counts total, non_embedding or active parameters\n"
    "  smooth = 0.1                the smoothed final training loss: over this last fraction of steps\n"
    "  warmup_fraction = F         train.warmup = F x each run's steps (default: the base deck's)\n"
    "Each (budget, shape) trains on D = C / (6 N) tokens: train.steps = D / (global batch x seq_len),\n"
    "so the cosine schedule ends with the run; eval.every = steps gives the final validation loss.\n"
    "study.h5 gets N (three counts), D, C, the exact FLOPs, the final losses; fit with quintet laws.\n";

// DIR/plots/ from study.h5 (a missing matplotlib is a warning: study.h5 is complete without it).
void plot(const Study& st, const Collected& c) {
    if (c.done == 0) return;
    if (st.laws.present) std::printf("study: fit the law with: quintet laws %s [-o law.png] [--json]\n", st.dir.c_str());
    try {
        const int rc = run_python(project_script("plot_study.py"), {st.dir});
        if (rc != 0) std::fprintf(stderr, "study: warning: plot_study.py exited %d (study.h5 is complete)\n", rc);
    } catch (const ConfigError& e) {
        std::fprintf(stderr, "study: warning: no plots: %s\n", e.what());
    }
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
        plot(st, collect(st, cases, parity));
        return 0;
    }
    if (deck.empty()) throw ConfigError(std::string("study: no STUDY.deck given\n") + kStudyUsage);
    Study st = read_study(deck);
    if (parity && st.laws.present)
        throw ConfigError("study: --parity compares layouts with one rank; a [laws] study runs one layout");
    const auto cases = make_cases(st, parity);
    int runs = 0;
    for (const auto& c : cases) {
        if (c.skip.empty()) ++runs;
        else std::printf("study: %s skipped: %s\n", c.name.c_str(), c.skip.c_str());
    }
    if (st.laws.present) {
        std::printf("study %s: %d run(s) in %s (scaling law: %zu budget(s), N = %s parameters)\n", deck.c_str(), runs,
                    st.dir.c_str(), st.laws.budgets.size(), st.laws.params.c_str());
        for (const auto& c : cases)
            if (c.skip.empty())
                std::printf("  %-28s N = %-10.4g D = %-10.4g steps = %lld\n", c.name.c_str(), c.laws.n, c.laws.tokens,
                            (long long)c.laws.steps);
    } else
        std::printf("study %s: %d run(s) in %s (%s scaling)\n", deck.c_str(), runs, st.dir.c_str(), st.scaling.c_str());
    if (runs == 0) throw ConfigError("study: no case of " + deck + " can run (see the reasons above)");
    if (!dry) {
        fs::create_directories(st.dir + "/runs");
        // Keep the study deck with the study, its base made absolute, for --collect.
        std::ofstream(st.dir + "/study.deck") << study_deck_for_dir(st);
    }
    if (submit == "slurm") {
        submit_slurm(st, cases, dry, project_script("../jobs/slurm/study.sbatch"));
        return 0;
    }
    const int failed = run_local(st, cases, dry);
    if (dry) return 0;
    plot(st, collect(st, cases, parity));
    return failed ? 4 : 0;
}

}  // namespace quintet
