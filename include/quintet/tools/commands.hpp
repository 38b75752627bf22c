// Entry points of the `quintet` subcommands, dispatched from src/main.cpp.
// Each takes the subcommand's own argv (argv[0] = the subcommand name) and returns the exit status.
#pragma once
#include <mpi.h>

#include <string>

namespace quintet {

struct CheckpointMeta;
class Tokenizer;

int train_main(int argc, char** argv, MPI_Comm world);  // tools/train_cmd.cpp; collective
int eval_main(int argc, char** argv, MPI_Comm world);   // tools/eval_cmd.cpp; collective
int prepare_main(int argc, char** argv, MPI_Comm world);  // tools/prepare_cmd.cpp; collective
int generate_main(int argc, char** argv);  // tools/generate_cmd.cpp; rank 0 only
int export_main(int argc, char** argv);    // tools/export_cmd.cpp: checkpoint -> GGUF / HF; rank 0 only
int import_main(int argc, char** argv);    // tools/export_cmd.cpp: HF directory -> checkpoint; rank 0 only
int deck_main(int argc, char** argv);      // tools/misc_cmd.cpp: reference deck / markdown
int peak_main(int argc, char** argv);      // tools/misc_cmd.cpp: FMA peak and sgemm rate
int links_main(MPI_Comm world);            // tools/misc_cmd.cpp: `peak --links`; collective, 2 ranks
// Commands that run without MPI (no MPI_Init: they launch mpirun or sbatch themselves).
int plan_main(int argc, char** argv);      // tools/plan_cmd.cpp: the layout planner
int study_main(int argc, char** argv);     // tools/study_cmd.cpp: scaling studies
int laws_main(int argc, char** argv);      // tools/laws_cmd.cpp: fit a scaling law to a study's runs
int mup_check_main(int argc, char** argv); // tools/mup_check_cmd.cpp: µP's coordinate check
int plot_main(int argc, char** argv);      // tools/plot_cmd.cpp: metrics.h5 to PNG
int trace_main(int argc, char** argv);     // tools/trace_cmd.cpp: the ranks' timelines merged
int metrics_main(int argc, char** argv);   // tools/metrics_cmd.cpp: metrics.h5 as CSV / JSON Lines
int schedule_main(int argc, char** argv);  // tools/schedule_cmd.cpp: pipeline timeline; rank 0 only, no MPI
int tokenize_main(int argc, char** argv);  // tools/tokenize_cmd.cpp: text <-> ids; no MPI
int data_main(int argc, char** argv);      // tools/data_cmd.cpp: verify, inspect, stats of corpora; no MPI

// The tokenizer a checkpoint's weights were trained with (tools/tokenize_cmd.cpp): its own
// (CheckpointMeta::tokenizer), else -- a checkpoint from before tokenizers travelled with them --
// the one of the token file `fallback_data`, or of its deck's data.path when that is "", with
// `note` saying so ("" otherwise).
Tokenizer checkpoint_tokenizer(const std::string& checkpoint, const CheckpointMeta& meta,
                               const std::string& fallback_data, std::string& note);

}  // namespace quintet
