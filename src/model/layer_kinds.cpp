// Which block kind each layer runs, from the deck: model.attention (mha | mla)
// and the feed-forward kind (SwiGLU; MoE on the layers moe.layers names).
#include "layer_kinds.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

namespace {
void require_known(const ModelConfig& m) {
    QUINTET_CHECK(m.attention == "mha" || m.attention == "mla", "model.attention = " + m.attention + " is not built");
}
}  // namespace

void attention_add_params(const ModelConfig& m, ParamBuilder& b, int layer) {
    require_known(m);
    if (m.attention == "mla") mla_add_params(m, b, layer);
    else mha_add_params(b, layer);
}

void feed_forward_add_params(const ModelConfig& m, ParamBuilder& b, int layer) {
    if (moe_layer(m, layer)) moe_add_params(m, b, layer);
    else swiglu_add_params(b, layer);
}

void attention_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, int layer,
                               BufferDecl& out) {
    (void)layer;  // every layer has the deck's attention kind
    require_known(m);
    if (m.attention == "mla") mla_declare_buffers(m, d, s, out);
    else mha_declare_buffers(d, s, out);
}

void feed_forward_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, int layer,
                                  BufferDecl& out) {
    if (moe_layer(m, layer)) moe_declare_buffers(m, d, s, out);
    else swiglu_declare_buffers(d, s, out);
}

std::unique_ptr<AttentionBlock> make_attention_block(BlockContext& ctx, const ModelConfig& m,
                                                     const ParamTable& table, int layer) {
    require_known(m);
    if (m.attention == "mla") return make_mla_attention(ctx, m, table, layer);
    return make_mha_attention(ctx, table, layer);
}

std::unique_ptr<FeedForwardBlock> make_feed_forward_block(BlockContext& ctx, const ModelConfig& m,
                                                          const ParamTable& table, int layer) {
    if (moe_layer(m, layer)) return make_moe_feed_forward(ctx, m, table, layer);
    return make_swiglu_feed_forward(ctx, table, layer);
}

}  // namespace quintet
