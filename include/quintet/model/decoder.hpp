// Incremental decoding with a KV cache (quintet generate): the training model's own chunk and
// blocks on one new token at a time, each attention block keeping its cache object
// (model/kv_cache.hpp), so a token costs one row of every matmul and one attention row over the cache.
// Single process, the whole model (tp = pp = 1, host memory); a test checks it against the
// training forward on the same tokens.
#pragma once
#include <memory>
#include <vector>

#include "quintet/comm/self_communicator.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/transformer.hpp"

namespace quintet {

class Decoder {
public:
    // params: the whole model's arena in `table`'s layout. train_seq_len stands in for
    // rope.original_max_position = 0 (as in training).
    Decoder(Backend& be, const ModelConfig& model, const RopeConfig& rope, int train_seq_len,
            const ParamTable& table, const std::vector<float>& params, int max_len,
            bool full_kv = false);  // full_kv: per-head K|V even where a compressed cache exists

    // Feeds token `id` at position `pos` (0, 1, 2, ... in order); returns the logits [V] of the
    // next token. Positions must be < max_len.
    const std::vector<float>& step(int id, int pos);
    // Feeds the n tokens `ids` at positions 0 .. n-1 in one forward (a chunk of n rows: every
    // matmul has n rows, not one), filling the caches as n steps would; returns the logits [V]
    // after the last. Only on a fresh decoder; step(id, n) continues from it.
    const std::vector<float>& prefill(const int32_t* ids, int n);
    size_t cache_bytes_per_token() const;  // over all layers

private:
    SelfCommunicator self_;
    TensorParallel tp_;
    Backend& be_;
    ModelConfig model_;
    RopeConfig rope_;
    const ParamTable& table_;
    int train_seq_len_, max_len_;
    ModelChunk chunk_;
    const float* params_;
    std::vector<float> logits_;  // [V] the last call's
    std::vector<std::unique_ptr<KvCache>> caches_;
    void run(ModelChunk& c, const int32_t* ids, int pos0, std::vector<float>& out);
};

}  // namespace quintet
