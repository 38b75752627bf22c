// quintet: one MPI program, subcommands train | eval | prepare | generate | deck | peak | schedule,
// and plan | study | plot, which run without MPI.
// Errors: ConfigError (the same on every rank) ends the job cleanly with status 2 after rank 0
// prints it; any other failure prints "rank N: ..." and aborts the whole job (never a hang).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "quintet/comm/communicator.hpp"
#include "quintet/core/error.hpp"
#include "quintet/tools/commands.hpp"

namespace {

const char* kUsage =
    "usage: quintet <command> [options]      (each command takes --help)\n"
    "\n"
    "commands:\n"
    "  train DECK [--section.key=value ...]   train (run under mpirun for several ranks)\n"
    "  eval --checkpoint CKPT --data DATA     validation loss of a checkpoint, any layout/seq_len\n"
    "  prepare --input TXT --tokenizer byte|bpe --output DATA.h5   make a token file\n"
    "  generate --checkpoint CKPT.h5 --prompt TEXT   sample text from a checkpoint\n"
    "  deck --reference | --markdown          print every deck key with its default\n"
    "  peak                                   measure this host's FMA peak and sgemm rate\n"
    "  schedule --pp P --microbatches M       print a pipeline schedule's timeline and bubble\n"
    "  plan DECK --world N [--json]           every layout of N ranks: memory, traffic, speed\n"
    "  study STUDY.deck [--submit local|slurm] run a scaling study (no mpirun: it launches the runs)\n"
    "  plot RUN_DIR... [-o FILE.png]          plot metrics.h5 of one or several runs\n";

}  // namespace

// Commands that never initialise MPI: they run as plain processes and launch mpirun or sbatch.
int run_without_mpi(const std::string& cmd, int argc, char** argv) {
    try {
        if (cmd == "plan") return quintet::plan_main(argc, argv);
        if (cmd == "study") return quintet::study_main(argc, argv);
        return quintet::plot_main(argc, argv);
    } catch (const quintet::ConfigError& e) {
        std::fprintf(stderr, "quintet: error: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "quintet: error: %s\n", e.what());
        return 1;
    }
}

int main(int argc, char** argv) {
    {
        const std::string cmd = argc > 1 ? argv[1] : "";
        if (cmd == "plan" || cmd == "study" || cmd == "plot") return run_without_mpi(cmd, argc - 1, argv + 1);
    }
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int status = 0;
    try {
        std::string cmd = argc > 1 ? argv[1] : "";
        int sub_argc = argc - 1;
        char** sub_argv = argv + 1;
        if (cmd == "train") status = quintet::train_main(sub_argc, sub_argv, MPI_COMM_WORLD);
        else if (cmd == "eval") status = quintet::eval_main(sub_argc, sub_argv, MPI_COMM_WORLD);
        else if (cmd == "prepare") status = rank == 0 ? quintet::prepare_main(sub_argc, sub_argv) : 0;
        else if (cmd == "generate") status = rank == 0 ? quintet::generate_main(sub_argc, sub_argv) : 0;
        else if (cmd == "deck") status = rank == 0 ? quintet::deck_main(sub_argc, sub_argv) : 0;
        else if (cmd == "peak" && sub_argc > 1 && std::strcmp(sub_argv[1], "--links") == 0)
            status = quintet::links_main(MPI_COMM_WORLD);
        else if (cmd == "peak") status = rank == 0 ? quintet::peak_main(sub_argc, sub_argv) : 0;
        else if (cmd == "schedule") status = rank == 0 ? quintet::schedule_main(sub_argc, sub_argv) : 0;
        else if (cmd == "-h" || cmd == "--help" || cmd == "help") {
            if (rank == 0) std::fputs(kUsage, stdout);
        } else {
            if (rank == 0)
                std::fprintf(stderr, "quintet: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
            status = 2;
        }
    } catch (const quintet::ConfigError& e) {
        // Deterministic: every rank threw the same; report once, end cleanly.
        if (rank == 0) std::fprintf(stderr, "quintet: error: %s\n", e.what());
        MPI_Finalize();
        return 2;
    } catch (const quintet::DivergedError& e) {
        // Agreed on by every rank (all-reduced values): report once, end cleanly, status 3.
        if (rank == 0) std::fprintf(stderr, "quintet: error: %s\n", e.what());
        MPI_Finalize();
        return 3;
    } catch (const quintet::IoError& e) {
        // An I/O failure during the run: a transient fault (DESIGN §5). Exit status 4.
        std::fprintf(stderr, "quintet: rank %d: error: %s\n", rank, e.what());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 4);
    } catch (const quintet::DeadlineError& e) {
        // A transient fault (DESIGN §5): a rank stopped answering. Exit status 4.
        std::fprintf(stderr, "quintet: rank %d: error: %s\n", rank, e.what());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 4);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "quintet: rank %d: error: %s\n", rank, e.what());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
    return status;
}
