#include "quintet/model/transformer.hpp"

#include <algorithm>
#include <cmath>

#include "quintet/core/profile.hpp"
#include "quintet/core/error.hpp"

namespace quintet {

size_t ChunkBuffers::largest_layer_bytes() const {
    size_t b = 0;
    for (size_t i = 0; i < layer.size(); ++i) b = std::max(b, layer_bytes(i));
    return b;
}

size_t ChunkBuffers::slot_bytes() const {
    size_t b = layout_bytes(own, bf16);
    if (!full_recompute)
        for (size_t i = 0; i < layer.size(); ++i) b += layer_bytes(i);
    for (size_t i = 0; i < layer.size(); ++i) b += deferred_bytes(i);
    return b;
}

size_t ChunkBuffers::workspace_bytes() const {
    if (!full_recompute || layer.empty()) return 0;
    return layout_bytes(workspace_own, bf16) + largest_layer_bytes();
}

ChunkBuffers chunk_buffers(const ModelConfig& m, const ModelDims& d, const ChunkPlan& plan, const BufferShape& s,
                           bool documents) {
    ChunkBuffers cb;
    cb.bf16 = s.bf16;
    cb.full_recompute = s.recompute == Recompute::full;
    cb.split_bw = s.split_bw;
    const size_t N = size_t(s.N), Nr = size_t(s.Nr), C = size_t(d.C);
    BufferDecl own;
    const int nl = plan.layer_end - plan.layer_begin;
    for (int i = 0; i <= nl; ++i) own.save("res." + std::to_string(i), Nr * C);  // each layer's input, the output
    if (plan.last) {
        own.save("final.rstd", Nr);
        own.save("final.x", Nr * C, Elem::act);  // the final norm's output, the head's input
        own.save("logits", N * size_t(d.Vl()));  // then grad_scale * dloss/dlogits
    } else {
        own.save("dout", Nr * C);  // the next stage's gradient
    }
    own.save("dres", Nr * C);
    if (plan.last && s.split_bw) own.save("w.final.dy", Nr * C);  // the final norm's incoming gradient, B -> W
    if (plan.first) own.save("ids", N, Elem::i32);
    own.save("pos_all", size_t(s.cp) * N, Elem::i32);
    own.save("rope_pos", N, Elem::i32);
    if (documents) own.save("doc_all", size_t(s.cp) * N, Elem::i32);
    cb.own = own.saved;
    BufferDecl shared;
    BlockContext::declare(d, s, shared);
    shared.scratch("targets", N, Elem::i32);
    if (plan.last && s.bf16) shared.operands(N * size_t(d.Vl()));
    for (int l = plan.layer_begin; l < plan.layer_end; ++l) {
        BufferDecl layer, attn, ffn, deferred;
        attention_declare_buffers(m, d, s, l, attn);
        feed_forward_declare_buffers(m, d, s, l, ffn);
        // The attention's buffers, the norms', the feed-forward's: the norms' (none B's only)
        // keep a run of B-only buffers (buffers.hpp, place_deferred) within one block, whose
        // backward has read all of it before anything is written there.
        for (const BufferDecl* b : {&attn, &ffn}) {
            if (b == &ffn) {
                layer.save("norm.rstd1", Nr);
                layer.save("norm.xn1", Nr * C, Elem::act);
                layer.save("norm.h", Nr * C);
                layer.save("norm.rstd2", Nr);
                layer.save("norm.xn2", Nr * C, Elem::act);
            }
            layer.saved.insert(layer.saved.end(), b->saved.begin(), b->saved.end());
            if (s.split_bw) deferred.deferred.insert(deferred.deferred.end(), b->deferred.begin(), b->deferred.end());
            else merge_shared(shared.shared, b->deferred, s.bf16);
            merge_shared(shared.shared, b->shared, s.bf16);
            shared.operands(b->operand);
            cb.ring_kv = std::max(cb.ring_kv, b->ring_kv);
            cb.ring_out = std::max(cb.ring_out, b->ring_out);
            cb.ring_lse = std::max(cb.ring_lse, b->ring_lse);
            cb.exchange = std::max(cb.exchange, b->exchange);
        }
        if (s.split_bw) {
            // The norms' incoming gradients (fused, a norm's backward is one call), written once
            // the block before them has finished its B: they may live in what it no longer reads.
            auto b_only = [](const BufferDecl& b) {
                std::vector<std::string> names;
                for (const auto& sv : b.saved)
                    if (sv.b_only) names.push_back(sv.name);
                return names;
            };
            deferred.defer("w.norm.dy1", Nr * C, Elem::f32, b_only(attn));
            deferred.defer("w.norm.dy2", Nr * C, Elem::f32, b_only(ffn));
        }
        cb.layer.push_back(layer.saved);
        std::vector<PlacedBuffer> placed;
        std::vector<BufferSpec> rest;
        if (s.split_bw && !cb.full_recompute) place_deferred(layer.saved, deferred.deferred, s.bf16, placed, rest);
        else rest = deferred.deferred;
        cb.deferred.push_back(std::move(rest));
        cb.placed.push_back(std::move(placed));
    }
    if (cb.full_recompute && nl > 0) cb.workspace_own.push_back({"recompute_out", Nr * C, Elem::f32, false, {}});
    if (s.bf16) shared.scratch("ctx.lowp", shared.operand, Elem::bf16);
    cb.shared = shared.shared;
    return cb;
}

ModelChunk::ModelChunk(Backend& be, const ModelConfig& m, const RopeConfig& rope,
                       const ParamTable& table, const ChunkPlan& plan, TensorParallel& tp, int B,
                       int T, ChunkOptions opt)
    : be_(be), tp_(tp), cp_(opt.cp), T_global_(T), cp_size_(opt.cp ? opt.cp->size() : 1),
      cp_rank_(opt.cp ? opt.cp->rank() : 0), docs_(opt.document_mask),
      doc_positions_(opt.document_positions), eos_id_(opt.eos_id),
      ctx_(be, tp, model_dims(m, tp.size(), tp.rank()), B, T / (opt.cp ? opt.cp->size() : 1),
           opt.precision, rope, opt.rope_seq_len > 0 ? opt.rope_seq_len : T,
           opt.max_positions > 0 ? opt.max_positions : T, opt.cp, opt.recompute, opt.split_bw),
      plan_(plan), full_recompute_(opt.recompute == Recompute::full), split_bw_(opt.split_bw), units_(opt.units) {
    QUINTET_CHECK(T % cp_size_ == 0, "seq_len not divisible by cp");
    ctx_.ep = opt.ep;
    QUINTET_CHECK(!(docs_ || doc_positions_) || eos_id_ >= 0, "document masks need an eos id");
    eps_ = float(m.norm_eps);
    const ModelDims& d = ctx_.d;
    // The activation memory the blocks declare, laid out: the shared arena now, slots on demand.
    BufferShape shape;
    shape.B = B, shape.T = ctx_.T, shape.N = ctx_.N, shape.Nr = ctx_.Nr;
    shape.bf16 = ctx_.bf16(), shape.sp = tp.sp(), shape.recompute = opt.recompute;
    shape.cp = cp_size_, shape.mla_latent = opt.cp && opt.cp->mla_kv == MlaKv::latent;
    shape.ep = opt.ep ? opt.ep->size() : 1;
    shape.max_positions = ctx_.max_positions;
    shape.split_bw = opt.split_bw;
    buffers_ = chunk_buffers(m, d, plan_, shape, docs_);
    const BufferViews shared(buffers_.shared, arena(buffers_.shared_bytes()), ctx_.bf16());
    size_t operand = 0;
    for (const auto& b : buffers_.shared)
        if (b.name == "ctx.lowp") operand = b.n;
    ctx_.bind(shared, operand);
    if (cp_) cp_->reserve(buffers_.ring_kv, buffers_.ring_out, buffers_.ring_lse);
    if (opt.ep && buffers_.exchange > 0) opt.ep->reserve(buffers_.exchange);
    if (plan_.first) wte_ = table.offset_of("model.embed_tokens.weight");
    auto unit_of = [&](const std::string& tensor) { return units_ ? table.find(tensor)->unit : -1; };
    if (plan_.first) embed_unit_ = unit_of("model.embed_tokens.weight");
    QUINTET_CHECK(!units_ || !table.units.empty(), "ZeRO units without a table laid out by unit");
    for (int l = plan_.layer_begin; l < plan_.layer_end; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        layer_unit_.push_back(unit_of(p + "input_layernorm.weight"));
        Layer layer;
        layer.ln1 = table.offset_of(p + "input_layernorm.weight");
        layer.ln2 = table.offset_of(p + "post_attention_layernorm.weight");
        layer.attn = make_attention_block(ctx_, m, table, l);
        layer.ffn = make_feed_forward_block(ctx_, m, table, l);
        layers_.push_back(std::move(layer));
    }
    if (plan_.last) {
        norm_ = table.offset_of("model.norm.weight");
        head_ = table.find("lm_head.weight") ? table.offset_of("lm_head.weight")
                                             : table.offset_of("model.embed_tokens.weight");
        // Tied to an embedding this rank holds (one stage, or zbv's stage 0) rather than to
        // another stage's copy (GradSync::tied, completed after the schedule).
        const ParamSpec* e = table.find("model.embed_tokens.weight");
        head_is_local_embedding_ = d.tied && e && e->sync != GradSync::tied;
        norm_unit_ = unit_of("model.norm.weight");
        head_unit_ = unit_of(table.find("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight");
        QUINTET_CHECK(!(units_ && head_is_local_embedding_ && !plan_.first),
                      "ZeRO >= 2 with a head tied to an embedding in another chunk of this rank");
    }
    tgt_ = shared.i32("targets");
    host_ids_.resize(size_t(ctx_.N));
    host_tgt_.resize(size_t(ctx_.N));
    losses_.resize(size_t(ctx_.N));
}

ModelChunk::~ModelChunk() {
    for (float* a : arenas_) be_.release(a);
}

void* ModelChunk::arena(size_t bytes) {
    float* p = be_.alloc((bytes + sizeof(float) - 1) / sizeof(float));  // zeroed, 64-byte aligned
    arenas_.push_back(p);
    return p;
}

void ModelChunk::set_bf16_weights(const float* master, const bf16_bits* shadow) {
    ctx_.set_bf16_weights(master, shadow);
}

ModelChunk::LayerSaved ModelChunk::layer_saved(const BufferViews& v) {
    LayerSaved l;
    l.rstd1 = v.f32("norm.rstd1");
    l.xn1 = v.act("norm.xn1");
    l.h = v.f32("norm.h");
    l.rstd2 = v.f32("norm.rstd2");
    l.xn2 = v.act("norm.xn2");
    return l;
}

int ModelChunk::add_slot() {
    const size_t N = size_t(ctx_.N);
    const int nl = int(layers_.size());
    const bool bf16 = ctx_.bf16();
    if (full_recompute_ && ws_layers_.empty() && nl > 0) {
        // One layer's activations, shared by every layer (each is recomputed before its
        // backward): every layer's views start at the same place of the workspace.
        char* ws = static_cast<char*>(arena(buffers_.workspace_bytes()));
        const BufferViews own(buffers_.workspace_own, ws, bf16);
        recompute_out_ = own.f32("recompute_out");
        char* base = ws + layout_bytes(buffers_.workspace_own, bf16);
        for (int i = 0; i < nl; ++i) {
            const BufferViews v(buffers_.layer[size_t(i)], base, bf16);
            ws_layers_.push_back(layer_saved(v));
            layers_[size_t(i)].attn->add_slot(v);
            layers_[size_t(i)].ffn->add_slot(v);
        }
    }
    char* at = static_cast<char*>(arena(buffers_.slot_bytes()));
    const BufferViews own(buffers_.own, at, bf16);
    at += layout_bytes(buffers_.own, bf16);
    Slot s;
    for (int i = 0; i <= nl; ++i) s.res.push_back(own.f32("res." + std::to_string(i)));
    std::vector<BufferViews> saved;
    if (!full_recompute_)
        for (int i = 0; i < nl; ++i) {
            const BufferViews v(buffers_.layer[size_t(i)], at, bf16);
            at += buffers_.layer_bytes(size_t(i));
            s.layers.push_back(layer_saved(v));
            layers_[size_t(i)].attn->add_slot(v);
            layers_[size_t(i)].ffn->add_slot(v);
            saved.push_back(v);
        }
    // What W needs of B: this slot's own under a split schedule (some of it in the slot's saved
    // buffers B has read), else the shared scratch (W follows B at once); the blocks' deferred
    // slot n is this slot.
    for (int i = 0; i < nl; ++i) {
        if (split_bw_) {
            BufferViews w(buffers_.deferred[size_t(i)], at, bf16);
            at += buffers_.deferred_bytes(size_t(i));
            for (const PlacedBuffer& p : buffers_.placed[size_t(i)])
                w.add(p.spec, static_cast<char*>(saved[size_t(i)].address(p.target)) + p.offset);
            s.deferred.push_back({w.f32("w.norm.dy1"), w.f32("w.norm.dy2")});
            layers_[size_t(i)].attn->add_deferred(w);
            layers_[size_t(i)].ffn->add_deferred(w);
        } else {
            layers_[size_t(i)].attn->add_deferred(ctx_.shared());
            layers_[size_t(i)].ffn->add_deferred(ctx_.shared());
        }
    }
    if (plan_.last) {
        if (split_bw_) s.dxf = own.f32("w.final.dy");
        s.rstd_f = own.f32("final.rstd");
        s.xf = own.act("final.x");
        s.logits = own.f32("logits");
    } else {
        s.dout = own.f32("dout");
    }
    s.dres = own.f32("dres");
    if (plan_.first) s.ids = own.i32("ids");
    // Positions: each row's index in its sample (for every cp rank's rows), the same for RoPE;
    // documents (when masked) are set per microbatch.
    const size_t cp = size_t(cp_size_);
    s.pos_all = own.i32("pos_all");
    s.rope_pos = own.i32("rope_pos");
    if (docs_) s.doc_all = own.i32("doc_all");
    std::vector<int32_t> pos(cp * N);
    for (size_t j = 0; j < cp; ++j)
        for (size_t n = 0; n < N; ++n)
            pos[j * N + n] = global_position(int(j), int(n % size_t(ctx_.T)));
    be_.from_host_i32(s.pos_all, pos.data(), cp * N);
    be_.from_host_i32(s.rope_pos, pos.data() + size_t(cp_rank_) * N, N);
    s.tok.pos = s.pos_all + size_t(cp_rank_) * N;
    s.tok.rope_pos = s.rope_pos;
    s.tok.pos_all = s.pos_all;
    s.tok.doc_all = s.doc_all;
    s.tok.doc = s.doc_all ? s.doc_all + size_t(cp_rank_) * N : nullptr;
    slots_.push_back(std::move(s));
    return int(slots_.size()) - 1;
}

int ModelChunk::global_position(int rank, int t) const { return cp_ ? cp_->position(rank, t) : t; }

void ModelChunk::set_tokens(Slot& s, const int32_t* ids, const int32_t* targets) {
    // This cp rank's rows of each sample; ids and targets relative to this rank's vocabulary
    // rows (-1 where another tp rank owns them).
    const ModelDims& d = ctx_.d;
    const int N = ctx_.N, Tl = ctx_.T;
    auto local = [&](int32_t x) { return x >= d.v0 && x < d.v1 ? x - d.v0 : -1; };
    auto at = [&](const int32_t* x, int n) {
        return x[size_t(n / Tl) * T_global_ + global_position(cp_rank_, n % Tl)];
    };
    if (ids) {
        for (int n = 0; n < N; ++n) host_ids_[size_t(n)] = local(at(ids, n));
        be_.from_host_i32(s.ids, host_ids_.data(), size_t(N));
    }
    if (targets) {
        for (int n = 0; n < N; ++n) host_tgt_[size_t(n)] = local(at(targets, n));
        be_.from_host_i32(tgt_, host_tgt_.data(), size_t(N));
    }
}

void ModelChunk::set_positions(Slot& s, const int32_t* ids) {
    // Document d of a sample = the tokens after the d-th eos (an eos ends, and belongs to, its
    // document); RoPE positions restart at each document under document_positions.
    const int B = ctx_.B, Tl = ctx_.T, N = ctx_.N, T = T_global_;
    const size_t cp = size_t(cp_size_);
    host_doc_.resize(cp * N);
    host_rope_.resize(size_t(N));
    host_pos_.resize(size_t(T) * 2);
    int32_t* doc = host_pos_.data();        // [T] document of each position of one sample
    int32_t* start = doc + T;               // [T] first position of that document
    for (int b = 0; b < B; ++b) {
        const int32_t* x = ids + size_t(b) * T;
        int d = 0, st = 0;
        for (int p = 0; p < T; ++p) {
            doc[p] = d;
            start[p] = st;
            if (x[p] == eos_id_) {
                ++d;
                st = p + 1;
            }
        }
        for (size_t j = 0; j < cp; ++j)
            for (int t = 0; t < Tl; ++t) host_doc_[j * N + size_t(b) * Tl + t] = doc[global_position(int(j), t)];
        for (int t = 0; t < Tl; ++t) {
            const int p = global_position(cp_rank_, t);
            host_rope_[size_t(b) * Tl + t] = doc_positions_ ? p - start[p] : p;
        }
    }
    if (docs_) be_.from_host_i32(s.doc_all, host_doc_.data(), cp * N);
    be_.from_host_i32(s.rope_pos, host_rope_.data(), size_t(N));
}

void ModelChunk::forward_layer(size_t i, int bslot, LayerSaved& l, const TokenInfo& tok,
                               const float* params, const float* x, float* y, KvCache* cache) {
    const int Nr = ctx_.Nr, C = ctx_.d.C;
    Layer& layer = layers_[i];
    // h = x + attention(RMSNorm(x)). In bf16 mode the norm writes fp32 into scratch that is
    // free during the forward and only the bf16 copy is kept.
    float* xn1 = ctx_.produce(l.xn1, ctx_.full_a);
    {
        QUINTET_PROFILE("rmsnorm");
        be_.rmsnorm_forward(xn1, l.rstd1, x, params + layer.ln1, Nr, C, eps_);
        ctx_.keep(l.xn1, xn1, size_t(Nr) * C);
    }
    layer.attn->forward(bslot, tok, params, l.xn1, x, l.h, cache);
    // y = h + feed_forward(RMSNorm(h))
    float* xn2 = ctx_.produce(l.xn2, ctx_.full_a);
    {
        QUINTET_PROFILE("rmsnorm");
        be_.rmsnorm_forward(xn2, l.rstd2, l.h, params + layer.ln2, Nr, C, eps_);
        ctx_.keep(l.xn2, xn2, size_t(Nr) * C);
    }
    layer.ffn->forward(bslot, params, l.xn2, l.h, y);
}

const float* ModelChunk::use(int unit, const float* params) {
    if (!units_) return params;
    const UnitParams p = units_->params(unit);
    if (ctx_.bf16()) ctx_.set_bf16_weights(p.f, p.b);  // the GEMMs read this unit's bf16 copy
    return p.f;
}

void ModelChunk::run_layers(Slot& s, const float* params, std::vector<std::unique_ptr<KvCache>>* caches) {
    const int Nr = ctx_.Nr, C = ctx_.d.C, N = ctx_.N;
    const int si = int(&s - slots_.data());
    if (plan_.first) {
        QUINTET_PROFILE("embedding");
        const float* P = use(embed_unit_, params);
        prefetch(layers_.empty() ? -1 : layer_unit_[0]);
        if (tp_.size() == 1) {
            be_.embedding_forward(s.res[0], s.ids, P + wte_, N, C);
        } else {  // vocab-parallel: each rank looks up its rows, the sum over tp completes x
            be_.embedding_forward(ctx_.full_b, s.ids, P + wte_, N, C);
            be_.copy(s.res[0], tp_.reduce(ctx_.full_b, ctx_.dshard, N, C), size_t(Nr) * C);
        }
        release(embed_unit_);
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
        const float* P = use(layer_unit_[i], params);
        prefetch(i + 1 < layers_.size() ? layer_unit_[i + 1] : plan_.last ? norm_unit_ : -1);
        forward_layer(i, full_recompute_ ? 0 : si, full_recompute_ ? ws_layers_[i] : s.layers[i],
                      s.tok, P, s.res[i], s.res[i + 1], caches ? (*caches)[i].get() : nullptr);
        release(layer_unit_[i]);
    }
}

double ModelChunk::loss(Slot& s, const float* params, float grad_scale, bool need_grad) {
    const int N = ctx_.N, Nr = ctx_.Nr, C = ctx_.d.C, Vl = ctx_.d.Vl();
    const float* Pn = use(norm_unit_, params);
    float* xf = ctx_.produce(s.xf, ctx_.full_a);
    {
        QUINTET_PROFILE("rmsnorm");
        be_.rmsnorm_forward(xf, s.rstd_f, s.res.back(), Pn + norm_, Nr, C, eps_);
        ctx_.keep(s.xf, xf, size_t(Nr) * C);
    }
    const float* Ph = use(head_unit_, params);
    {
        auto role = ctx_.role("gemm.lm_head");
        ctx_.mm(false, true, N, Vl, C, ctx_.gathered(s.xf, N, C), C, ctx_.weight(Ph + head_), C, 0.0f,
                s.logits, Vl);
    }
    release(head_unit_);
    release(norm_unit_);
    QUINTET_PROFILE("loss");
    if (tp_.size() == 1) {
        if (need_grad) be_.xent_forward_backward(s.logits, losses_.data(), tgt_, N, Vl, grad_scale);
        else be_.xent_forward(losses_.data(), s.logits, tgt_, N, Vl);
    } else {
        vocab_parallel_xent(be_, tp_, s.logits, losses_.data(), tgt_, N, Vl, grad_scale, need_grad, xent_);
    }
    double sum = 0.0;
    for (float x : losses_) sum += x;
    return sum;
}

double ModelChunk::forward(int si, const float* params, const int32_t* ids, const int32_t* targets,
                           float grad_scale, bool need_grad) {
    Slot& s = slots_[size_t(si)];
    QUINTET_CHECK(units_ || !ctx_.bf16() || params == ctx_.master(),
                  "bf16 chunk: params are not the arena set_bf16_weights named");
    set_tokens(s, plan_.first ? ids : nullptr, plan_.last ? targets : nullptr);
    if (docs_ || doc_positions_) {
        QUINTET_CHECK(ids, "document masks: every chunk needs the microbatch's ids");
        set_positions(s, ids);
    }
    run_layers(s, params, nullptr);
    if (!plan_.last) return 0.0;
    return loss(s, params, grad_scale, need_grad);
}

double ModelChunk::aux_loss(int si) const {
    double a = 0.0;  // (full recompute runs every forward in block slot 0)
    for (const auto& l : layers_) a += l.ffn->aux_loss(full_recompute_ ? 0 : si);
    return a;
}

int ModelChunk::moe_experts() const {
    int e = 0;
    for (const auto& l : layers_) e = std::max(e, l.ffn->experts());
    return e;
}

void ModelChunk::take_moe_counts(MoeCounts& counts) {
    for (size_t i = 0; i < layers_.size(); ++i)
        if (layers_[i].ffn->experts() > 0) layers_[i].ffn->take_counts(counts, plan_.layer_begin + int(i));
}

void ModelChunk::update_balance_bias(float* params, const MoeCounts& step) {
    for (size_t i = 0; i < layers_.size(); ++i)
        if (layers_[i].ffn->experts() > 0)
            layers_[i].ffn->update_bias(units_ ? units_->buffers(layer_unit_[i]) : params, step, plan_.layer_begin + int(i));
}

void ModelChunk::head_input(Slot& s, const float* params, float* grads, bool weight) {
    // The last chunk's start of the backward: from grad_scale * dL/dlogits (the loss wrote it
    // into s.logits) to dL/d(final norm input) in dres; with `weight` also the head's and the
    // norm's gradients (else W computes them from s.dxf).
    const int N = ctx_.N, Nr = ctx_.Nr, C = ctx_.d.C, Vl = ctx_.d.Vl();
    float* dres = s.dres;
    const float* Pn = use(norm_unit_, params);
    const float* Ph = use(head_unit_, params);
    // A head tied to this rank's own embedding: under ZeRO >= 2 its gradient joins the
    // embedding's, whose unit reduces at the end of the backward (embedding_weight).
    const bool head_now = weight && !(units_ && head_is_local_embedding_);
    Mat dlogits = ctx_.lowp(s.logits, size_t(N) * Vl);
    {
        auto role = ctx_.role("gemm.lm_head");
        if (head_now) {
            float* G = grads_of(head_unit_, grads);
            ctx_.mm(true, false, Vl, C, N, dlogits, Vl, ctx_.gathered(s.xf, N, C), C, 1.0f, G + head_, C);
        }
        ctx_.mm(false, false, N, C, Vl, dlogits, Vl, ctx_.weight(Ph + head_), C, 0.0f, ctx_.full_b, C);
    }
    const float* dxf = tp_.reduce(ctx_.full_b, ctx_.dshard, N, C);
    if (!weight) be_.copy(s.dxf, dxf, size_t(Nr) * C), dxf = s.dxf;
    be_.zero(dres, size_t(Nr) * C);
    {
        QUINTET_PROFILE("rmsnorm");
        float* Gn = weight ? grads_of(norm_unit_, grads) : nullptr;
        be_.rmsnorm_backward(dres, Gn ? Gn + norm_ : nullptr, dxf, s.res.back(), Pn + norm_, s.rstd_f, Nr, C);
    }
    release(head_unit_);
    release(norm_unit_);
    if (!weight) return;
    // A head tied to this rank's own embedding completes only with the embedding backward.
    if (!head_is_local_embedding_) head_done(grads);
    ctx_.done(grads_of(norm_unit_, grads) + norm_, size_t(C));
    reduce(norm_unit_);
}

void ModelChunk::head_done(float* grads) {
    ctx_.done(grads_of(head_unit_, grads) + head_, size_t(ctx_.d.Vl()) * ctx_.d.C);
    reduce(head_unit_);
}

void ModelChunk::backward(int si, const float* params, float* grads, GradReadyHook* hook) {
    const int Nr = ctx_.Nr, C = ctx_.d.C;
    Slot& s = slots_[size_t(si)];
    QUINTET_CHECK(units_ || !ctx_.bf16() || params == ctx_.master(),
                  "bf16 chunk: params are not the arena set_bf16_weights named");
    ctx_.hook = hook;
    float* dres = s.dres;  // dL/d(residual stream), this rank's rows
    if (plan_.last) head_input(s, params, grads, true);
    else be_.copy(dres, s.dout, size_t(Nr) * C);
    for (int i = int(layers_.size()) - 1; i >= 0; --i) {
        Layer& layer = layers_[size_t(i)];
        LayerSaved& l = full_recompute_ ? ws_layers_[size_t(i)] : s.layers[size_t(i)];
        const int bslot = full_recompute_ ? 0 : si;
        const int u = layer_unit_[size_t(i)];
        const float* P = use(u, params);
        prefetch(i > 0 ? layer_unit_[size_t(i - 1)] : -1);
        float* G = grads_of(u, grads);
        // Full recompute: the layer's forward again, from its kept input (the same bits).
        if (full_recompute_) {
            ctx_.recomputing = true;
            forward_layer(size_t(i), 0, l, s.tok, P, s.res[size_t(i)], recompute_out_, nullptr);
            ctx_.recomputing = false;
        }
        // Feed-forward branch, B then W at once; dres flows straight through the residual.
        const float* dhn = layer.ffn->backward_input(bslot, si, P, l.xn2, dres);
        layer.ffn->backward_weight(bslot, si, G, l.xn2);
        {
            QUINTET_PROFILE("rmsnorm");
            be_.rmsnorm_backward(dres, G + layer.ln2, dhn, l.h, P + layer.ln2, l.rstd2, Nr, C);
        }
        ctx_.done(G + layer.ln2, size_t(C));
        // Attention branch.
        const float* dxn = layer.attn->backward_input(bslot, si, s.tok, P, l.xn1, dres);
        layer.attn->backward_weight(bslot, si, s.tok, G, l.xn1, false);
        {
            QUINTET_PROFILE("rmsnorm");
            be_.rmsnorm_backward(dres, G + layer.ln1, dxn, s.res[size_t(i)], P + layer.ln1, l.rstd1, Nr, C);
        }
        ctx_.done(G + layer.ln1, size_t(C));
        release(u);
        reduce(u);
    }
    if (plan_.first) embedding_weight(s, grads);
    ctx_.hook = nullptr;
}

void ModelChunk::embedding_weight(Slot& s, float* grads) {
    QUINTET_PROFILE("embedding");
    const int N = ctx_.N, C = ctx_.d.C;
    float* G = grads_of(embed_unit_, grads);
    const float* D = tp_.gather(s.dres, ctx_.full_a, N, C);
    be_.embedding_backward(G + wte_, D, s.ids, N, C, ctx_.d.Vl());
    if (units_ && head_is_local_embedding_ && plan_.last) {  // the tied head's share, deferred to here
        auto role = ctx_.role("gemm.lm_head");
        const int Vl = ctx_.d.Vl();
        ctx_.mm(true, false, Vl, C, N, ctx_.lowp(s.logits, size_t(N) * Vl), Vl, ctx_.gathered(s.xf, N, C), C, 1.0f,
                G + head_, C);
    }
    ctx_.done(G + wte_, size_t(ctx_.d.Vl()) * C);
    reduce(embed_unit_);
}

void ModelChunk::recompute_layer(size_t i, Slot& s, const float* params) {
    ctx_.recomputing = true;
    forward_layer(i, 0, ws_layers_[i], s.tok, params, s.res[i], recompute_out_, nullptr);
    ctx_.recomputing = false;
}

void ModelChunk::backward_input(int si, const float* params) {
    QUINTET_CHECK(split_bw_, "backward_input on a chunk built without split_bw");
    const int Nr = ctx_.Nr, C = ctx_.d.C;
    Slot& s = slots_[size_t(si)];
    QUINTET_CHECK(units_ || !ctx_.bf16() || params == ctx_.master(),
                  "bf16 chunk: params are not the arena set_bf16_weights named");
    float* dres = s.dres;
    if (plan_.last) head_input(s, params, nullptr, false);
    else be_.copy(dres, s.dout, size_t(Nr) * C);
    for (int i = int(layers_.size()) - 1; i >= 0; --i) {
        Layer& layer = layers_[size_t(i)];
        LayerSaved& l = full_recompute_ ? ws_layers_[size_t(i)] : s.layers[size_t(i)];
        LayerDeferred& w = s.deferred[size_t(i)];
        const int bslot = full_recompute_ ? 0 : si;
        const int u = layer_unit_[size_t(i)];
        const float* P = use(u, params);
        prefetch(i > 0 ? layer_unit_[size_t(i - 1)] : -1);
        if (full_recompute_) recompute_layer(size_t(i), s, P);
        const float* dhn = layer.ffn->backward_input(bslot, si, P, l.xn2, dres);
        be_.copy(w.dy2, dhn, size_t(Nr) * C);
        {
            QUINTET_PROFILE("rmsnorm");
            be_.rmsnorm_backward(dres, nullptr, w.dy2, l.h, P + layer.ln2, l.rstd2, Nr, C);
        }
        const float* dxn = layer.attn->backward_input(bslot, si, s.tok, P, l.xn1, dres);
        be_.copy(w.dy1, dxn, size_t(Nr) * C);
        {
            QUINTET_PROFILE("rmsnorm");
            be_.rmsnorm_backward(dres, nullptr, w.dy1, s.res[size_t(i)], P + layer.ln1, l.rstd1, Nr, C);
        }
        release(u);
    }
}

void ModelChunk::backward_weight(int si, const float* params, float* grads, GradReadyHook* hook) {
    QUINTET_CHECK(split_bw_, "backward_weight on a chunk built without split_bw");
    const int N = ctx_.N, Nr = ctx_.Nr, C = ctx_.d.C;
    Slot& s = slots_[size_t(si)];
    ctx_.hook = hook;
    if (plan_.last) {
        const int Vl = ctx_.d.Vl();
        if (!(units_ && head_is_local_embedding_)) {
            auto role = ctx_.role("gemm.lm_head");
            Mat dlogits = ctx_.lowp(s.logits, size_t(N) * Vl);
            ctx_.mm(true, false, Vl, C, N, dlogits, Vl, ctx_.gathered(s.xf, N, C), C, 1.0f,
                    grads_of(head_unit_, grads) + head_, C);
        }
        {
            QUINTET_PROFILE("rmsnorm");
            be_.rmsnorm_backward(nullptr, grads_of(norm_unit_, grads) + norm_, s.dxf, s.res.back(), nullptr, s.rstd_f,
                                 Nr, C);
        }
        if (!head_is_local_embedding_) head_done(grads);
        ctx_.done(grads_of(norm_unit_, grads) + norm_, size_t(C));
        reduce(norm_unit_);
    }
    for (int i = int(layers_.size()) - 1; i >= 0; --i) {
        Layer& layer = layers_[size_t(i)];
        LayerSaved& l = full_recompute_ ? ws_layers_[size_t(i)] : s.layers[size_t(i)];
        LayerDeferred& w = s.deferred[size_t(i)];
        const int bslot = full_recompute_ ? 0 : si;
        const int u = layer_unit_[size_t(i)];
        // Full recompute: the layer's values were B's and are gone again -- the forward once more
        // (under ZeRO-3 with its parameters gathered again).
        if (full_recompute_) {
            const float* P = use(u, params);
            prefetch(i > 0 ? layer_unit_[size_t(i - 1)] : -1);
            recompute_layer(size_t(i), s, P);
            release(u);
        }
        float* G = grads_of(u, grads);
        layer.ffn->backward_weight(bslot, si, G, l.xn2);
        {
            QUINTET_PROFILE("rmsnorm");
            be_.rmsnorm_backward(nullptr, G + layer.ln2, w.dy2, l.h, nullptr, l.rstd2, Nr, C);
        }
        ctx_.done(G + layer.ln2, size_t(C));
        layer.attn->backward_weight(bslot, si, s.tok, G, l.xn1, true);
        {
            QUINTET_PROFILE("rmsnorm");
            be_.rmsnorm_backward(nullptr, G + layer.ln1, w.dy1, s.res[size_t(i)], nullptr, l.rstd1, Nr, C);
        }
        ctx_.done(G + layer.ln1, size_t(C));
        reduce(u);
    }
    if (plan_.first) embedding_weight(s, grads);
    ctx_.hook = nullptr;
}

double ModelChunk::forward_backward(const float* params, float* grads, const int32_t* ids,
                                    const int32_t* targets, float grad_scale) {
    QUINTET_CHECK(plan_.first && plan_.last, "forward_backward needs the whole model in one chunk");
    if (slots_.empty()) add_slot();
    double loss = forward(0, params, ids, targets, grad_scale, true);
    backward(0, params, grads);
    return loss;
}

double ModelChunk::forward_loss(const float* params, const int32_t* ids, const int32_t* targets) {
    QUINTET_CHECK(plan_.first && plan_.last, "forward_loss needs the whole model in one chunk");
    if (slots_.empty()) add_slot();
    return forward(0, params, ids, targets, 1.0f, false);
}

std::vector<std::unique_ptr<KvCache>> ModelChunk::make_caches(int max_len, bool full_kv) const {
    QUINTET_CHECK(!units_, "generation reads the whole arena (no ZeRO units)");
    std::vector<std::unique_ptr<KvCache>> out;
    for (const auto& l : layers_) out.push_back(l.attn->make_cache(max_len, full_kv));
    return out;
}

const std::vector<float>& ModelChunk::forward_cached(const float* params, const int32_t* ids, int pos0,
                                                     std::vector<std::unique_ptr<KvCache>>& caches) {
    QUINTET_CHECK(plan_.first && plan_.last && tp_.size() == 1 && ctx_.B == 1 && !cp_ && !docs_,
                  "generation needs the whole model on one rank, one sequence");
    QUINTET_CHECK(pos0 + ctx_.T <= ctx_.max_positions, "generation past the RoPE tables");
    if (slots_.empty()) add_slot();
    Slot& s = slots_[0];
    const int N = ctx_.N, C = ctx_.d.C, V = ctx_.d.V;
    std::vector<int32_t> pos(static_cast<size_t>(N));
    for (int n = 0; n < N; ++n) pos[size_t(n)] = pos0 + n;
    be_.from_host_i32(s.pos_all, pos.data(), size_t(N));  // the queries' positions, for the mask
    be_.from_host_i32(s.rope_pos, pos.data(), size_t(N));
    set_tokens(s, ids, nullptr);
    run_layers(s, params, &caches);
    float* xf = ctx_.produce(s.xf, ctx_.full_a);
    be_.rmsnorm_forward(xf, s.rstd_f, s.res.back(), params + norm_, N, C, eps_);
    ctx_.keep(s.xf, xf, size_t(N) * C);
    ctx_.mm(false, true, N, V, C, ctx_.local(s.xf), C, ctx_.weight(params + head_), C, 0.0f, s.logits, V);
    logits_host_.resize(size_t(V));
    be_.to_host(logits_host_.data(), s.logits + size_t(N - 1) * V, size_t(V));
    return logits_host_;
}

}  // namespace quintet
