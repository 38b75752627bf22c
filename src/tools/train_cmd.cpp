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
#include "quintet/deck/deck.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/parallel/process_grid.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/train/trainer.hpp"
#ifdef QUINTET_WITH_CUDA
#include "quintet/comm/nccl_communicator.hpp"
#endif

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

// The cores this process may run on: its affinity mask, which mpirun narrows when it binds
// ranks (0 where the mask cannot be read).
int affinity_cores() {
    cpu_set_t mask;
    return sched_getaffinity(0, sizeof mask, &mask) == 0 ? std::max(1, CPU_COUNT(&mask)) : 0;
}

// The threads of a rank bound to fewer cores (mpirun binds each rank to one core by default
// when there are 2 ranks or fewer) share them: a 2x slowdown that only the tokens/s would show.
// Said once, by rank 0, naming the first rank concerned.
void warn_if_threads_exceed_cores(int threads, const MpiCommunicator& world) {
    int cores = affinity_cores();
    if (cores == 0) cores = threads;  // unknown: nothing to say
    const int rank = world.rank();
    // The fewest cores any rank has below its thread count, and the first rank with that many.
    int over = threads > cores ? cores : INT32_MAX;
    world.all_reduce_min(&over, 1);
    int first = threads > cores && cores == over ? rank : INT32_MAX;
    world.all_reduce_min(&first, 1);
    if (rank == 0 && over != INT32_MAX)
        std::cerr << "warning: " << threads << " threads per rank, but rank " << first
                  << " may run on only " << over
                  << " core(s) (its CPU affinity mask), so its threads share them and run slower. "
                     "mpirun binds each rank to one core by default for 2 ranks or fewer: launch "
                     "with `mpirun --bind-to none` or `--map-by slot:PE="
                  << threads << "` (as jobs/common.sh does), or run fewer threads per rank.\n";
}

}  // namespace

// Threads per rank: train.threads, else OMP_NUM_THREADS, else the cores this rank may run on
// (its affinity mask, which mpirun narrows when it binds ranks) shared by the node's ranks.
int threads_per_rank(const Deck& deck, const MpiCommunicator& world) {
    int threads = 0;
    if (deck.train.threads > 0) threads = deck.train.threads;
    else if (const char* e = std::getenv("OMP_NUM_THREADS"); e && std::atoi(e) > 0) threads = std::atoi(e);
    else {
        const int n = world.split_node()->size();
        int cores = int(sysconf(_SC_NPROCESSORS_ONLN));
        if (const char* e = std::getenv("QUINTET_CORES"); e && std::atoi(e) > 0) cores = std::atoi(e);
        threads = std::max(1, cores / n);
        if (const int bound = affinity_cores(); bound > 0) threads = std::min(threads, bound);
    }
    warn_if_threads_exceed_cores(threads, world);
    return threads;
}

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
    Deck deck = deck_load(deck_path, overrides);
    // Every rank reads and checks the data header, so a bad file fails everywhere alike.
    TokenFile data = token_file_read(deck.data.path);
    deck.model.vocab_size = data.vocab_size;
    if (deck.data.eos_id < 0) deck.data.eos_id = data.eos_id;  // resolved into the deck text
    deck_validate(deck, size);
    // The backend, before any output: a missing GPU must stop every rank alike (a ConfigError
    // on some ranks only would leave the others waiting in a collective).
    std::unique_ptr<Backend> backend;
    if (deck.train.device == "cuda") {
        std::string err;
        try {
#ifdef QUINTET_WITH_CUDA
            backend = make_cuda_backend(cuda_local_device(world.handle()));
#else
            backend = make_cuda_backend(0);
#endif
        } catch (const std::exception& e) {
            err = e.what();
        }
        int any = err.empty() ? 0 : 1;
        world.all_reduce_max(&any, 1);
        if (any) throw ConfigError(err.empty() ? "train.device = cuda failed on another rank" : err);
    } else {
        backend = make_cpu_backend(threads_per_rank(deck, world));
    }
    // One run per run_dir, before anything in it is read or written (a lock from a killed job
    // is taken over: on this host when its pid is gone, elsewhere when it is 2 deadlines old).
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
    // Where the weights come from (resume wins over init_from) and the context they were trained
    // at: rope.original_max_position = 0 resolves to it, so the resolved deck says the number.
    WeightsSource source = resolve_weights_source(deck, world);
    if (!lock_warning.empty()) source.warnings.insert(source.warnings.begin(), lock_warning);
    // The data must be tokenized as the weights were (docs/tokenizers.md, "Checkpoints").
    if (!source.path.empty()) {
        const std::string why = weights_tokenizer_check(source.path, data.tokenizer, deck.data.path,
                                                         deck.checkpoint.allow_tokenizer_change, source.resume);
        if (!why.empty()) source.warnings.push_back(why);
    }
    const auto& par = deck.parallel;
    const Layout layout = make_layout(size, par.tp, par.cp, par.pp, par.dp, par.ep);
    // Store the resolved layout, not "auto", so a checkpoint says what it was written with.
    deck.parallel.dp = layout.size[kDP];
    std::string text = deck_to_text(deck);
    if (rank == 0) {
        std::printf("quintet train %s on %d rank(s)\n--- resolved deck ---\n%s---------------------\n",
                    deck_path.c_str(), size, text.c_str());
        std::fflush(stdout);
    }
    ProcessGrid grid(world, layout, deck.train.collective_timeout_s);
    install_stop_signals();
    Trainer trainer(deck, text, grid, *backend, data.tokens, TrainerMode::train, source);
    trainer.set_run_lock(&lock);
    return trainer.run();
}

}  // namespace quintet
