// Incremental decoding with a KV cache (quintet generate): each new token costs one row of every
// matmul and one attention row over the cached keys and values, instead of re-running the
// prefix. Single process, the whole model (tp = pp = 1); a test checks it against the training
// forward on the same tokens.
#pragma once
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/rope.hpp"

namespace quintet {

class Decoder {
public:
    Decoder(Backend& be, const ModelConfig& model, const RopeConfig& rope, int train_seq_len,
            const ParamTable& table, const std::vector<float>& params, int max_len)
        : be_(be), d_(model_dims(model)),
          w_(chunk_view(table, stage_chunks(model.n_layers, 1, 1, 0, "")[0],
                        const_cast<float*>(params.data()))),
          max_len_(max_len), eps_(float(model.norm_eps)) {
        rope_tables(cos_, sin_, max_len, rope_inv_freq(rope, d_.HD, train_seq_len),
                    rope_mscale(rope));
        kcache_.assign(size_t(d_.L) * max_len * d_.NKV * d_.HD, 0.0f);
        vcache_.assign(kcache_.size(), 0.0f);
        x_.resize(d_.C); xn_.resize(d_.C); qkv_.resize(d_.qkv_local()); att_.resize(d_.NH * d_.HD);
        gu_.resize(2 * d_.F); act_.resize(d_.F); logits_.resize(d_.V); scores_.resize(max_len);
    }

    // Feeds token `id` at position `pos` (0, 1, 2, ... in order); returns the logits [V] of the
    // next token. Positions must be < max_len.
    const std::vector<float>& step(int id, int pos);

private:
    Backend& be_;
    ModelDims d_;
    ChunkView w_;
    int max_len_;
    float eps_;
    std::vector<float> cos_, sin_, kcache_, vcache_, x_, xn_, qkv_, att_, gu_, act_, logits_, scores_;
};

}  // namespace quintet
