// `quintet prepare` at corpus scale (docs/data.md, "Preparing a corpus"): inputs that are files,
// directories (recursively) or globs, plain text or JSON Lines, gzip-compressed or not, streamed
// in bounded memory and written as shards of a fixed token count. Internal to the prepare command.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

struct CorpusJob {
    std::vector<std::string> files;  // expanded, in order
    std::string jsonl_key;           // non-empty: every input is JSON Lines, the document is this key
    std::string sep;                 // --split-on (unescaped); empty = none
    int64_t shard_tokens = 0;        // 0 = one file at `output`
    std::string output;
    int bos_id = -1, eos_id = -1;
};

// The input files of --input values: a file, a directory's regular files (recursively, sorted),
// or a glob's matches (sorted). ConfigError naming the value when nothing is found.
std::vector<std::string> corpus_inputs(const std::vector<std::string>& inputs);

// The documents of the inputs joined by "\n", up to `limit` bytes (0 = all): what bpe trains on.
std::string corpus_sample_text(const CorpusJob& job, size_t limit);

// Encodes the inputs on every rank (units of files shared out by size, parts over the threads) and
// writes the shards; the shards and their contents do not depend on the number of ranks.
// collective
int prepare_corpus(const CorpusJob& job, const Tokenizer& tok, const MpiCommunicator& world);

}  // namespace quintet
