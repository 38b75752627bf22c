// `quintet train DECK [--section.key=value ...] [--allow-tokenizer-change]`: the training job.
// Collective over the world.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sched.h>
#include <unistd.h>

#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/run_lock.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/train/rank_model.hpp"
#include "quintet/train/session.hpp"
#include "quintet/train/signals.hpp"
#include "quintet/train/timeline.hpp"
#include "quintet/train/trainer.hpp"

namespace quintet {

namespace {

const char* kTrainUsage =
    "usage: mpirun -n N quintet train DECK [--section.key=value ...]\n"
    "\n"
    "Trains the model the deck describes. DECK is a Boost.Program_options config file\n"
    "([section] headers, key = value lines); any key can be overridden on the command line.\n"
    "The resolved deck is printed at start and stored in every checkpoint and metrics file.\n"
    "Outputs go to output.run_dir: metrics.h5 (every step) and checkpoints/ (every\n"
    "checkpoint.every steps, at the end, and on SIGTERM/SIGUSR1). With checkpoint.resume = auto\n"
    "a run continues from run_dir/checkpoints/latest. `quintet deck --reference` prints every key.\n"
    "\n"
    "A job its batch system restarted (SLURM_RESTART_COUNT > 0, or QUINTET_RESUBMITS > 0 from\n"
    "jobs/pbs/train.pbs) resumes from its own checkpoints even under checkpoint.resume = none.\n"
    "\n"
    "The token file's tokenizer must be the one the checkpoint it resumes or starts from\n"
    "(init_from) was trained with; --allow-tokenizer-change (= --checkpoint.allow_tokenizer_change=true)\n"
    "accepts another one, and for init_from a larger vocabulary (new rows: the mean of the trained ones).\n"
    "\n";

// "SLURM_RESTART_COUNT=1" when this process belongs to a job the batch system restarted, else "".
// Slurm counts requeues in SLURM_RESTART_COUNT; the PBS template counts its resubmissions in
// QUINTET_RESUBMITS (PBS itself has no portable equivalent).
std::string batch_restart() {
    for (const char* name : {"SLURM_RESTART_COUNT", "QUINTET_RESUBMITS"})
        if (const char* e = std::getenv(name); e && std::atoi(e) > 0) return std::string(name) + "=" + e;
    return "";
}

}  // namespace

int train_main(int argc, char** argv, MPI_Comm world_handle) {
    const MpiCommunicator world(world_handle, "world");
    const int rank = world.rank(), size = world.size();
    std::string deck_path;
    std::vector<std::string> overrides;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            if (rank == 0) std::cout << kTrainUsage << deck_reference_text();
            return 0;
        }
        if (a == "--allow-tokenizer-change") overrides.push_back("--checkpoint.allow_tokenizer_change=true");
        else if (a.rfind("--", 0) == 0) overrides.push_back(a);
        else if (deck_path.empty()) deck_path = a;
        else throw ConfigError("train: unexpected argument '" + a + "' (one DECK, then --section.key=value overrides)");
    }
    if (deck_path.empty()) throw ConfigError(std::string("train: no DECK given\n") + kTrainUsage);
    Session job(deck_load(deck_path, overrides), world);
    // One run per run_dir, before anything in it is read or written (a lock from a killed job
    // is taken over: on this host when its pid is gone, elsewhere when it is 2 deadlines old).
    Deck& deck = job.deck;
    std::string lock_warning;
    RunLock lock(deck.output.run_dir, world, std::max(600.0, 2 * deck.train.collective_timeout_s), &lock_warning);
    // A job the batch system restarted (requeued at its time limit, preempted, resubmitted) is
    // the same run: it resumes even where its deck says checkpoint.resume = none.
    const std::string restart = batch_restart();
    if (deck.checkpoint.resume == "none" && !restart.empty() && !checkpoint_latest(deck.output.run_dir).empty()) {
        deck.checkpoint.resume = "auto";
        if (rank == 0)
            std::printf("quintet: %s: a restarted job, so checkpoint.resume = none is taken as auto (it "
                        "continues the checkpoints this job wrote in %s)\n",
                        restart.c_str(), deck.output.run_dir.c_str());
    }
    check_trace_folder(deck, world);  // train.trace_steps: its folder, before any work
    job.resolve(lock_warning);
    if (rank == 0) {
        std::printf("quintet train %s on %d rank(s)\n--- resolved deck ---\n%s---------------------\n",
                    deck_path.c_str(), size, job.deck_text.c_str());
        std::fflush(stdout);
    }
    const ProcessGrid& grid = job.start_grid();
    install_stop_signals();
    RankModel model(job.deck, grid, *job.backend);
    Trainer trainer(model, job.deck_text, job.data, job.source, &lock);
    return trainer.run();
}

}  // namespace quintet
