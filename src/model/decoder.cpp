#include "quintet/model/decoder.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

PositionedCache::PositionedCache(Backend& b, int max_len_) : be(b), max_len(max_len_) {
    pos = be.alloc_i32(size_t(max_len));
    std::vector<int32_t> p(static_cast<size_t>(max_len));
    for (int i = 0; i < max_len; ++i) p[size_t(i)] = i;
    be.from_host_i32(pos, p.data(), p.size());
}

PositionedCache::~PositionedCache() { be.release_i32(pos); }

KvRowsCache::KvRowsCache(Backend& b, int max_len_, int kw_, int vw_) : PositionedCache(b, max_len_), kw(kw_), vw(vw_) {
    k = be.alloc(size_t(max_len) * kw);
    v = be.alloc(size_t(max_len) * vw);
}

KvRowsCache::~KvRowsCache() {
    be.release(k);
    be.release(v);
}

void KvRowsCache::attend(const float* q, const float* knew, size_t ldk, const float* vnew, size_t ldv, int n,
                         AttentionArgs a, float* out, float* lse) {
    QUINTET_CHECK(a.B == 1 && len + n <= max_len, "KV cache: one sequence, within max_len");
    be.copy_2d(k + size_t(len) * kw, size_t(kw), knew, ldk, size_t(n), size_t(kw), false);
    be.copy_2d(v + size_t(len) * vw, size_t(vw), vnew, ldv, size_t(n), size_t(vw), false);
    len += n;
    a.Tk = len;
    a.k_stride = kw, a.v_stride = vw;
    a.k_pos = pos;
    a.q_doc = a.k_doc = nullptr;
    be.attention_forward(out, lse, q, k, v, a);
}

namespace {
ChunkOptions decode_options(int train_seq_len, int max_len) {
    ChunkOptions o;
    o.max_positions = max_len;
    o.rope_seq_len = train_seq_len;
    return o;
}
}  // namespace

Decoder::Decoder(Backend& be, const ModelConfig& model, const RopeConfig& rope, int train_seq_len,
                 const ParamTable& table, const std::vector<float>& params, int max_len, bool full_kv)
    : tp_(self_, false),
      be_(be),
      model_(model),
      rope_(rope),
      table_(table),
      train_seq_len_(train_seq_len),
      max_len_(max_len),
      chunk_(be, model, rope, table, stage_chunks(model.n_layers, 1, 1, 0, {})[0], tp_, 1, 1,
             decode_options(train_seq_len, max_len)),
      params_(params.data()) {
    for (const auto& l : chunk_.layers_) caches_.push_back(l.attn->make_cache(max_len, full_kv));
}

// The chunk's rows (ids, host) at positions pos0, pos0 + 1, ... through the layers with the
// caches, then the final norm and the head on every row; the logits of the last row into `out`.
void Decoder::run(ModelChunk& c, const int32_t* ids, int pos0, std::vector<float>& out) {
    QUINTET_CHECK(c.plan_.first && c.plan_.last && c.tp_.size() == 1 && c.ctx_.B == 1 && !c.ctx_.cp && !c.documents_,
                  "generation needs the whole model on one rank, one sequence");
    QUINTET_CHECK(pos0 + c.ctx_.T <= c.ctx_.max_positions, "generation past the RoPE tables");
    QUINTET_CHECK(!c.units_, "generation reads the whole arena (no ZeRO units)");
    if (c.store_.slots() == 0) c.add_slot();
    Slot& s = c.store_.slot(0);
    const int N = c.ctx_.N, V = c.ctx_.d.V;
    c.store_.set_positions_from(s, pos0);
    c.store_.set_tokens(s, ids, nullptr, 0, V);
    c.run_layers(0, params_, &caches_);
    c.final_norm_->forward(s.xf, c.lin_.full_a, s.rstd_f, s.res.back(), params_, N);
    c.head_->forward(s.xf, s.logits, params_);
    out.resize(size_t(V));
    be_.to_host(out.data(), s.logits + size_t(N - 1) * V, size_t(V));
}

const std::vector<float>& Decoder::step(int id, int pos) {
    const int32_t token = id;
    run(chunk_, &token, pos, logits_);
    return logits_;
}

const std::vector<float>& Decoder::prefill(const int32_t* ids, int n) {
    ModelChunk batch(be_, model_, rope_, table_, stage_chunks(model_.n_layers, 1, 1, 0, {})[0], tp_, 1, n,
                     decode_options(train_seq_len_, max_len_));
    run(batch, ids, 0, logits_);
    return logits_;
}

size_t Decoder::cache_bytes_per_token() const {
    size_t b = 0;
    for (const auto& c : caches_) b += c->bytes_per_token();
    return b;
}

}  // namespace quintet
