#include "quintet/model/decoder.hpp"

namespace quintet {

namespace {
ChunkOptions decode_options(int train_seq_len, int max_len) {
    ChunkOptions o;
    o.max_positions = max_len;
    o.rope_seq_len = train_seq_len;
    return o;
}
}  // namespace

Decoder::Decoder(Backend& be, const ModelConfig& model, const RopeConfig& rope, int train_seq_len,
                 const ParamTable& table, const std::vector<float>& params, int max_len, bool full_kv)
    : tp_(self_, false),
      be_(be),
      model_(model),
      rope_(rope),
      table_(table),
      train_seq_len_(train_seq_len),
      max_len_(max_len),
      chunk_(be, model, rope, table, stage_chunks(model.n_layers, 1, 1, 0, {})[0], tp_, 1, 1,
             decode_options(train_seq_len, max_len)),
      params_(params.data()) {
    caches_ = chunk_.make_caches(max_len, full_kv);
}

const std::vector<float>& Decoder::step(int id, int pos) {
    const int32_t token = id;
    return chunk_.forward_cached(params_, &token, pos, caches_);
}

const std::vector<float>& Decoder::prefill(const int32_t* ids, int n) {
    ModelChunk batch(be_, model_, rope_, table_, stage_chunks(model_.n_layers, 1, 1, 0, {})[0], tp_, 1, n,
                     decode_options(train_seq_len_, max_len_));
    prefill_logits_ = batch.forward_cached(params_, ids, 0, caches_);
    return prefill_logits_;
}

size_t Decoder::cache_bytes_per_token() const {
    size_t b = 0;
    for (const auto& c : caches_) b += c->bytes_per_token();
    return b;
}

}  // namespace quintet
