// Running a study's cases: one after the other under mpirun on this machine, or as Slurm job
// arrays (one per world size and thread count). This process never initialises MPI itself.
#pragma once
#include <string>
#include <vector>

#include "quintet/study/cases.hpp"

namespace quintet {

// Runs every case without a done marker under `mpirun -n WORLD` (its output in the run's
// train.log), printing one line per finished run with an ETA; dry: prints the commands only.
// Returns how many runs failed.
int run_local(const Study& st, const std::vector<Case>& cases, bool dry);

// Writes one case file per (world, threads) and submits each as an array of `sbatch_script`
// (jobs/slurm/study.sbatch); dry: prints the sbatch commands only. Throws ConfigError when
// sbatch fails.
void submit_slurm(const Study& st, const std::vector<Case>& cases, bool dry, const std::string& sbatch_script);

}  // namespace quintet
