// Incremental decoding with a KV cache (quintet generate): the training model's own chunk and
// blocks on one new token at a time, each attention block keeping its cache object
// (model/kv_cache.hpp), so a token costs one row of every matmul and one attention row over the cache.
// Single process, the whole model (tp = pp = 1, host memory); a test checks it against the
// training forward on the same tokens.
#pragma once
#include <map>
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
            bool full_kv = false,  // full_kv: per-head K|V even where a compressed cache exists
            int sequences = 1);    // sequences decoded together (step_batch), each up to max_len

    // Feeds token `id` at position `pos` (0, 1, 2, ... in order); returns the logits [V] of the
    // next token. Positions must be < max_len.
    const std::vector<float>& step(int id, int pos);
    // Feeds the n tokens `ids` at positions 0 .. n-1 in one forward (a chunk of n rows: every
    // matmul has n rows, not one), filling the caches as n steps would; returns the logits [V]
    // after the last. Only on a fresh decoder; step(id, n) continues from it.
    const std::vector<float>& prefill(const int32_t* ids, int n);

    // Several sequences at once (quintet generate --prompts). select(s): the sequence that
    // step, prefill, forward, cached and truncate work on (0 at first); reset(s): sequence s
    // forgets its tokens, for the next prompt. step_batch: one new token for each of n
    // sequences, ids[r] the next token of sequence seqs[r] (at its cached length), in one
    // forward of n rows; the logits [n, V], row r's the same bits as step() on that sequence.
    void select(int s);
    void reset(int s);
    int length(int s) const;
    const std::vector<float>& step_batch(const int* seqs, const int32_t* ids, int n);
    size_t cache_bytes_per_token() const;  // over all layers

    // Speculative decoding (model/speculative.hpp). forward: the n tokens `ids` at positions
    // pos0 .. pos0 + n - 1 (pos0 = cached()) in one forward through the caches; the logits of
    // every row [n, V]. truncate: forget the cached tokens from position len on (rejected drafts).
    const std::vector<float>& forward(const int32_t* ids, int n, int pos0);
    int cached() const;
    void truncate(int len);
    // keep_hidden: every call from now on also keeps the final norm's output of its rows
    // (hidden(), [n, C]): h^0, what the first MTP module reads.
    void keep_hidden(bool on) { keep_hidden_ = on; }
    const std::vector<float>& hidden() const { return hidden_; }
    // The checkpoint's MTP modules (model.mtp_depth), each with its own cache. mtp(k, ...): module
    // k (0-based) on the n rows at positions pos0 .. (pos0 = mtp_cached(k)), h_prev [n, C] the
    // previous depth's hidden state (h^0 for module 0), ids [n] the tokens each row embeds; h_out
    // [n, C] gets h^{k+1}; returns the last row's logits [V].
    int mtp_depth() const { return model_.mtp_depth; }
    const std::vector<float>& mtp(int k, const float* h_prev, const int32_t* ids, int n, int pos0, float* h_out);
    int mtp_cached(int k) const;
    void mtp_truncate(int k, int len);

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
    std::vector<std::unique_ptr<KvCache>> mtp_caches_;  // one per MTP module
    std::map<int, std::unique_ptr<ModelChunk>> chunks_;  // by rows (> 1), built on first use
    bool keep_hidden_ = false;
    std::vector<float> hidden_;  // [n, C] of the last call (keep_hidden)
    std::vector<int32_t> batch_pos_;  // step_batch's row positions
    ModelChunk& rows(int n);     // a chunk of n rows (chunk_ for one)
    // all_rows: the logits of every row into out [N, V], else the last row's [V].
    // positions: each row's (host), else pos0, pos0 + 1, ...
    void run(ModelChunk& c, const int32_t* ids, int pos0, std::vector<float>& out, bool all_rows = false,
             const int32_t* positions = nullptr);
};

}  // namespace quintet
