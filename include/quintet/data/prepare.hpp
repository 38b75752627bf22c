// `quintet prepare` as one pipeline (docs/data.md, "Preparing a corpus"):
//   inputs (corpus_input.hpp) -> documents -> token ids (every rank, every thread) -> shards or one
//   token file (io/token_data.hpp) -> manifest (corpus_manifest.hpp), written last.
// Complete or nothing: the work is kept in a state folder beside the output (DIR/.prepare, or
// FILE.prepare) under a lock, in units that are renamed into place only when finished; a signal
// stops every rank with the finished units kept for `--resume`, a failure removes everything it
// wrote. The shards do not depend on the number of ranks or threads, nor on interruptions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/data/corpus_input.hpp"
#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

struct PrepareJob {
    std::vector<InputFile> files;  // expanded, in order
    JsonlKeys keys;                // for the JSON Lines inputs
    std::string sep;               // --split-on (unescaped) for plain text; empty = none
    int64_t shard_tokens = 0;      // 0 = one token file at `output`
    std::string output;
    int bos_id = -1, eos_id = -1;  // tokens before / after every document (-1 = none)
    int64_t max_bad_lines = 0;     // malformed JSON lines skipped before the job stops
    std::string binary = "refuse";  // a text input that is not UTF-8: refuse | skip | keep
    bool resume = false;           // continue an interrupted prepare of the same job
    bool force = false;            // one token file: replace an existing token file
    std::string command;           // as recorded in the manifest
    int threads = 0;               // per rank; 0 = OMP_NUM_THREADS, else the rank's share of the node's cores
};

// SIGINT, SIGTERM and SIGUSR1 set a flag from here on (until prepare_run returns) that stops the
// job at the next part of its work; prepare_interrupted() says whether one came.
void prepare_catch_signals();
bool prepare_interrupted();

// The state folder of a job's output (DIR/.prepare for shards, FILE.prepare for one file).
std::string prepare_state_dir(const PrepareJob& job);

// Checks the output before any work: ConfigError (exit status 2) naming --output and what is
// expected. Creates the output directory (shards) or the file's folder when missing. collective
std::string prepare_check_output(const PrepareJob& job, const MpiCommunicator& world);

// A complete output's leftover state folder (a stop that came after the manifest) removed, under
// the lock. collective
void prepare_tidy(const PrepareJob& job, const MpiCommunicator& world);

// The tokenizer an interrupted prepare of this output trained (bpe), so --resume encodes with the
// same merges; empty (kind "") when there is none.
TokenizerState prepare_saved_tokenizer(const PrepareJob& job);

// The documents of the inputs joined by "\n", up to `limit` bytes (0 = all): what bpe trains on.
std::string corpus_sample_text(const PrepareJob& job, size_t limit);

// Runs the pipeline. Returns 0 when the corpus is complete; ConfigError for bad input (exit 2,
// nothing left behind), FaultError for an interruption by a signal or an I/O failure (exit 4).
// collective
int prepare_run(const PrepareJob& job, const Tokenizer& tok, const MpiCommunicator& world);

}  // namespace quintet
