// What `quintet generate` shares between one prompt and a file of prompts (--prompts, decoded
// together: generate_batch.cpp). Private to src/tools.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/decoder.hpp"
#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

struct SamplingOptions {
    double temperature = 0.8;  // 0: greedy
    int top_k = 40;            // 0: the whole vocabulary
};

// An empty prompt's ids: the one token a continuation starts from (id 10, the newline byte of
// quintet's byte and BPE vocabularies; 0 in a smaller vocabulary).
inline void start_if_empty(std::vector<uint32_t>& ids, const Tokenizer& tok) {
    if (ids.empty()) ids.push_back(uint32_t('\n') < uint32_t(tok.vocab_size()) ? '\n' : 0);
}

// The next token from logits z[V]: the greedy choice at temperature 0, else a draw among the
// top_k at that temperature. `order` is scratch of V ints.
int choose_token(const float* z, int V, const SamplingOptions& o, std::mt19937_64& rng, std::vector<int>& order);

struct PromptsOptions {
    std::string file;         // one prompt per line; "-": standard input
    int batch = 16;           // sequences decoded together at most
    int tokens = 200;         // new tokens per prompt at most
    int stop_id = -1;         // a token that ends a sequence (-1: none)
    int64_t seed = 1;         // every prompt's sampling starts from this seed
    bool print_ids = false;   // the ids in each output line
    bool full_kv = false;     // --kv-cache full
    std::string checkpoint;   // for the messages
};

// The prompts of o.file, each encoded with `tok`, decoded `batch` at a time: one forward per
// step with a row per unfinished sequence, a finished sequence's place taken by the next prompt.
// One JSON line per prompt on stdout, in the file's order; the rates on stderr.
int generate_prompts(Backend& be, const ModelConfig& model, const RopeConfig& rope, int trained, const ParamTable& table,
                     const std::vector<float>& params, const Tokenizer& tok, const SamplingOptions& sampling,
                     const PromptsOptions& o);

// The warning for positions the weights never saw (as train and eval warn): `prompt` tokens
// (the longest prompt, `what`) and `tokens` new ones past the context the checkpoint was trained
// at without a scaling rule, or past YaRN's extended one.
void warn_untrained_positions(const RopeConfig& rope, int trained, int64_t prompt, int tokens, const std::string& what,
                              const std::string& ckpt);

// The prompts of a --prompts file ("-": standard input): its lines (a final newline ends the
// last one; "\r\n" is a newline); ConfigError naming the file when it cannot be read or has no line.
std::vector<std::string> read_prompts(const std::string& file);

}  // namespace quintet
