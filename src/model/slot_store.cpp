#include "quintet/model/slot_store.hpp"

#include <algorithm>

#include "quintet/core/error.hpp"
#include "quintet/model/rms_norm.hpp"
#include "mtp.hpp"

namespace quintet {

namespace {
// The chunk's own buffers and the decoder's per layer (the blocks name theirs).
constexpr F32Buf kFinalRstd{"final.rstd"}, kLogits{"logits"}, kDout{"dout"}, kDres{"dres"};
constexpr F32Buf kFinalDy{"w.final.dy"}, kRecomputeOut{"recompute_out"};
constexpr ActBuf kFinalX{"final.x"};
constexpr I32Buf kIds{"ids"}, kPosAll{"pos_all"}, kRopePos{"rope_pos"}, kDocAll{"doc_all"}, kTargets{"targets"};
constexpr F32Buf kRstd1{"norm.rstd1"}, kH{"norm.h"}, kRstd2{"norm.rstd2"};
constexpr ActBuf kXn1{"norm.xn1"}, kXn2{"norm.xn2"};
constexpr F32Buf kMtpH0{"mtp.h0"};
std::string res_name(int i) { return "res." + std::to_string(i); }

}  // namespace

LayerSaved layer_saved(const BufferViews& v) {
    LayerSaved l;
    l.rstd1 = v[kRstd1];
    l.xn1 = v[kXn1];
    l.h = v[kH];
    l.rstd2 = v[kRstd2];
    l.xn2 = v[kXn2];
    return l;
}

void declare_layer_norms(BufferDecl& layer, size_t Nr, size_t C) {
    layer.per_slot(kRstd1, Nr);
    layer.per_slot(kXn1, Nr * C);
    layer.per_slot(kH, Nr * C);
    layer.per_slot(kRstd2, Nr);
    layer.per_slot(kXn2, Nr * C);
}

size_t ChunkBuffers::largest_layer_bytes() const {
    size_t b = 0;
    for (size_t i = 0; i < layer.size(); ++i) b = std::max(b, layer_bytes(i));
    return b;
}

size_t ChunkBuffers::slot_bytes() const {
    size_t b = layout_bytes(own, bf16);
    for (size_t k = 0; k < mtp.size(); ++k) b += mtp_bytes(k);
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
    for (int i = 0; i <= nl; ++i) own.per_slot(F32Buf{res_name(i)}, Nr * C);  // each layer's input, the output
    if (plan.last) {
        own.per_slot(kFinalRstd, Nr);
        own.per_slot(kFinalX, Nr * C);               // the final norm's output, the head's input
        own.per_slot(kLogits, N * size_t(d.Vl()));  // then grad_scale * dloss/dlogits
    } else {
        own.per_slot(kDout, Nr * C);  // the next stage's gradient
    }
    own.per_slot(kDres, Nr * C);
    if (plan.last && s.split_bw) own.per_slot(kFinalDy, Nr * C);  // the final norm's incoming gradient, B -> W
    if (plan.first) own.per_slot(kIds, N);
    own.per_slot(kPosAll, size_t(s.cp) * N);
    own.per_slot(kRopePos, N);
    if (documents) own.per_slot(kDocAll, size_t(s.cp) * N);
    cb.own = own.saved;
    BufferDecl shared;
    LinearContext::declare(d.C, s, shared);
    shared.scratch(kTargets, N);
    if (plan.last && s.bf16) shared.operands(N * size_t(d.Vl()));
    for (int l = plan.layer_begin; l < plan.layer_end; ++l) {
        BufferDecl layer, attn, ffn, deferred;
        attention_declare_buffers(m, d, s, l, attn);
        feed_forward_declare_buffers(m, d, s, l, ffn);
        // The attention's buffers, the norms', the feed-forward's: the norms' (none B's only)
        // keep a run of B-only buffers (buffers.hpp, place_deferred) within one block, whose
        // backward has read all of it before anything is written there.
        for (const BufferDecl* b : {&attn, &ffn}) {
            if (b == &ffn) declare_layer_norms(layer, Nr, C);
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
                std::vector<std::string_view> names;
                for (const auto& sv : b.saved)
                    if (sv.b_only) names.push_back(sv.name);
                return names;
            };
            RmsNormLayer::declare_grad(deferred, "norm1", Nr, C, b_only(attn));
            RmsNormLayer::declare_grad(deferred, "norm2", Nr, C, b_only(ffn));
        }
        cb.layer.push_back(layer.saved);
        std::vector<PlacedBuffer> placed;
        std::vector<BufferSpec> rest;
        if (s.split_bw && !cb.full_recompute) place_deferred(layer.saved, deferred.deferred, s.bf16, placed, rest);
        else rest = deferred.deferred;
        cb.deferred.push_back(std::move(rest));
        cb.placed.push_back(std::move(placed));
    }
    if (plan.last && m.mtp_depth > 0) {
        own.saved.clear();
        own.per_slot(kMtpH0, Nr * C);
        cb.own.insert(cb.own.end(), own.saved.begin(), own.saved.end());
        for (int k = 0; k < m.mtp_depth; ++k) {
            BufferDecl mod;
            mtp_declare_buffers(m, d, s, m.n_layers + k, mod);
            // What W needs of B: per slot in the module's own bytes under a split schedule.
            if (s.split_bw) mod.saved.insert(mod.saved.end(), mod.deferred.begin(), mod.deferred.end());
            cb.mtp.push_back(mod.saved);
            merge_shared(shared.shared, mod.shared, s.bf16);
            if (!s.split_bw) merge_shared(shared.shared, mod.deferred, s.bf16);
            shared.operands(mod.operand);
            cb.ring_kv = std::max(cb.ring_kv, mod.ring_kv);
            cb.ring_out = std::max(cb.ring_out, mod.ring_out);
            cb.ring_lse = std::max(cb.ring_lse, mod.ring_lse);
            cb.exchange = std::max(cb.exchange, mod.exchange);
        }
    }
    if (cb.full_recompute && nl > 0) cb.workspace_own.push_back({std::string(kRecomputeOut.name), Nr * C, Elem::f32, false, {}});
    if (s.bf16) shared.scratch(Bf16Buf{"ctx.lowp"}, shared.operand);
    cb.operand = shared.operand;
    cb.shared = shared.shared;
    return cb;
}

SlotStore::SlotStore(Backend& be, ChunkBuffers buffers, const TokenLayout& tokens, const ChunkPlan& plan)
    : be_(be), buffers_(std::move(buffers)), tok_(tokens), plan_(plan), cp_rank_(tokens.cp ? tokens.cp->rank() : 0),
      cp_size_(tokens.cp ? tokens.cp->size() : 1) {
    QUINTET_CHECK(!(tok_.document_mask || tok_.document_positions) || tok_.eos_id >= 0, "document masks need an eos id");
    shared_ = BufferViews(buffers_.shared, arena(buffers_.shared_bytes()), buffers_.bf16);
    tgt_ = shared_[kTargets];
    const size_t N = size_t(tok_.B) * tok_.T_local;
    host_.ids.resize(N);
    host_.tgt.resize(N);
}

SlotStore::~SlotStore() {
    for (float* a : arenas_) be_.release(a);
}

void* SlotStore::arena(size_t bytes) {
    float* p = be_.alloc((bytes + sizeof(float) - 1) / sizeof(float));  // zeroed, 64-byte aligned
    arenas_.push_back(p);
    return p;
}

SlotStore::Added SlotStore::add_slot() {
    const size_t N = size_t(tok_.B) * tok_.T_local;
    const int nl = int(buffers_.layer.size());
    const bool bf16 = buffers_.bf16;
    Added out;
    out.index = int(slots_.size());
    if (full_recompute() && ws_layers_.empty() && nl > 0) {
        // One layer's activations, shared by every layer (each is recomputed before its
        // backward): every layer's views start at the same place of the workspace.
        char* ws = static_cast<char*>(arena(buffers_.workspace_bytes()));
        recompute_out_ = BufferViews(buffers_.workspace_own, ws, bf16)[kRecomputeOut];
        char* base = ws + layout_bytes(buffers_.workspace_own, bf16);
        for (int i = 0; i < nl; ++i) {
            out.saved.emplace_back(buffers_.layer[size_t(i)], base, bf16);
            ws_layers_.push_back(layer_saved(out.saved.back()));
        }
    }
    char* at = static_cast<char*>(arena(buffers_.slot_bytes()));
    const BufferViews own(buffers_.own, at, bf16);
    at += layout_bytes(buffers_.own, bf16);
    Slot s;
    for (int i = 0; i <= nl; ++i) s.res.push_back(own[F32Buf{res_name(i)}]);
    std::vector<BufferViews> saved;
    if (!full_recompute())
        for (int i = 0; i < nl; ++i) {
            saved.emplace_back(buffers_.layer[size_t(i)], at, bf16);
            at += buffers_.layer_bytes(size_t(i));
            s.layers.push_back(layer_saved(saved.back()));
        }
    // What W needs of B: this slot's own under a split schedule (some of it in the slot's saved
    // buffers B has read), else the shared scratch (W follows B at once).
    for (int i = 0; i < nl && buffers_.split_bw; ++i) {
        BufferViews w(buffers_.deferred[size_t(i)], at, bf16);
        at += buffers_.deferred_bytes(size_t(i));
        for (const PlacedBuffer& p : buffers_.placed[size_t(i)])
            w.add(p.spec, static_cast<char*>(saved[size_t(i)].address(p.target)) + p.offset);
        s.deferred.push_back(std::move(w));
    }
    if (!full_recompute()) out.saved = std::move(saved);
    if (plan_.last) {
        if (buffers_.split_bw) s.dxf = own[kFinalDy];
        s.rstd_f = own[kFinalRstd];
        s.xf = own[kFinalX];
        s.logits = own[kLogits];
    } else {
        s.dout = own[kDout];
    }
    s.dres = own[kDres];
    if (!buffers_.mtp.empty()) {
        s.mtp_h0 = own[kMtpH0];
        for (size_t k = 0; k < buffers_.mtp.size(); ++k) {
            s.mtp.emplace_back(buffers_.mtp[k], at, bf16);
            at += buffers_.mtp_bytes(k);
        }
    }
    if (plan_.first) s.ids = own[kIds];
    // Positions: each row's index in its sample (for every cp rank's rows), the same for RoPE;
    // documents (when masked) are set per microbatch.
    const size_t cp = size_t(cp_size_);
    s.pos_all = own[kPosAll];
    s.rope_pos = own[kRopePos];
    if (tok_.document_mask) s.doc_all = own[kDocAll];
    std::vector<int32_t> pos(cp * N);
    for (size_t j = 0; j < cp; ++j)
        for (size_t n = 0; n < N; ++n) pos[j * N + n] = global_position(int(j), int(n % size_t(tok_.T_local)));
    be_.from_host_i32(s.pos_all, pos.data(), cp * N);
    be_.from_host_i32(s.rope_pos, pos.data() + size_t(cp_rank_) * N, N);
    s.tok.pos = s.pos_all + size_t(cp_rank_) * N;
    s.tok.rope_pos = s.rope_pos;
    s.tok.pos_all = s.pos_all;
    s.tok.doc_all = s.doc_all;
    s.tok.doc = s.doc_all ? s.doc_all + size_t(cp_rank_) * N : nullptr;
    slots_.push_back(std::move(s));
    return out;
}

int SlotStore::global_position(int rank, int t) const { return tok_.cp ? tok_.cp->position(rank, t) : t; }

void SlotStore::set_tokens(Slot& s, const int32_t* ids, const int32_t* targets, int v0, int v1) {
    // This cp rank's rows of each sample; ids and targets relative to this rank's vocabulary
    // rows (-1 where another tp rank owns them).
    const int N = tok_.B * tok_.T_local, Tl = tok_.T_local;
    auto local = [&](int32_t x) { return x >= v0 && x < v1 ? x - v0 : -1; };
    auto at = [&](const int32_t* x, int n) { return x[size_t(n / Tl) * tok_.T + global_position(cp_rank_, n % Tl)]; };
    if (ids) {
        for (int n = 0; n < N; ++n) host_.ids[size_t(n)] = local(at(ids, n));
        be_.from_host_i32(s.ids, host_.ids.data(), size_t(N));
    }
    if (targets) {
        for (int n = 0; n < N; ++n) host_.tgt[size_t(n)] = local(at(targets, n));
        be_.from_host_i32(tgt_, host_.tgt.data(), size_t(N));
    }
}

void SlotStore::set_positions(Slot& s, const int32_t* ids) {
    // Document d of a sample = the tokens after the d-th eos (an eos ends, and belongs to, its
    // document); RoPE positions restart at each document under document_positions.
    const int B = tok_.B, Tl = tok_.T_local, N = B * Tl, T = tok_.T;
    const size_t cp = size_t(cp_size_);
    host_.doc.resize(cp * N);
    host_.rope.resize(size_t(N));
    host_.pos.resize(size_t(T) * 2);
    int32_t* doc = host_.pos.data();  // [T] document of each position of one sample
    int32_t* start = doc + T;         // [T] first position of that document
    for (int b = 0; b < B; ++b) {
        const int32_t* x = ids + size_t(b) * T;
        int d = 0, st = 0;
        for (int p = 0; p < T; ++p) {
            doc[p] = d;
            start[p] = st;
            if (x[p] == tok_.eos_id) {
                ++d;
                st = p + 1;
            }
        }
        for (size_t j = 0; j < cp; ++j)
            for (int t = 0; t < Tl; ++t) host_.doc[j * N + size_t(b) * Tl + t] = doc[global_position(int(j), t)];
        for (int t = 0; t < Tl; ++t) {
            const int p = global_position(cp_rank_, t);
            host_.rope[size_t(b) * Tl + t] = tok_.document_positions ? p - start[p] : p;
        }
    }
    if (tok_.document_mask) be_.from_host_i32(s.doc_all, host_.doc.data(), cp * N);
    be_.from_host_i32(s.rope_pos, host_.rope.data(), size_t(N));
}

void SlotStore::set_positions_from(Slot& s, int pos0) {
    const int N = tok_.B * tok_.T_local;
    host_.pos.resize(size_t(N));
    for (int n = 0; n < N; ++n) host_.pos[size_t(n)] = pos0 + n;
    set_positions_at(s, host_.pos.data());
}

void SlotStore::set_positions_at(Slot& s, const int32_t* positions) {
    const size_t N = size_t(tok_.B) * tok_.T_local;
    be_.from_host_i32(s.pos_all, positions, N);  // the queries' positions, for the mask
    be_.from_host_i32(s.rope_pos, positions, N);
}

}  // namespace quintet
