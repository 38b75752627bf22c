// Helpers for end-to-end tests that run the real `quintet` binary under mpirun (as a user
// would) and read back what it wrote: metrics.h5 columns and checkpoint tensors.
#pragma once
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace quintet::testing {

struct RunResult {
    int status = -1;      // exit status of mpirun/quintet
    std::string output;   // stdout + stderr
};

// Runs `mpirun -n ranks quintet <args>` (ranks 0: no mpirun) in the current directory.
RunResult run_quintet(int ranks, const std::string& args);
// Runs a shell command line (stdout + stderr captured).
RunResult run_shell(const std::string& command);
std::string read_file(const std::filesystem::path& p);
void write_file(const std::filesystem::path& p, const std::string& text);
// A fresh empty directory under the build tree for one test.
std::filesystem::path scratch_dir(const std::string& name);
// /group/name of run_dir/metrics.h5 as doubles (every element, row-major, for the [step, ...] ones).
std::vector<double> metrics_column(const std::filesystem::path& run_dir, const std::string& path);
// Two curves of the same length, equal to relative `rel` from row `from` on.
void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel, const std::string& what,
                  size_t from = 0);
// Every dataset under /params and /optim of a checkpoint, as raw float32, by path.
std::vector<std::pair<std::string, std::vector<float>>> checkpoint_tensors(const std::string& file);
// "" when two checkpoint files hold the same objects, the same bytes in every dataset and the
// same attributes (the checksums included), else the first difference. Root attributes named in
// `except` (e.g. "deck") are left out.
std::string checkpoint_difference(const std::string& a, const std::string& b,
                                  const std::vector<std::string>& except = {});
// A token file with learnable structure (a noisy cyclic pattern) of n tokens over vocab V.
void make_token_file(const std::filesystem::path& p, size_t n, int V, uint32_t seed);
// Packed documents: the same kind of pattern over ids < 250, cut by the end-of-document token
// `eos` (recorded in the file) about every 9 tokens, so boundaries cross chunks and ranks.
void make_document_token_file(const std::filesystem::path& p, size_t n, uint32_t eos, uint32_t seed);

// A scratch directory per test with a deck and a token file, and `quintet train` on it.
struct TrainFixture : ::testing::Test {
    std::filesystem::path dir, deck, data;
    // Call from SetUp: dir = scratch/<prefix><test name>, the deck text, a token file (seed).
    void prepare(const std::string& prefix, const char* deck_text, uint32_t seed);
    // quintet train on `ranks` ranks with run_dir dir/name and extra overrides.
    RunResult train(int ranks, const std::string& name, const std::string& extra);
    // The layout-invariance check: `model` on one rank with 8 microbatches (run "ref"), whose
    // loss must fall by at least min_drop over its `steps` steps, then each (ranks, overrides)
    // of `layouts` (runs "l0", "l1", ...), whose /train/loss and /eval/loss must equal ref's to
    // `tol` relative. Returns the layouts' run names (empty if the reference failed).
    std::vector<std::string> compare_layouts(const std::string& model,
                                             const std::vector<std::pair<int, std::string>>& layouts,
                                             double tol, double min_drop, size_t steps = 10);
};

}  // namespace quintet::testing
