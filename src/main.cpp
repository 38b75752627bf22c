// quintet: one MPI program, subcommands train | eval | prepare | generate | export | import | deck | peak | schedule,
// and plan | study | laws | mup-check | plot | trace | tokenize | data, which run without MPI. kSubcommands below is the one list: the
// dispatch and the usage text are both made from it, so a new subcommand is one row.
// Errors (exit statuses: docs/reliability.md): ConfigError (the same on every rank) ends the job
// cleanly with status 2 after rank 0 prints it; any other failure prints "rank N: ..." and
// aborts the whole job (never a hang).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "quintet/comm/communicator.hpp"
#include "quintet/core/error.hpp"
#include "quintet/tools/commands.hpp"

namespace {

// Which processes run a subcommand.
enum class Runs {
    without_mpi,  // a plain process, MPI never initialised: it launches mpirun or sbatch itself
    collective,   // every rank of MPI_COMM_WORLD
    on_rank0,     // rank 0; the other ranks return 0 at once
};

struct Subcommand {
    const char* name;     // argv[1]
    const char* variant;  // when set, the row matches only when argv[2] is exactly this
    const char* args;     // the usage line: the arguments after the name
    const char* summary;  // the usage line: what it does; nullptr leaves the row out of the usage
                          // (the command's own --help describes it)
    Runs runs;
    // argv[0] is the subcommand's name; world is MPI_COMM_WORLD, or MPI_COMM_NULL without MPI.
    int (*run)(int argc, char** argv, MPI_Comm world);
};

// Rows are matched in order: a variant (`peak --links`) comes before its plain command.
constexpr Subcommand kSubcommands[] = {
    {"train", nullptr, "DECK [--section.key=value ...]",
     "train (run under mpirun for several ranks)", Runs::collective,
     [](int c, char** v, MPI_Comm w) { return quintet::train_main(c, v, w); }},
    {"eval", nullptr, "--checkpoint CKPT --data DATA",
     "validation loss of a checkpoint, any layout/seq_len", Runs::collective,
     [](int c, char** v, MPI_Comm w) { return quintet::eval_main(c, v, w); }},
    {"prepare", nullptr, "--input TXT --tokenizer SPEC --output DATA.h5",
     "make a token file", Runs::collective,
     [](int c, char** v, MPI_Comm w) { return quintet::prepare_main(c, v, w); }},
    {"data", nullptr, "verify|inspect|stats ...",
     "check a corpus, decode a training sample, a blend's sources", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::data_main(c, v); }},
    {"tokenize", nullptr, "--tokenizer SPEC [--whole] [--decode]",
     "text on stdin <-> token ids", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::tokenize_main(c, v); }},
    {"generate", nullptr, "--checkpoint CKPT.h5 --prompt TEXT",
     "sample text from a checkpoint", Runs::on_rank0,
     [](int c, char** v, MPI_Comm) { return quintet::generate_main(c, v); }},
    {"export", nullptr, "--checkpoint CKPT --format gguf|hf --output PATH",
     "a checkpoint for llama.cpp (GGUF) or Hugging Face", Runs::on_rank0,
     [](int c, char** v, MPI_Comm) { return quintet::export_main(c, v); }},
    {"import", nullptr, "--format hf --input DIR --output CKPT.h5",
     "a Hugging Face Llama / DeepSeek model as a checkpoint", Runs::on_rank0,
     [](int c, char** v, MPI_Comm) { return quintet::import_main(c, v); }},
    {"deck", nullptr, "--reference | --markdown",
     "print every deck key with its default", Runs::on_rank0,
     [](int c, char** v, MPI_Comm) { return quintet::deck_main(c, v); }},
    // Two ranks measure the link between them (`quintet plan --measure` runs it under mpirun).
    {"peak", "--links", "--links",
     nullptr, Runs::collective,
     [](int, char**, MPI_Comm w) { return quintet::links_main(w); }},
    {"peak", nullptr, "",
     "measure this host's FMA peak and sgemm rate", Runs::on_rank0,
     [](int c, char** v, MPI_Comm) { return quintet::peak_main(c, v); }},
    {"schedule", nullptr, "--pp P --microbatches M",
     "print a pipeline schedule's timeline and bubble", Runs::on_rank0,
     [](int c, char** v, MPI_Comm) { return quintet::schedule_main(c, v); }},
    {"plan", nullptr, "DECK --world N [--json]",
     "every layout of N ranks: memory, traffic, speed", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::plan_main(c, v); }},
    {"study", nullptr, "STUDY.deck [--submit local|slurm]",
     "run a scaling study (no mpirun: it launches the runs)", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::study_main(c, v); }},
    {"laws", nullptr, "STUDY.h5|DATA.csv [--bootstrap N] [--json] [-o PLOT.png]",
     "fit a scaling law to a study's runs (IsoFLOP profiles and L = E + A/N^alpha + B/D^beta)", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::laws_main(c, v); }},
    {"mup-check", nullptr, "DECK --widths W1,W2,... [--steps S] [--scheme standard|mup] [--json] [-o PNG]",
     "the coordinate check of µP: each kind of layer output's RMS against width over a few steps", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::mup_check_main(c, v); }},
    {"plot", nullptr, "RUN_DIR... [-o FILE.png]",
     "plot metrics.h5 of one or several runs", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::plot_main(c, v); }},
    {"trace", nullptr, "RUN_DIR [-o FILE.json]",
     "merge a run's per-rank timelines (train.trace_steps) for Perfetto", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::trace_main(c, v); }},
    {"metrics", nullptr, "RUN_DIR [--csv|--jsonl] [--group G]",
     "a run's metrics as CSV or JSON Lines, for tools without HDF5", Runs::without_mpi,
     [](int c, char** v, MPI_Comm) { return quintet::metrics_main(c, v); }},
};

// The row for `quintet argv[1] argv[2] ...`, or nullptr for an unknown (or missing) command.
const Subcommand* find_subcommand(int argc, char** argv) {
    if (argc < 2) return nullptr;
    for (const Subcommand& s : kSubcommands) {
        if (std::strcmp(argv[1], s.name) != 0) continue;
        if (!s.variant || (argc > 2 && std::strcmp(argv[2], s.variant) == 0)) return &s;
    }
    return nullptr;
}

// One line per listed row: "  name args", then the summary from the 42nd character on (3 spaces
// after a longer command line).
std::string usage_text() {
    std::string text =
        "usage: quintet <command> [options]      (each command takes --help)\n"
        "\n"
        "commands:\n";
    for (const Subcommand& s : kSubcommands) {
        if (!s.summary) continue;
        std::string line = std::string("  ") + s.name;
        if (*s.args) line += std::string(" ") + s.args;
        line.append(line.size() < 41 ? 41 - line.size() : 3, ' ');
        text += line + s.summary + "\n";
    }
    return text;
}

// Commands that never initialise MPI: they run as plain processes and launch mpirun or sbatch.
int run_without_mpi(const Subcommand& sub, int argc, char** argv) {
    try {
        return sub.run(argc, argv, MPI_COMM_NULL);
    } catch (const quintet::ConfigError& e) {
        std::fprintf(stderr, "quintet: error: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "quintet: error: %s\n", e.what());
        return 1;
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (const Subcommand* sub = find_subcommand(argc, argv); sub && sub->runs == Runs::without_mpi)
        return run_without_mpi(*sub, argc - 1, argv + 1);
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int status = 0;
    try {
        // Looked up again: MPI_Init_thread may rewrite argc/argv (the standard allows it).
        const std::string cmd = argc > 1 ? argv[1] : "";
        const Subcommand* sub = find_subcommand(argc, argv);
        if (sub) {
            if (sub->runs == Runs::collective || rank == 0)
                status = sub->run(argc - 1, argv + 1, MPI_COMM_WORLD);
        } else if (cmd == "-h" || cmd == "--help" || cmd == "help") {
            if (rank == 0) std::fputs(usage_text().c_str(), stdout);
        } else {
            if (rank == 0)
                std::fprintf(stderr, "quintet: unknown command '%s'\n\n%s", cmd.c_str(),
                             usage_text().c_str());
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
    } catch (const quintet::FaultError& e) {
        // Agreed on by every rank, temporaries already removed: report once, end cleanly, status 4.
        if (rank == 0) std::fprintf(stderr, "quintet: error: %s\n", e.what());
        MPI_Finalize();
        return 4;
    } catch (const quintet::IoError& e) {
        // An I/O failure during the run: a transient fault (docs/reliability.md). Exit status 4.
        std::fprintf(stderr, "quintet: rank %d: error: %s\n", rank, e.what());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 4);
    } catch (const quintet::DeadlineError& e) {
        // A transient fault (docs/reliability.md): a rank stopped answering. Exit status 4.
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
