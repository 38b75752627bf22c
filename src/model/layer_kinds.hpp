// The block kinds the deck can choose (private to model/): each kind's tensors, activation
// buffers and instances. Adding a kind = one file (model/<kind>.cpp) with these three
// functions, and a case in layer_kinds.cpp.
#pragma once
#include <memory>

#include "quintet/model/block.hpp"

namespace quintet {

void mha_add_params(ParamBuilder& b, int layer);
void mha_declare_buffers(const ModelDims& d, const BufferShape& s, BufferDecl& out);
std::unique_ptr<AttentionBlock> make_mha_attention(BlockContext& ctx, const ParamTable& table, int layer);

void mla_add_params(const ModelConfig& m, ParamBuilder& b, int layer);
void mla_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, BufferDecl& out);
std::unique_ptr<AttentionBlock> make_mla_attention(BlockContext& ctx, const ModelConfig& m,
                                                   const ParamTable& table, int layer);

void moe_add_params(const ModelConfig& m, ParamBuilder& b, int layer);
void moe_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, BufferDecl& out);
std::unique_ptr<FeedForwardBlock> make_moe_feed_forward(BlockContext& ctx, const ModelConfig& m,
                                                        const ParamTable& table, int layer);

void swiglu_add_params(ParamBuilder& b, int layer);
void swiglu_declare_buffers(const ModelDims& d, const BufferShape& s, BufferDecl& out);
std::unique_ptr<FeedForwardBlock> make_swiglu_feed_forward(BlockContext& ctx, const ParamTable& table,
                                                           int layer);

}  // namespace quintet
