#include "quintet/model/decoder.hpp"

#include "quintet/core/error.hpp"

#include <algorithm>

namespace quintet {

PositionedCache::PositionedCache(Backend& b, int max_len_, int sequences_)
    : be(b), max_len(max_len_), sequences(sequences_), lens_(size_t(sequences_), 0) {
    QUINTET_CHECK(sequences >= 1, "a generation cache holds at least one sequence");
    pos = be.alloc_i32(size_t(max_len));
    std::vector<int32_t> p(static_cast<size_t>(max_len));
    for (int i = 0; i < max_len; ++i) p[size_t(i)] = i;
    be.from_host_i32(pos, p.data(), p.size());
}

PositionedCache::~PositionedCache() { be.release_i32(pos); }

void PositionedCache::select(int s) {
    QUINTET_CHECK(s >= 0 && s < sequences, "generation cache: a sequence it holds");
    lens_[size_t(selected)] = len;
    selected = s;
    len = lens_[size_t(s)];
}

void PositionedCache::reset(int s) {
    QUINTET_CHECK(s >= 0 && s < sequences, "generation cache: a sequence it holds");
    lens_[size_t(s)] = 0;
    if (s == selected) len = 0;
}

KvRowsCache::KvRowsCache(Backend& b, int max_len_, int kw_, int vw_, int sequences_)
    : PositionedCache(b, max_len_, sequences_), kw(kw_), vw(vw_) {
    k = be.alloc(size_t(sequences) * max_len * kw);
    v = be.alloc(size_t(sequences) * max_len * vw);
}

KvRowsCache::~KvRowsCache() {
    be.release(k);
    be.release(v);
}

void KvRowsCache::attend(const float* q, const float* knew, size_t ldk, const float* vnew, size_t ldv, int n,
                         AttentionArgs a, float* out, float* lse) {
    QUINTET_CHECK(a.B == 1, "KV cache: one sequence per forward, or one row per sequence");
    a.k_stride = kw, a.v_stride = vw;
    a.k_pos = pos;
    a.q_doc = a.k_doc = nullptr;
    // Rows of one sequence [max_len, kw] apart.
    auto keys = [&](int s) { return k + size_t(s) * max_len * kw; };
    auto values = [&](int s) { return v + size_t(s) * max_len * vw; };
    if (row_seq.empty()) {
        QUINTET_CHECK(len + n <= max_len, "KV cache: within max_len");
        be.copy_2d(keys(selected) + size_t(len) * kw, size_t(kw), knew, ldk, size_t(n), size_t(kw), false);
        be.copy_2d(values(selected) + size_t(len) * vw, size_t(vw), vnew, ldv, size_t(n), size_t(vw), false);
        len += n;
        a.Tk = len;
        be.attention_forward(out, lse, q, keys(selected), values(selected), a);
        return;
    }
    // One row per sequence: each row joins its sequence and attends to it alone (a query row,
    // the same work as a step of that sequence by itself, so the same bits).
    QUINTET_CHECK(int(row_seq.size()) == n, "KV cache: a sequence for every new row");
    const int was = selected;
    const int32_t* q_pos = a.q_pos;
    a.Tq = 1;
    for (int r = 0; r < n; ++r) {
        select(row_seq[size_t(r)]);
        QUINTET_CHECK(len < max_len, "KV cache: within max_len");
        be.copy(keys(selected) + size_t(len) * kw, knew + size_t(r) * ldk, size_t(kw));
        be.copy(values(selected) + size_t(len) * vw, vnew + size_t(r) * ldv, size_t(vw));
        a.Tk = ++len;
        a.q_pos = q_pos + r;
        be.attention_forward(out + size_t(r) * a.o_stride, lse + size_t(r) * a.NH, q + size_t(r) * a.q_stride,
                             keys(selected), values(selected), a);
    }
    select(was);
}

namespace {
ChunkOptions decode_options(int train_seq_len, int max_len) {
    ChunkOptions o;
    o.max_positions = max_len;
    o.rope_seq_len = train_seq_len;
    return o;
}
// Generation drops no token: a one-token step can never exceed an expert's capacity (its k
// choices are k experts), so without the training-time cap a forward of many rows (the prompt,
// a speculative verification) computes what that many steps would.
ModelConfig generation_model(ModelConfig m) {
    m.moe.capacity_factor = 0;
    return m;
}
PositionedCache& positioned(KvCache& c) { return dynamic_cast<PositionedCache&>(c); }
}  // namespace

Decoder::Decoder(Backend& be, const ModelConfig& model, const RopeConfig& rope, int train_seq_len,
                 const ParamTable& table, const std::vector<float>& params, int max_len, bool full_kv,
                 int sequences)
    : tp_(self_, false),
      be_(be),
      model_(generation_model(model)),
      rope_(rope),
      table_(table),
      train_seq_len_(train_seq_len),
      max_len_(max_len),
      chunk_(be, model_, rope, table, stage_chunks(model.n_layers, 1, 1, 0, {})[0], tp_, 1, 1,
             decode_options(train_seq_len, max_len)),
      params_(params.data()) {
    for (const auto& l : chunk_.layers_) caches_.push_back(l.attn->make_cache(max_len, full_kv, sequences));
    for (const auto& md : chunk_.mtp_.modules) mtp_caches_.push_back(md.block.attn->make_cache(max_len, full_kv));
}

ModelChunk& Decoder::rows(int n) {
    if (n == 1) return chunk_;
    auto& c = chunks_[n];
    if (!c)
        c = std::make_unique<ModelChunk>(be_, model_, rope_, table_, stage_chunks(model_.n_layers, 1, 1, 0, {})[0], tp_,
                                         1, n, decode_options(train_seq_len_, max_len_));
    return *c;
}

// The chunk's rows (ids, host) at positions pos0, pos0 + 1, ... through the layers with the
// caches, then the final norm and the head on every row; the logits of the last row into `out`.
void Decoder::run(ModelChunk& c, const int32_t* ids, int pos0, std::vector<float>& out, bool all_rows,
                  const int32_t* positions) {
    QUINTET_CHECK(c.plan_.first && c.plan_.last && c.tp_.size() == 1 && c.ctx_.B == 1 && !c.ctx_.cp && !c.documents_,
                  "generation needs the whole model on one rank, one sequence");
    QUINTET_CHECK(positions || pos0 + c.ctx_.T <= c.ctx_.max_positions, "generation past the RoPE tables");
    QUINTET_CHECK(!c.units_, "generation reads the whole arena (no ZeRO units)");
    if (c.store_.slots() == 0) c.add_slot();
    Slot& s = c.store_.slot(0);
    const int N = c.ctx_.N, V = c.ctx_.d.V;
    if (positions) c.store_.set_positions_at(s, positions);
    else c.store_.set_positions_from(s, pos0);
    c.store_.set_tokens(s, ids, nullptr, 0, V);
    c.run_layers(0, params_, &caches_);
    c.final_norm_->forward(s.xf, c.lin_.full_a, s.rstd_f, s.res.back(), params_, N);
    c.head_->forward(s.xf, s.logits, params_);
    if (keep_hidden_) {
        hidden_.resize(size_t(N) * c.ctx_.d.C);
        be_.to_host(hidden_.data(), s.xf.f, hidden_.size());
    }
    const int from = all_rows ? 0 : N - 1;
    out.resize(size_t(N - from) * V);
    be_.to_host(out.data(), s.logits + size_t(from) * V, out.size());
}

const std::vector<float>& Decoder::step(int id, int pos) {
    const int32_t token = id;
    run(chunk_, &token, pos, logits_);
    return logits_;
}

const std::vector<float>& Decoder::prefill(const int32_t* ids, int n) {
    QUINTET_CHECK(cached() == 0, "Decoder::prefill: a sequence with nothing cached");
    ModelChunk batch(be_, model_, rope_, table_, stage_chunks(model_.n_layers, 1, 1, 0, {})[0], tp_, 1, n,
                     decode_options(train_seq_len_, max_len_));
    run(batch, ids, 0, logits_);
    return logits_;
}

void Decoder::select(int s) {
    for (auto& c : caches_) positioned(*c).select(s);
}

void Decoder::reset(int s) {
    for (auto& c : caches_) positioned(*c).reset(s);
}

int Decoder::length(int s) const { return caches_.empty() ? 0 : positioned(*caches_[0]).length(s); }

const std::vector<float>& Decoder::step_batch(const int* seqs, const int32_t* ids, int n) {
    QUINTET_CHECK(n >= 1, "Decoder::step_batch: at least one sequence");
    ModelChunk& c = rows(n);
    batch_pos_.resize(size_t(n));
    for (int r = 0; r < n; ++r) {
        batch_pos_[size_t(r)] = length(seqs[r]);
        QUINTET_CHECK(batch_pos_[size_t(r)] < c.ctx_.max_positions, "generation past the RoPE tables");
    }
    for (auto& cache : caches_) positioned(*cache).row_seq.assign(seqs, seqs + n);
    run(c, ids, 0, logits_, true, batch_pos_.data());
    for (auto& cache : caches_) positioned(*cache).row_seq.clear();
    return logits_;
}

const std::vector<float>& Decoder::forward(const int32_t* ids, int n, int pos0) {
    QUINTET_CHECK(n >= 1 && pos0 == cached(), "Decoder::forward: rows after the cached ones");
    run(rows(n), ids, pos0, logits_, true);
    return logits_;
}

int Decoder::cached() const { return caches_.empty() ? 0 : positioned(*caches_[0]).len; }

void Decoder::truncate(int len) {
    for (auto& c : caches_) {
        PositionedCache& p = positioned(*c);
        QUINTET_CHECK(len >= 0 && len <= p.len, "Decoder::truncate: within the cached tokens");
        p.len = len;
    }
}

int Decoder::mtp_cached(int k) const { return positioned(*mtp_caches_[size_t(k)]).len; }

void Decoder::mtp_truncate(int k, int len) {
    PositionedCache& p = positioned(*mtp_caches_[size_t(k)]);
    QUINTET_CHECK(len >= 0 && len <= p.len, "Decoder::mtp_truncate: within the cached rows");
    p.len = len;
}

// In pieces of at most mtp_depth + 1 rows: the chunk sizes verification builds anyway.
const std::vector<float>& Decoder::mtp(int k, const float* h_prev, const int32_t* ids, int n, int pos0,
                                      float* h_out) {
    QUINTET_CHECK(k >= 0 && k < mtp_depth() && n >= 1 && pos0 == mtp_cached(k), "Decoder::mtp: module and rows");
    const int C = chunk_.ctx_.d.C, piece = mtp_depth() + 1;
    logits_.resize(size_t(chunk_.ctx_.d.V));
    for (int r0 = 0; r0 < n; r0 += piece) {
        const int m = std::min(piece, n - r0);
        ModelChunk& c = rows(m);
        QUINTET_CHECK(pos0 + r0 + m <= c.ctx_.max_positions, "generation past the RoPE tables");
        if (c.store_.slots() == 0) c.add_slot();
        Slot& s = c.store_.slot(0);
        c.store_.set_positions_from(s, pos0 + r0);
        c.store_.set_tokens(s, ids + r0, nullptr, 0, c.ctx_.d.V);
        be_.from_host(s.mtp_h0, h_prev + size_t(r0) * C, size_t(m) * C);
        c.mtp_generate(k, params_, mtp_caches_[size_t(k)].get(), h_out + size_t(r0) * C, logits_.data());
    }
    return logits_;
}

size_t Decoder::cache_bytes_per_token() const {
    size_t b = 0;
    for (const auto& c : caches_) b += c->bytes_per_token();
    return b;
}

}  // namespace quintet
