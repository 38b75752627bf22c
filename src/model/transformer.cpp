#include "quintet/model/transformer.hpp"

#include <algorithm>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "unit_scope.hpp"

namespace quintet {

namespace {

BufferShape buffer_shape(const LinearContext& lin, const BlockContext& ctx, const ChunkOptions& opt) {
    BufferShape s;
    s.B = ctx.B, s.T = ctx.T, s.N = ctx.N, s.Nr = ctx.Nr;
    s.bf16 = lin.bf16(), s.sp = lin.tp.sp(), s.recompute = opt.recompute;
    s.cp = opt.cp ? opt.cp->size() : 1, s.mla_latent = opt.cp && opt.cp->mla_kv == MlaKv::latent;
    s.ep = opt.ep ? opt.ep->size() : 1;
    s.max_positions = ctx.max_positions;
    s.split_bw = opt.split_bw;
    return s;
}

int local_rows(int T, const ChunkOptions& opt) {
    const int cp = opt.cp ? opt.cp->size() : 1;
    QUINTET_CHECK(T % cp == 0, "seq_len not divisible by cp");
    return T / cp;
}

}  // namespace

ModelChunk::ModelChunk(Backend& be, const ModelConfig& m, const RopeConfig& rope, const ParamTable& table,
                       const ChunkPlan& plan, TensorParallel& tp, int B, int T, ChunkOptions opt)
    : be_(be), tp_(tp), lin_(be, tp, B * local_rows(T, opt), m.d_model, opt.precision, opt.split_bw),
      ctx_(lin_, model_dims(m, tp.size(), tp.rank()), B, local_rows(T, opt), rope,
           opt.rope_seq_len > 0 ? opt.rope_seq_len : T, opt.max_positions > 0 ? opt.max_positions : T, opt.cp,
           opt.recompute),
      plan_(plan),
      store_(be, chunk_buffers(m, ctx_.d, plan, buffer_shape(lin_, ctx_, opt), opt.document_mask),
             TokenLayout{B, T, ctx_.T, opt.cp, opt.document_mask, opt.document_positions, opt.eos_id}, plan),
      documents_(opt.document_mask), units_(opt.units), seq_(T) {
    ctx_.ep = opt.ep;
    ctx_.attn_mult = m.attn_mult;
    lin_.bind(store_.shared(), store_.buffers().operand);
    const ChunkBuffers& cb = store_.buffers();
    if (opt.cp) opt.cp->reserve(cb.ring_kv, cb.ring_out, cb.ring_lse);
    if (opt.ep && cb.exchange > 0) opt.ep->reserve(cb.exchange);
    QUINTET_CHECK(!units_ || !table.units.empty(), "ZeRO units without a table laid out by unit");
    auto unit_of = [&](const std::string& tensor) { return units_ ? table.find(tensor)->unit : -1; };
    const ModelDims& d = ctx_.d;
    const float eps = float(m.norm_eps);
    if (plan_.first) {
        wte_ = table.offset_of("model.embed_tokens.weight");
        embed_unit_ = unit_of("model.embed_tokens.weight");
    }
    for (int l = plan_.layer_begin; l < plan_.layer_end; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        layers_.push_back({RmsNormLayer(lin_, table, p + "input_layernorm.weight", d.C, eps, "norm1"),
                           RmsNormLayer(lin_, table, p + "post_attention_layernorm.weight", d.C, eps, "norm2"),
                           make_attention_block(ctx_, m, table, l), make_feed_forward_block(ctx_, m, table, l),
                           unit_of(p + "input_layernorm.weight")});
    }
    if (plan_.last) {
        final_norm_.emplace(lin_, table, "model.norm.weight", d.C, eps, "final");
        const char* head = table.find("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight";
        head_.emplace(lin_, table.offset_of(head), d.Vl(), m.logit_mult);
        // Tied to an embedding this rank holds (one stage, or zbv's stage 0) rather than to
        // another stage's copy (GradSync::tied, completed after the schedule).
        const ParamSpec* e = table.find("model.embed_tokens.weight");
        head_is_local_embedding_ = d.tied && e && e->sync != GradSync::tied;
        norm_unit_ = unit_of("model.norm.weight");
        head_unit_ = unit_of(head);
        QUINTET_CHECK(!(units_ && head_is_local_embedding_ && !plan_.first),
                      "ZeRO >= 2 with a head tied to an embedding in another chunk of this rank");
        if (m.mtp_depth > 0) mtp_build(m, table, opt.mtp_weight);
    }
    losses_.resize(size_t(ctx_.N));
}

ModelChunk::~ModelChunk() = default;

int ModelChunk::position_of_row(int n) const { return store_.global_position(ctx_.cp ? ctx_.cp->rank() : 0, n % ctx_.T); }

int ModelChunk::add_slot() {
    const SlotStore::Added a = store_.add_slot();
    for (size_t i = 0; i < a.saved.size(); ++i) {
        layers_[i].attn->add_slot(a.saved[i]);
        layers_[i].ffn->add_slot(a.saved[i]);
    }
    // What W needs of B: the slot's own under a split schedule, else the shared scratch (W
    // follows B at once); the blocks' deferred slot n is slot n.
    Slot& s = store_.slot(a.index);
    for (size_t i = 0; i < layers_.size(); ++i) {
        const BufferViews& w = lin_.split_bw ? s.deferred[i] : store_.shared();
        layers_[i].attn->add_w_slot(w);
        layers_[i].ffn->add_w_slot(w);
        if (lin_.split_bw) {
            layers_[i].norm1.add_w_slot(w);
            layers_[i].norm2.add_w_slot(w);
        }
    }
    if (final_norm_ && lin_.split_bw) final_norm_->add_w_slot(s.dxf);
    if (!mtp_.modules.empty()) mtp_add_slot(s);
    return a.index;
}

void ModelChunk::forward_layer(size_t i, int si, const float* params, const float* x, float* y, KvCache* cache) {
    Layer& layer = layers_[i];
    LayerSaved& l = store_.layer(si, int(i));
    const int bs = store_.block_slot(si), Nr = ctx_.Nr;
    const TokenInfo& tok = store_.slot(si).tok;
    // h = x + attention(RMSNorm(x)); y = h + feed_forward(RMSNorm(h)). In bf16 mode a norm writes
    // fp32 into scratch that is free during the forward and only the bf16 copy is kept.
    layer.norm1.forward(l.xn1, lin_.full_a, l.rstd1, x, params, Nr);
    layer.attn->forward(bs, tok, params, l.xn1, x, l.h, cache);
    layer.norm2.forward(l.xn2, lin_.full_a, l.rstd2, l.h, params, Nr);
    layer.ffn->forward(bs, params, l.xn2, l.h, y);
    if (probe_ && !ctx_.recomputing && !cache) {
        layer.attn->probe_logits(bs, tok, *probe_);
        probe(ProbeKind::attn_out, l.h, x, size_t(Nr) * ctx_.d.C);
        probe(ProbeKind::ffn_out, y, l.h, size_t(Nr) * ctx_.d.C);
    }
}

void ModelChunk::probe(ProbeKind k, const float* x, const float* minus, size_t n) {
    std::vector<float> a(n), b(minus ? n : 0);
    be_.to_host(a.data(), x, n);
    if (minus) be_.to_host(b.data(), minus, n);
    double ss = 0;
    for (size_t i = 0; i < n; ++i) {
        const double v = minus ? double(a[i]) - b[i] : double(a[i]);
        ss += v * v;
    }
    probe_->add(k, ss, double(n));
}

void ModelChunk::run_layers(int si, const float* params, std::vector<std::unique_ptr<KvCache>>* caches) {
    const int Nr = ctx_.Nr, C = ctx_.d.C, N = ctx_.N;
    Slot& s = store_.slot(si);
    if (plan_.first) {
        QUINTET_PROFILE("embedding");
        UnitScope u(units_, lin_, embed_unit_, params, nullptr, true);
        u.prefetch(layers_.empty() ? -1 : layers_[0].unit);
        if (tp_.size() == 1) {
            be_.embedding_forward(s.res[0], s.ids, u.params + wte_, N, C);
        } else {  // vocab-parallel: each rank looks up its rows, the sum over tp completes x
            be_.embedding_forward(lin_.full_b, s.ids, u.params + wte_, N, C);
            be_.copy(s.res[0], tp_.reduce(lin_.full_b, lin_.dshard, N, C), size_t(Nr) * C);
        }
        if (probe_ && !caches) probe(ProbeKind::embedding, s.res[0], nullptr, size_t(Nr) * C);
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
        UnitScope u(units_, lin_, layers_[i].unit, params, nullptr, true);
        u.prefetch(i + 1 < layers_.size() ? layers_[i + 1].unit : plan_.last ? norm_unit_ : -1);
        forward_layer(i, si, u.params, s.res[i], s.res[i + 1], caches ? (*caches)[i].get() : nullptr);
    }
}

double ModelChunk::loss(Slot& s, const float* params, float grad_scale, bool need_grad) {
    {
        UnitScope n(units_, lin_, norm_unit_, params, nullptr, true);
        final_norm_->forward(s.xf, lin_.full_a, s.rstd_f, s.res.back(), n.params, ctx_.Nr);
        // The first MTP module's input: the final norm's output in fp32 (in bf16 the staging).
        if (!mtp_.modules.empty() && need_grad)
            be_.copy(s.mtp_h0, lin_.bf16() ? lin_.full_a : s.xf.f, size_t(ctx_.Nr) * ctx_.d.C);
        UnitScope h(units_, lin_, head_unit_, params, nullptr, true);
        head_->forward(s.xf, s.logits, h.params);
    }
    if (probe_) {
        probe(ProbeKind::residual, s.res.back(), nullptr, size_t(ctx_.Nr) * ctx_.d.C);
        probe(ProbeKind::output_logits, s.logits, nullptr, size_t(ctx_.N) * ctx_.d.Vl());
    }
    head_->loss(s.logits, losses_.data(), store_.targets(), grad_scale, need_grad, xent_);
    double sum = 0.0;
    for (float x : losses_) sum += x;
    return sum;
}

double ModelChunk::forward(int si, const float* params, const int32_t* ids, const int32_t* targets, float grad_scale,
                           bool need_grad) {
    Slot& s = store_.slot(si);
    QUINTET_CHECK(units_ || !lin_.bf16() || params == lin_.master(),
                  "bf16 chunk: params are not the arena set_bf16_weights named");
    store_.set_tokens(s, plan_.first ? ids : nullptr, plan_.last ? targets : nullptr, ctx_.d.v0, ctx_.d.v1);
    if (store_.positions_from_ids()) {
        QUINTET_CHECK(ids, "document masks: every chunk needs the microbatch's ids");
        store_.set_positions(s, ids);
    }
    run_layers(si, params, nullptr);
    if (!plan_.last) return 0.0;
    const double ce = loss(s, params, grad_scale, need_grad);
    if (!mtp_.modules.empty()) mtp_forward(si, params, targets, grad_scale, need_grad);
    return ce;
}

double ModelChunk::aux_loss(int si) const {
    double a = 0.0;
    for (const auto& l : layers_) a += l.ffn->aux_loss(store_.block_slot(si));
    for (const auto& md : mtp_.modules) a += md.block.ffn->aux_loss(si);
    return a;
}

int ModelChunk::moe_experts() const {
    int e = 0;
    for (const auto& l : layers_) e = std::max(e, l.ffn->experts());
    for (const auto& md : mtp_.modules) e = std::max(e, md.block.ffn->experts());
    return e;
}

// The MTP modules' MoE layers count as layers n_layers + k.
void ModelChunk::take_moe_counts(MoeCounts& counts) {
    for (size_t i = 0; i < layers_.size(); ++i)
        if (layers_[i].ffn->experts() > 0) layers_[i].ffn->take_counts(counts, plan_.layer_begin + int(i));
    for (size_t k = 0; k < mtp_.modules.size(); ++k)
        if (mtp_.modules[k].block.ffn->experts() > 0) mtp_.modules[k].block.ffn->take_counts(counts, ctx_.d.L + int(k));
}

void ModelChunk::update_balance_bias(float* params, const MoeCounts& step) {
    auto update = [&](Layer& l, int layer) {
        if (l.ffn->experts() > 0) l.ffn->update_bias(units_ ? units_->buffers(l.unit) : params, step, layer);
    };
    for (size_t i = 0; i < layers_.size(); ++i) update(layers_[i], plan_.layer_begin + int(i));
    for (size_t k = 0; k < mtp_.modules.size(); ++k) update(mtp_.modules[k].block, ctx_.d.L + int(k));
}

void ModelChunk::backward(int si, const float* params, float* grads, GradReadyHook* hook) {
    lin_.hook = hook;
    backward_pass(si, params, grads, Pass::whole);
    lin_.hook = nullptr;
}

void ModelChunk::backward_input(int si, const float* params) {
    QUINTET_CHECK(lin_.split_bw, "backward_input on a chunk built without split_bw");
    backward_pass(si, params, nullptr, Pass::input);
}

void ModelChunk::backward_weight(int si, const float* params, float* grads, GradReadyHook* hook) {
    QUINTET_CHECK(lin_.split_bw, "backward_weight on a chunk built without split_bw");
    lin_.hook = hook;
    backward_pass(si, params, grads, Pass::weight);
    lin_.hook = nullptr;
}

// The one reverse walk. whole: each part's B then its W at once; input (B): every input
// gradient, what W needs kept in the slot; weight (W): every weight gradient from what B kept
// (parameters read only under full recomputation, which runs each layer's forward again).
void ModelChunk::backward_pass(int si, const float* params, float* grads, Pass pass) {
    const int Nr = ctx_.Nr, C = ctx_.d.C;
    const bool full_recompute = store_.buffers().full_recompute;
    Slot& s = store_.slot(si);
    QUINTET_CHECK(pass == Pass::weight || units_ || !lin_.bf16() || params == lin_.master(),
                  "bf16 chunk: params are not the arena set_bf16_weights named");
    float* dres = s.dres;  // dL/d(residual stream), this rank's rows
    if (plan_.last) head_backward(si, params, grads, pass);
    else if (pass != Pass::weight) be_.copy(dres, s.dout, size_t(Nr) * C);
    for (int i = int(layers_.size()) - 1; i >= 0; --i) {
        Layer& layer = layers_[size_t(i)];
        LayerSaved& l = store_.layer(si, i);
        const int bs = store_.block_slot(si);
        UnitScope u(units_, lin_, layer.unit, params, grads, pass != Pass::weight || full_recompute);
        if (pass != Pass::weight || full_recompute) u.prefetch(i > 0 ? layers_[size_t(i - 1)].unit : -1);
        float* G = pass == Pass::whole ? u.grads() : nullptr;
        // Full recompute: the layer's forward again, from its kept input (the same bits); under
        // W the values B used are gone again, so once more (under ZeRO-3 with its parameters
        // gathered again), and W needs the parameters no further.
        if (full_recompute) {
            trace::Span recompute(trace::Track::compute, "recompute");
            ctx_.recomputing = true;
            forward_layer(size_t(i), si, u.params, s.res[size_t(i)], store_.recompute_out(), nullptr);
            ctx_.recomputing = false;
        }
        if (pass == Pass::weight) {
            u.release();
            G = u.grads();
        }
        if (pass != Pass::input) u.reduce_at_end();
        layer_backward(layer, bs, si, s.tok, l, s.res[size_t(i)], dres, u.params, G, pass);
    }
    if (plan_.first && pass != Pass::input) embedding_weight(s, grads);
}

void ModelChunk::layer_backward(Layer& layer, int bs, int si, const TokenInfo& tok, const LayerSaved& l,
                                const float* x, float* dres, const float* P, float* G, Pass pass) {
    const int Nr = ctx_.Nr;
    // Feed-forward branch; dres flows straight through the residual.
    if (pass == Pass::whole) {
        const float* dhn = layer.ffn->backward_input(bs, si, P, l.xn2, dres);
        layer.ffn->backward_weight(bs, si, G, l.xn2);
        layer.norm2.backward(dres, G, dhn, l.h, P, l.rstd2, Nr);
    } else if (pass == Pass::input) {
        layer.norm2.backward_input(si, dres, layer.ffn->backward_input(bs, si, P, l.xn2, dres), l.h, P, l.rstd2, Nr);
    } else {
        layer.ffn->backward_weight(bs, si, G, l.xn2);
        layer.norm2.backward_weight(si, G, l.h, l.rstd2, Nr);
    }
    // Attention branch.
    if (pass == Pass::whole) {
        const float* dxn = layer.attn->backward_input(bs, si, tok, P, l.xn1, dres);
        layer.attn->backward_weight(bs, si, tok, G, l.xn1, false);
        layer.norm1.backward(dres, G, dxn, x, P, l.rstd1, Nr);
    } else if (pass == Pass::input) {
        layer.norm1.backward_input(si, dres, layer.attn->backward_input(bs, si, tok, P, l.xn1, dres), x, P, l.rstd1, Nr);
    } else {
        layer.attn->backward_weight(bs, si, tok, G, l.xn1, true);
        layer.norm1.backward_weight(si, G, x, l.rstd1, Nr);
    }
}

void ModelChunk::norm_backward(RmsNormLayer& norm, Pass pass, int si, float* dx, float* G, const float* dy,
                               const float* x, const float* P, const float* rstd) {
    const int Nr = ctx_.Nr;
    if (pass == Pass::whole) norm.backward(dx, G, dy, x, P, rstd, Nr);
    else if (pass == Pass::input) norm.backward_input(si, dx, dy, x, P, rstd, Nr);
    else norm.backward_weight(si, G, x, rstd, Nr);
}

// The last chunk's start of the backward, from grad_scale * dL/dlogits (the loss left it in
// s.logits): the head and the final norm, as the pass says. A head tied to this rank's own
// embedding completes only with the embedding's backward (under ZeRO >= 2 it is computed there).
void ModelChunk::head_backward(int si, const float* params, float* grads, Pass pass) {
    const int Nr = ctx_.Nr;
    Slot& s = store_.slot(si);
    // The MTP modules first, under their own scopes: their gradient into the final norm's
    // output joins the head's.
    float* dh0 = mtp_.modules.empty() ? nullptr : mtp_backward(si, params, grads, pass);
    const bool head_here = !(units_ && head_is_local_embedding_);
    UnitScope n(units_, lin_, norm_unit_, params, grads, pass != Pass::weight);
    UnitScope h(units_, lin_, head_unit_, params, grads, pass != Pass::weight);
    if (pass != Pass::input && !head_is_local_embedding_) h.reduce_at_end();
    if (pass != Pass::input) n.reduce_at_end();
    float* Gh = pass != Pass::input && head_here ? h.grads() : nullptr;
    const float* dxf = nullptr;
    if (pass == Pass::weight) {
        if (Gh) head_->backward_weight(s.logits, s.xf, Gh);
    } else {
        dxf = head_->backward(s.logits, s.xf, h.params, Gh);
        if (dh0) {
            be_.add_inplace(dh0, dxf, size_t(Nr) * ctx_.d.C);
            dxf = dh0;
        }
    }
    if (pass != Pass::input && !head_is_local_embedding_) lin_.done(Gh + head_->offset(), head_->numel());
    if (pass != Pass::weight) be_.zero(s.dres, size_t(Nr) * ctx_.d.C);
    // (B opens no gradient window: n.grads() only where the weight's gradient is made.)
    norm_backward(*final_norm_, pass, si, s.dres, pass != Pass::input ? n.grads() : nullptr, dxf, s.res.back(),
                  n.params, s.rstd_f);
}

void ModelChunk::embedding_weight(Slot& s, float* grads) {
    QUINTET_PROFILE("embedding");
    const int N = ctx_.N, C = ctx_.d.C;
    UnitScope u(units_, lin_, embed_unit_, nullptr, grads, false);
    u.reduce_at_end();
    float* G = u.grads();
    be_.embedding_backward(G + wte_, tp_.gather(s.dres, lin_.full_a, N, C), s.ids, N, C, ctx_.d.Vl());
    if (units_ && head_is_local_embedding_ && plan_.last) head_->backward_weight(s.logits, s.xf, G);  // the tied head's share
    lin_.done(G + wte_, size_t(ctx_.d.Vl()) * C);
}

double ModelChunk::forward_backward(const float* params, float* grads, const int32_t* ids, const int32_t* targets,
                                    float grad_scale) {
    QUINTET_CHECK(plan_.first && plan_.last, "forward_backward needs the whole model in one chunk");
    if (store_.slots() == 0) add_slot();
    const double loss = forward(0, params, ids, targets, grad_scale, true);
    backward(0, params, grads);
    return loss;
}

double ModelChunk::forward_loss(const float* params, const int32_t* ids, const int32_t* targets) {
    QUINTET_CHECK(plan_.first && plan_.last, "forward_loss needs the whole model in one chunk");
    if (store_.slots() == 0) add_slot();
    return forward(0, params, ids, targets, 1.0f, false);
}

}  // namespace quintet
