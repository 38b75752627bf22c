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
// The backward runs last module first: each one's head, its layer, its projection, its two norms
// -- the embedding's gradient accumulated into the shared embedding (or the last stage's copy of
// it), h^{k-1}'s into the module before, h^0's into the main head's input gradient before the
// final norm. It runs whole, or split as the zero-bubble schedules split the decoder's (B: every
// input gradient, dL/dh^0 among them; W later: every weight gradient, from what B kept per slot).
// Under ZeRO >= 2 each module is a unit (layers.<n_layers + k>); its parts run under the scopes of
// their units one at a time -- the module's, the shared head's, the embedding's -- each reduced
// when its part is done (the head's and the embedding's once per module and once more for the
// main model: more reductions, the same sums).
#include "mtp.hpp"

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/slot_store.hpp"
#include "quintet/model/transformer.hpp"
#include "unit_scope.hpp"

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
    // What W needs of B besides the blocks' and eh_proj's: the norms' incoming gradients and the
    // embedding rows' gradient -- deferred (per slot under a split schedule), else scratch.
    if (s.split_bw) {
        for (const char* id : {"mtp.enorm", "mtp.hnorm", "norm1", "norm2", "mtp.head_norm"})
            RmsNormLayer::declare_grad(out, id, Nr, C);
        out.defer(kMtpDe, Nr * C);
    } else {
        out.scratch(kMtpDe, Nr * C);
    }
    out.scratch(kMtpTargets, N);
    for (F32Buf b : {kMtpD0, kMtpD1, kMtpDh0, kMtpDen}) out.scratch(b, Nr * C);
    out.scratch(kMtpDcat, Nr * 2 * C);
    if (s.bf16) out.scratch(kMtpCat32, Nr * 2 * C);
}

void ModelChunk::mtp_build(const ModelConfig& m, const ParamTable& table, double weight) {
    const ModelDims& d = ctx_.d;
    const float eps = float(m.norm_eps);
    auto unit_of = [&](const std::string& tensor) { return units_ ? table.find(tensor)->unit : -1; };
    mtp_.wte = table.offset_of("model.embed_tokens.weight");
    mtp_.embed_unit = unit_of("model.embed_tokens.weight");
    mtp_.weight = float(weight / m.mtp_depth);
    for (int k = 0; k < m.mtp_depth; ++k) {
        const int l = d.L + k;
        const std::string p = "model.layers." + std::to_string(l) + ".";
        MtpModule md{RmsNormLayer(lin_, table, p + "enorm.weight", d.C, eps, "mtp.enorm"),
                     RmsNormLayer(lin_, table, p + "hnorm.weight", d.C, eps, "mtp.hnorm"),
                     std::make_unique<Linear>(lin_, table, mtp_eh_decl(size_t(ctx_.Nr), size_t(d.C)),
                                              p + "eh_proj.weight", "gemm.mtp"),
                     Layer{RmsNormLayer(lin_, table, p + "input_layernorm.weight", d.C, eps, "norm1"),
                           RmsNormLayer(lin_, table, p + "post_attention_layernorm.weight", d.C, eps, "norm2"),
                           make_attention_block(ctx_, m, table, l), make_feed_forward_block(ctx_, m, table, l),
                           unit_of(p + "enorm.weight")},
                     RmsNormLayer(lin_, table, p + "shared_head.norm.weight", d.C, eps, "mtp.head_norm")};
        mtp_.modules.push_back(std::move(md));
    }
    mtp_.losses.resize(size_t(ctx_.N));
    mtp_.ids.resize(size_t(ctx_.N));
    mtp_.tgt.resize(size_t(ctx_.N));
    mtp_.masked.reserve(size_t(ctx_.N));
}

void ModelChunk::mtp_add_slot(Slot& s) {
    for (size_t k = 0; k < mtp_.modules.size(); ++k) {
        MtpModule& md = mtp_.modules[k];
        md.block.attn->add_slot(s.mtp[k]);
        md.block.ffn->add_slot(s.mtp[k]);
        md.eh->add_slot(s.mtp[k]);
        // What W needs of B: the slot's own under a split schedule, else the shared scratch.
        const BufferViews& w = lin_.split_bw ? s.mtp[k] : store_.shared();
        md.block.attn->add_w_slot(w);
        md.block.ffn->add_w_slot(w);
        md.eh->add_w_slot(w);
        if (lin_.split_bw)
            for (RmsNormLayer* n : {&md.enorm, &md.hnorm, &md.block.norm1, &md.block.norm2, &md.head_norm})
                n->add_w_slot(w);
    }
    mtp_.sums.push_back(0.0);
}

double ModelChunk::mtp_loss(int slot) const { return mtp_.modules.empty() ? 0.0 : mtp_.sums[size_t(slot)]; }

// Row n (position p of sample b) of module k = ahead - 1 embeds t[p+k+1] = targets[p+k] and
// predicts t[p+k+2] = targets[p+k+1]; a row past the sample's end embeds token 0 and predicts
// nothing.
void ModelChunk::mtp_shift(int ahead, const int32_t* targets) {
    const ModelDims& d = ctx_.d;
    const int N = ctx_.N, Tl = ctx_.T, T = seq_;
    const int cp_rank = ctx_.cp ? ctx_.cp->rank() : 0;
    auto local = [&](int32_t x) { return x >= d.v0 && x < d.v1 ? x - d.v0 : -1; };
    mtp_.masked.clear();
    for (int n = 0; n < N; ++n) {
        const int b = n / Tl, p = store_.global_position(cp_rank, n % Tl);
        const int32_t* row = targets + size_t(b) * T;
        mtp_.ids[size_t(n)] = local(p + ahead - 1 < T ? row[p + ahead - 1] : 0);
        const bool valid = p + ahead < T;
        mtp_.tgt[size_t(n)] = valid ? local(row[p + ahead]) : -1;
        if (!valid) mtp_.masked.push_back(n);
    }
}

// Each part under its ZeRO unit's scope, one at a time (the embedding's, the module's, the
// head's: model/unit_scope.hpp): what the parameter windows hold never needs more than one in use.
void ModelChunk::mtp_forward(int si, const float* params, const int32_t* targets, float grad_scale, bool need_grad) {
    if (!need_grad) {  // evaluation: the main loss only
        mtp_.sums[size_t(si)] = 0.0;
        return;
    }
    QUINTET_PROFILE("mtp");
    Slot& s = store_.slot(si);
    const ModelDims& d = ctx_.d;
    const int N = ctx_.N, Nr = ctx_.Nr, C = d.C;
    const BufferViews& sh = store_.shared();
    int32_t* tgt = sh[kMtpTargets];
    float* cat32 = lin_.bf16() ? sh[kMtpCat32] : nullptr;
    const size_t D = mtp_.modules.size();
    // Every module's shifted ids and embedding rows: e = the vocabulary-parallel lookup (each tp
    // rank its rows, the sum over tp completes it).
    {
        UnitScope u(units_, lin_, mtp_.embed_unit, params, nullptr, true);
        u.prefetch(mtp_.modules[0].block.unit);
        for (size_t k = 0; k < D; ++k) {
            const BufferViews& v = s.mtp[k];
            mtp_shift(int(k) + 1, targets);
            int32_t* ids = v[kMtpIds];
            be_.from_host_i32(ids, mtp_.ids.data(), size_t(N));
            float* e = v[kMtpE];
            if (tp_.size() == 1) {
                be_.embedding_forward(e, ids, u.params + mtp_.wte, N, C);
            } else {
                be_.embedding_forward(lin_.full_b, ids, u.params + mtp_.wte, N, C);
                be_.copy(e, tp_.reduce(lin_.full_b, lin_.dshard, size_t(N), size_t(C)), size_t(Nr) * C);
            }
        }
    }
    double sum = 0.0;
    const float* h = s.mtp_h0;  // h^0
    for (size_t k = 0; k < D; ++k) {
        MtpModule& md = mtp_.modules[k];
        const BufferViews& v = s.mtp[k];
        float* out = v[kMtpOut];
        const Act xf = v[kMtpXf];
        {
            UnitScope u(units_, lin_, md.block.unit, params, nullptr, true);
            u.prefetch(head_unit_);
            const float* P = u.params;
            // The projection's input [RMSNorm_e(e) | RMSNorm_h(h)], then u = eh_proj(input).
            float* in = md.eh->input(si, cat32);
            md.enorm.forward(lin_.full_a, v[kMtpRstdE], v[kMtpE], P, Nr);
            be_.copy_2d(in, size_t(2) * C, lin_.full_a, size_t(C), size_t(Nr), size_t(C), false);
            md.hnorm.forward(lin_.full_a, v[kMtpRstdH], h, P, Nr);
            be_.copy_2d(in + C, size_t(2) * C, lin_.full_a, size_t(C), size_t(Nr), size_t(C), false);
            md.eh->input_written(si, in, size_t(Nr));
            float* x = v[kMtpX];
            md.eh->forward_kept(si, Nr, x, P);
            // The decoder layer: x -> h^k; then the norm before the shared head.
            LayerSaved l = layer_saved(v);
            md.block.norm1.forward(l.xn1, lin_.full_a, l.rstd1, x, P, Nr);
            md.block.attn->forward(si, s.tok, P, l.xn1, x, l.h, nullptr);
            md.block.norm2.forward(l.xn2, lin_.full_a, l.rstd2, l.h, P, Nr);
            md.block.ffn->forward(si, P, l.xn2, l.h, out);
            md.head_norm.forward(xf, lin_.full_a, v[kMtpRstdF], out, P, Nr);
        }
        // The shared head and this module's loss (the rows past the end: none, no gradient).
        mtp_shift(int(k) + 1, targets);
        be_.from_host_i32(tgt, mtp_.tgt.data(), size_t(N));
        float* logits = v[kMtpLogits];
        {
            UnitScope u(units_, lin_, head_unit_, params, nullptr, true);
            u.prefetch(k + 1 < D ? mtp_.modules[k + 1].block.unit : -1);
            head_->forward(xf, logits, u.params);
        }
        head_->loss(logits, mtp_.losses.data(), tgt, grad_scale * mtp_.weight, true, xent_);
        for (int n : mtp_.masked) {
            mtp_.losses[size_t(n)] = 0.0f;
            be_.zero(logits + size_t(n) * d.Vl(), size_t(d.Vl()));
        }
        for (float x_n : mtp_.losses) sum += x_n;
        h = out;
    }
    mtp_.sums[size_t(si)] = sum;
}

// Per module, last first: the head (B: its input's gradient from the head's parameters; W: its
// weight's into the head's unit), then the module's own parts under its unit (RMSNorm_f, the
// decoder layer as the main walk runs one, eh_proj, RMSNorm_e and RMSNorm_h), then (W) the
// embedding rows' gradient into the embedding the modules read. B then W is the whole backward,
// bit for bit: each part's W in the whole backward's order, from what B kept per slot.
float* ModelChunk::mtp_backward(int si, const float* params, float* grads, Pass pass) {
    QUINTET_PROFILE("mtp");
    Slot& s = store_.slot(si);
    const ModelDims& d = ctx_.d;
    const int N = ctx_.N, Nr = ctx_.Nr, C = d.C;
    const size_t NrC = size_t(Nr) * C;
    const bool B = pass != Pass::weight, W = pass != Pass::input;
    const BufferViews& sh = store_.shared();
    float* dbuf[2] = {sh[kMtpD0], sh[kMtpD1]};
    float *dh0 = sh[kMtpDh0], *den = sh[kMtpDen], *dcat = sh[kMtpDcat];
    const int D = int(mtp_.modules.size());
    if (B) be_.zero(dbuf[(D - 1) % 2], NrC);
    for (int k = D - 1; k >= 0; --k) {
        MtpModule& md = mtp_.modules[size_t(k)];
        const BufferViews& v = s.mtp[size_t(k)];
        float* dres = dbuf[k % 2];  // dL/dh^k (from the module after), then dL/d(the layer's input)
        float* dprev = k > 0 ? dbuf[(k - 1) % 2] : dh0;  // dL/dh^{k-1}
        const float* hprev = k > 0 ? s.mtp[size_t(k - 1)][kMtpOut] : s.mtp_h0;
        float* de = lin_.split_bw ? v[kMtpDe] : sh[kMtpDe];  // dL/de, kept for W when split
        const float* dxf = nullptr;
        {
            UnitScope h(units_, lin_, head_unit_, params, grads, B);
            if (B) h.prefetch(md.block.unit);
            if (W) h.reduce_at_end();
            if (pass == Pass::whole) dxf = head_->backward(v[kMtpLogits], v[kMtpXf], h.params, h.grads());
            else if (B) dxf = head_->backward_input(v[kMtpLogits], h.params);
            else head_->backward_weight(v[kMtpLogits], v[kMtpXf], h.grads());
        }
        {
            UnitScope u(units_, lin_, md.block.unit, params, grads, B);
            if (B) u.prefetch(k > 0 ? head_unit_ : norm_unit_);
            if (W) u.reduce_at_end();
            const float* P = u.params;
            float* G = W ? u.grads() : nullptr;
            // RMSNorm_f, then the decoder layer.
            norm_backward(md.head_norm, pass, si, dres, G, dxf, v[kMtpOut], P, v[kMtpRstdF]);
            layer_backward(md.block, si, si, s.tok, layer_saved(v), v[kMtpX], dres, P, G, pass);
            // eh_proj: its input's gradient [d(norm_e) | d(norm_h)], then its weight's.
            if (B) md.eh->backward_input(si, dres, Nr, dcat, P);
            if (W) md.eh->backward_weight_kept(si, si, Nr, G);
            // RMSNorm_e into dL/de; RMSNorm_h into h^{k-1}: the module before's output, or the
            // main model's final norm output.
            struct Norm {
                RmsNormLayer& norm;
                float* dx;
                const float *x, *rstd;
                int half;
            } norms[2] = {{md.enorm, de, v[kMtpE], v[kMtpRstdE], 0}, {md.hnorm, dprev, hprev, v[kMtpRstdH], 1}};
            for (const Norm& n : norms) {
                if (B) {
                    be_.copy_2d(den, size_t(C), dcat + size_t(n.half) * C, size_t(2) * C, size_t(Nr), size_t(C), false);
                    be_.zero(n.dx, NrC);
                }
                norm_backward(n.norm, pass, si, n.dx, G, den, n.x, P, n.rstd);
            }
        }
        if (W) {  // the embedding rows' gradient into the embedding the modules read
            UnitScope e(units_, lin_, mtp_.embed_unit, nullptr, grads, false);
            e.reduce_at_end();
            be_.embedding_backward(e.grads() + mtp_.wte, tp_.gather(de, lin_.full_a, size_t(N), size_t(C)),
                                   v[kMtpIds], N, C, d.Vl());
        }
    }
    return B ? dh0 : nullptr;
}

// One module as generation drafts with it: the training forward's rows (the embedding of the ids
// the caller set, the two norms, eh_proj, the decoder layer, the shared head), the layer's
// attention over `cache` (its earlier rows), no loss.
void ModelChunk::mtp_generate(int k, const float* params, KvCache* cache, float* h_host, float* last_logits_host) {
    QUINTET_PROFILE("mtp");
    QUINTET_CHECK(tp_.size() == 1 && !lin_.bf16(), "MTP drafting: one rank, fp32");
    Slot& s = store_.slot(0);
    const ModelDims& d = ctx_.d;
    const int N = ctx_.N, C = d.C;
    MtpModule& md = mtp_.modules[size_t(k)];
    const BufferViews& v = s.mtp[size_t(k)];
    float* e = v[kMtpE];
    be_.embedding_forward(e, s.ids, params + mtp_.wte, N, C);
    float* in = md.eh->input(0, nullptr);
    md.enorm.forward(lin_.full_a, v[kMtpRstdE], e, params, N);
    be_.copy_2d(in, size_t(2) * C, lin_.full_a, size_t(C), size_t(N), size_t(C), false);
    md.hnorm.forward(lin_.full_a, v[kMtpRstdH], s.mtp_h0, params, N);
    be_.copy_2d(in + C, size_t(2) * C, lin_.full_a, size_t(C), size_t(N), size_t(C), false);
    md.eh->input_written(0, in, size_t(N));
    float* x = v[kMtpX];
    md.eh->forward_kept(0, N, x, params);
    LayerSaved l = layer_saved(v);
    float* out = v[kMtpOut];
    md.block.norm1.forward(l.xn1, lin_.full_a, l.rstd1, x, params, N);
    md.block.attn->forward(0, s.tok, params, l.xn1, x, l.h, cache);
    md.block.norm2.forward(l.xn2, lin_.full_a, l.rstd2, l.h, params, N);
    md.block.ffn->forward(0, params, l.xn2, l.h, out);
    const Act xf = v[kMtpXf];
    float* logits = v[kMtpLogits];
    md.head_norm.forward(xf, lin_.full_a, v[kMtpRstdF], out, params, N);
    head_->forward(xf, logits, params);
    be_.to_host(h_host, out, size_t(N) * C);
    be_.to_host(last_logits_host, logits + size_t(N - 1) * d.V, size_t(d.V));
}

}  // namespace quintet
