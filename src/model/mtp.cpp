// DeepSeek-V3's multi-token prediction (docs/math.md §11) on the last chunk. Module k = 1..D
// (layer L+k-1) at row i of a sample:
//     e   = Emb(t[i+k])                                   the shared embedding
//     u   = eh_proj([RMSNorm_e(e) | RMSNorm_h(h^{k-1})])   2C -> C
//     h^k = DecoderLayer(u)                                of the model's kinds
//     p^k = softmax(Head(RMSNorm_f(h^k)))                  the shared head; predicts t[i+k+1]
// with h^0 the main model's final-norm output (what DeepSeek-V3's released module is fed by
// Megatron-LM, vLLM and llama.cpp). The rows whose token k+1 ahead is past the sample's end add
// nothing. The loss adds mtp_weight / D times each module's cross-entropy summed over its valid
// rows, normalised like the main loss (by every target token of the global batch: DeepSeek-V3's
// 1/T); its gradient is the loss head's grad_scale times mtp_weight / D.
//
// The backward runs whole (the chunk refuses split schedules and ZeRO >= 2 units with MTP), last
// module first: each one's head, its layer, its projection, its two norms -- the embedding's
// gradient accumulated into the shared embedding (or the last stage's copy of it), h^{k-1}'s
// into the module before, h^0's into the main head's input gradient before the final norm.
#include "mtp.hpp"

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/slot_store.hpp"
#include "quintet/model/transformer.hpp"

namespace quintet {

namespace {

constexpr I32Buf kMtpIds{"mtp.ids"}, kMtpTargets{"mtp.targets"};
constexpr F32Buf kMtpE{"mtp.e"}, kMtpRstdE{"mtp.rstd_e"}, kMtpRstdH{"mtp.rstd_h"}, kMtpX{"mtp.x"}, kMtpOut{"mtp.out"};
constexpr F32Buf kMtpRstdF{"mtp.rstd_f"}, kMtpLogits{"mtp.logits"};
constexpr ActBuf kMtpXf{"mtp.xf"};
// Shared scratch of the backward (one microbatch at a time).
constexpr F32Buf kMtpD0{"mtp.d0"}, kMtpD1{"mtp.d1"}, kMtpDh0{"mtp.dh0"}, kMtpDe{"mtp.de"}, kMtpDen{"mtp.den"};
constexpr F32Buf kMtpDcat{"mtp.dcat"}, kMtpCat32{"mtp.cat32"};

}  // namespace

LinearDecl mtp_eh_decl(size_t Nr, size_t C) { return {"mtp.eh", Nr, 2 * C, C, LinearInput::kept}; }

void mtp_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, int layer, BufferDecl& out) {
    const size_t N = size_t(s.N), Nr = size_t(s.Nr), C = size_t(d.C);
    BufferDecl attn, ffn;
    attention_declare_buffers(m, d, s, layer, attn);
    feed_forward_declare_buffers(m, d, s, layer, ffn);
    // The decoder layer's values, as a decoder layer lays them out.
    out.saved = attn.saved;
    declare_layer_norms(out, Nr, C);
    out.saved.insert(out.saved.end(), ffn.saved.begin(), ffn.saved.end());
    for (const BufferDecl* b : {&attn, &ffn}) {
        out.shared.insert(out.shared.end(), b->shared.begin(), b->shared.end());
        out.deferred.insert(out.deferred.end(), b->deferred.begin(), b->deferred.end());
        out.operands(b->operand);
        out.ring_kv = std::max(out.ring_kv, b->ring_kv);
        out.ring_out = std::max(out.ring_out, b->ring_out);
        out.ring_lse = std::max(out.ring_lse, b->ring_lse);
        out.exchange = std::max(out.exchange, b->exchange);
    }
    // The module's own.
    out.per_slot(kMtpIds, N);         // the shifted ids: the embedding's backward
    out.per_slot(kMtpE, Nr * C);      // the embedding rows: RMSNorm_e's input
    out.per_slot(kMtpRstdE, Nr);
    out.per_slot(kMtpRstdH, Nr);
    declare_input(out, mtp_eh_decl(Nr, C));  // [RMSNorm_e(e) | RMSNorm_h(h)]
    out.per_slot(kMtpX, Nr * C);      // the layer's input (eh_proj's output)
    out.per_slot(kMtpOut, Nr * C);    // the layer's output h^k
    out.per_slot(kMtpRstdF, Nr);
    out.per_slot(kMtpXf, Nr * C);     // RMSNorm_f(h^k): the head's input
    out.per_slot(kMtpLogits, N * size_t(d.Vl()));  // then the gradient of the module's loss
    declare_grad(out, mtp_eh_decl(Nr, C), s);
    out.scratch(kMtpTargets, N);
    for (F32Buf b : {kMtpD0, kMtpD1, kMtpDh0, kMtpDe, kMtpDen}) out.scratch(b, Nr * C);
    out.scratch(kMtpDcat, Nr * 2 * C);
    if (s.bf16) out.scratch(kMtpCat32, Nr * 2 * C);
}

void ModelChunk::mtp_build(const ModelConfig& m, const ParamTable& table, double weight) {
    QUINTET_CHECK(!units_, "model.mtp_depth with parallel.zero >= 2");
    QUINTET_CHECK(!lin_.split_bw, "model.mtp_depth with a split-backward schedule");
    const ModelDims& d = ctx_.d;
    const float eps = float(m.norm_eps);
    mtp_wte_ = table.offset_of("model.embed_tokens.weight");
    mtp_weight_ = float(weight / m.mtp_depth);
    for (int k = 0; k < m.mtp_depth; ++k) {
        const int l = d.L + k;
        const std::string p = "model.layers." + std::to_string(l) + ".";
        MtpModule md{RmsNormLayer(lin_, table, p + "enorm.weight", d.C, eps, "mtp.enorm"),
                     RmsNormLayer(lin_, table, p + "hnorm.weight", d.C, eps, "mtp.hnorm"),
                     std::make_unique<Linear>(lin_, table, mtp_eh_decl(size_t(ctx_.Nr), size_t(d.C)),
                                              p + "eh_proj.weight", "gemm.mtp"),
                     Layer{RmsNormLayer(lin_, table, p + "input_layernorm.weight", d.C, eps, "norm1"),
                           RmsNormLayer(lin_, table, p + "post_attention_layernorm.weight", d.C, eps, "norm2"),
                           make_attention_block(ctx_, m, table, l), make_feed_forward_block(ctx_, m, table, l), -1},
                     RmsNormLayer(lin_, table, p + "shared_head.norm.weight", d.C, eps, "mtp.head_norm")};
        mtp_.push_back(std::move(md));
    }
}

void ModelChunk::mtp_add_slot(Slot& s) {
    for (size_t k = 0; k < mtp_.size(); ++k) {
        MtpModule& md = mtp_[k];
        md.block.attn->add_slot(s.mtp[k]);
        md.block.ffn->add_slot(s.mtp[k]);
        md.eh->add_slot(s.mtp[k]);
        md.block.attn->add_w_slot(store_.shared());
        md.block.ffn->add_w_slot(store_.shared());
        md.eh->add_w_slot(store_.shared());
    }
    mtp_sums_.push_back(0.0);
}

double ModelChunk::mtp_loss(int slot) const { return mtp_.empty() ? 0.0 : mtp_sums_[size_t(slot)]; }

void ModelChunk::mtp_forward(int si, const float* params, const int32_t* targets, float grad_scale) {
    QUINTET_PROFILE("mtp");
    Slot& s = store_.slot(si);
    const ModelDims& d = ctx_.d;
    const int N = ctx_.N, Nr = ctx_.Nr, C = d.C, Tl = ctx_.T, T = seq_;
    const int cp_rank = ctx_.cp ? ctx_.cp->rank() : 0;
    const BufferViews& sh = store_.shared();
    int32_t* tgt = sh[kMtpTargets];
    float* cat32 = lin_.bf16() ? sh[kMtpCat32] : nullptr;
    mtp_host_.ids.resize(size_t(N));
    mtp_host_.tgt.resize(size_t(N));
    mtp_host_.masked.clear();
    mtp_losses_.resize(size_t(N));
    auto local = [&](int32_t x) { return x >= d.v0 && x < d.v1 ? x - d.v0 : -1; };
    double sum = 0.0;
    const float* h = s.mtp_h0;  // h^0
    for (size_t k = 0; k < mtp_.size(); ++k) {
        MtpModule& md = mtp_[k];
        const BufferViews& v = s.mtp[k];
        const int ahead = int(k) + 1;
        // Row n (position p of sample b) embeds t[p+k+1] = targets[p+k] and predicts t[p+k+2] =
        // targets[p+k+1]; a row past the sample's end embeds token 0 and predicts nothing.
        mtp_host_.masked.clear();
        for (int n = 0; n < N; ++n) {
            const int b = n / Tl, p = store_.global_position(cp_rank, n % Tl);
            const int32_t* row = targets + size_t(b) * T;
            mtp_host_.ids[size_t(n)] = local(p + ahead - 1 < T ? row[p + ahead - 1] : 0);
            const bool valid = p + ahead < T;
            mtp_host_.tgt[size_t(n)] = valid ? local(row[p + ahead]) : -1;
            if (!valid) mtp_host_.masked.push_back(n);
        }
        int32_t* ids = v[kMtpIds];
        be_.from_host_i32(ids, mtp_host_.ids.data(), size_t(N));
        be_.from_host_i32(tgt, mtp_host_.tgt.data(), size_t(N));
        // e: the vocabulary-parallel lookup (each tp rank its rows, the sum over tp completes it).
        float* e = v[kMtpE];
        if (tp_.size() == 1) {
            be_.embedding_forward(e, ids, params + mtp_wte_, N, C);
        } else {
            be_.embedding_forward(lin_.full_b, ids, params + mtp_wte_, N, C);
            be_.copy(e, tp_.reduce(lin_.full_b, lin_.dshard, size_t(N), size_t(C)), size_t(Nr) * C);
        }
        // The projection's input [RMSNorm_e(e) | RMSNorm_h(h)], then u = eh_proj(input).
        float* in = md.eh->input(si, cat32);
        md.enorm.forward(lin_.full_a, v[kMtpRstdE], e, params, Nr);
        be_.copy_2d(in, size_t(2) * C, lin_.full_a, size_t(C), size_t(Nr), size_t(C), false);
        md.hnorm.forward(lin_.full_a, v[kMtpRstdH], h, params, Nr);
        be_.copy_2d(in + C, size_t(2) * C, lin_.full_a, size_t(C), size_t(Nr), size_t(C), false);
        md.eh->input_written(si, in, size_t(Nr));
        float* x = v[kMtpX];
        md.eh->forward_kept(si, Nr, x, params);
        // The decoder layer: x -> h^k.
        LayerSaved l = layer_saved(v);
        float* out = v[kMtpOut];
        md.block.norm1.forward(l.xn1, lin_.full_a, l.rstd1, x, params, Nr);
        md.block.attn->forward(si, s.tok, params, l.xn1, x, l.h, nullptr);
        md.block.norm2.forward(l.xn2, lin_.full_a, l.rstd2, l.h, params, Nr);
        md.block.ffn->forward(si, params, l.xn2, l.h, out);
        // The shared head and this module's loss (the rows past the end: none, no gradient).
        const Act xf = v[kMtpXf];
        float* logits = v[kMtpLogits];
        md.head_norm.forward(xf, lin_.full_a, v[kMtpRstdF], out, params, Nr);
        head_->forward(xf, logits, params);
        head_->loss(logits, mtp_losses_.data(), tgt, grad_scale * mtp_weight_, true, xent_);
        for (int n : mtp_host_.masked) {
            mtp_losses_[size_t(n)] = 0.0f;
            be_.zero(logits + size_t(n) * d.Vl(), size_t(d.Vl()));
        }
        for (float x_n : mtp_losses_) sum += x_n;
        h = out;
    }
    mtp_sums_[size_t(si)] = sum;
}

// The modules' backward, last first; returns dL/dh^0 [Nr, C] (scratch, until the next MTP call).
float* ModelChunk::mtp_backward(int si, const float* params, float* grads) {
    QUINTET_PROFILE("mtp");
    Slot& s = store_.slot(si);
    const ModelDims& d = ctx_.d;
    const int N = ctx_.N, Nr = ctx_.Nr, C = d.C;
    const size_t NrC = size_t(Nr) * C;
    const BufferViews& sh = store_.shared();
    float* dbuf[2] = {sh[kMtpD0], sh[kMtpD1]};
    float *dh0 = sh[kMtpDh0], *de = sh[kMtpDe], *den = sh[kMtpDen], *dcat = sh[kMtpDcat];
    const int D = int(mtp_.size());
    be_.zero(dbuf[(D - 1) % 2], NrC);
    for (int k = D - 1; k >= 0; --k) {
        MtpModule& md = mtp_[size_t(k)];
        const BufferViews& v = s.mtp[size_t(k)];
        float* dres = dbuf[k % 2];  // dL/dh^k (from the module after), then dL/d(the layer's input)
        LayerSaved l = layer_saved(v);
        // The head (its weight's gradient into the shared head) and RMSNorm_f.
        const float* dxf = head_->backward(v[kMtpLogits], v[kMtpXf], params, grads);
        md.head_norm.backward(dres, grads, dxf, v[kMtpOut], params, v[kMtpRstdF], Nr);
        // The decoder layer, as the main walk runs one.
        const float* dhn = md.block.ffn->backward_input(si, si, params, l.xn2, dres);
        md.block.ffn->backward_weight(si, si, grads, l.xn2);
        md.block.norm2.backward(dres, grads, dhn, l.h, params, l.rstd2, Nr);
        const float* dxn = md.block.attn->backward_input(si, si, s.tok, params, l.xn1, dres);
        md.block.attn->backward_weight(si, si, s.tok, grads, l.xn1, false);
        md.block.norm1.backward(dres, grads, dxn, v[kMtpX], params, l.rstd1, Nr);
        // eh_proj: its input's gradient [d(norm_e) | d(norm_h)], then its weight's.
        md.eh->backward_input(si, dres, Nr, dcat, params);
        md.eh->backward_weight_kept(si, si, Nr, grads);
        // RMSNorm_e, then the embedding rows' gradient into the shared embedding.
        be_.copy_2d(den, size_t(C), dcat, size_t(2) * C, size_t(Nr), size_t(C), false);
        be_.zero(de, NrC);
        md.enorm.backward(de, grads, den, v[kMtpE], params, v[kMtpRstdE], Nr);
        be_.embedding_backward(grads + mtp_wte_, tp_.gather(de, lin_.full_a, size_t(N), size_t(C)), v[kMtpIds], N, C,
                               d.Vl());
        // RMSNorm_h into h^{k-1}: the module before's output, or the main model's final norm output.
        float* dprev = k > 0 ? dbuf[(k - 1) % 2] : dh0;
        be_.zero(dprev, NrC);
        be_.copy_2d(den, size_t(C), dcat + C, size_t(2) * C, size_t(Nr), size_t(C), false);
        const float* hprev = k > 0 ? s.mtp[size_t(k - 1)][kMtpOut] : s.mtp_h0;
        md.hnorm.backward(dprev, grads, den, hprev, params, v[kMtpRstdH], Nr);
    }
    return dh0;
}

}  // namespace quintet
