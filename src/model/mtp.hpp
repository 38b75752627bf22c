// DeepSeek-V3's multi-token prediction modules (model.mtp_depth; the maths in docs/math.md §11):
// what each module keeps per microbatch, for the chunk's buffer layout (model/slot_store.cpp) and
// the planner. The modules run on the last chunk (ModelChunk's mtp_forward / mtp_backward,
// model/mtp.cpp).
#pragma once
#include "quintet/model/block.hpp"
#include "quintet/model/buffers.hpp"

namespace quintet {

// eh_proj: [RMSNorm(embedding) | RMSNorm(h)] [Nr, 2C] -> [Nr, C], its input kept per slot.
LinearDecl mtp_eh_decl(size_t Nr, size_t C);

// Module `layer` (model.layers.<n_layers + k>): its decoder layer's declarations (norms,
// attention, feed-forward; the layer kinds of the last decoder layer) and its own -- the
// shifted ids, the embedding rows, the norms' statistics, the projection's input, the layer's
// input and output, the head's input and logits. Per slot under every schedule; the layer is
// never recomputed. `out.deferred`: what W needs of B (per slot under a split schedule).
void mtp_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, int layer, BufferDecl& out);

}  // namespace quintet
