// model.attention = mla in generation (quintet generate): the compressed cache and the attention
// of new rows over it, kv_b absorbed into the query and the output (docs/math.md §7.2).
#include "mla.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

namespace {

// The compressed cache of generation: per past token [RMSNorm(c) | RoPE(kr)], Lw floats. (The
// uncompressed alternative, quintet generate --kv-cache full, is a KvRowsCache of per-head K|V.)
// It also holds the absorbed query and output of the rows being added.
struct MlaLatentCache final : PositionedCache {
    float* lat = nullptr;   // [sequences, max_len, Lw]
    float* qlat = nullptr;  // [rows, NHl, Lw] the query in latent space
    float* olat = nullptr;  // [rows, NHl * rkv] the output in latent space
    int width = 0, rows = 0;
    size_t q_row = 0, o_row = 0;  // floats per row of qlat, olat
    MlaLatentCache(Backend& b, int max_len_, int width_, int rows_, size_t q_row_, size_t o_row_, int sequences_)
        : PositionedCache(b, max_len_, sequences_), width(width_), rows(rows_), q_row(q_row_), o_row(o_row_) {
        lat = be.alloc(size_t(sequences) * max_len * width);
        qlat = be.alloc(size_t(rows) * q_row);
        olat = be.alloc(size_t(rows) * o_row);
    }
    // The scratch for n new rows at once (a prompt in one forward: Decoder::prefill).
    void reserve_rows(int n) {
        if (n <= rows) return;
        be.release(qlat);
        be.release(olat);
        rows = n;
        qlat = be.alloc(size_t(rows) * q_row);
        olat = be.alloc(size_t(rows) * o_row);
    }
    float* rows_of(int s) { return lat + size_t(s) * max_len * width; }
    ~MlaLatentCache() override {
        be.release(lat);
        be.release(qlat);
        be.release(olat);
    }
    size_t bytes_per_token() const override { return size_t(width) * sizeof(float); }
};

}  // namespace

std::unique_ptr<KvCache> MlaAttention::make_cache(int max_len, bool full_kv, int sequences) const {
    QUINTET_CHECK(c_.d.tp == 1, "generation runs on one rank (tp = 1)");
    if (full_kv) return std::make_unique<KvRowsCache>(c_.be, max_len, s_.Qw(), s_.Aw(), sequences);
    return std::make_unique<MlaLatentCache>(c_.be, max_len, s_.Lw(), c_.N, size_t(s_.NHl) * s_.Lw(),
                                            size_t(s_.NHl) * s_.rkv, sequences);
}

// The new rows (B = 1) join the cache, then attend to all of it; the output into o_proj's input.
void MlaAttention::cached_core(int slot, const TokenInfo& tok, const float* params, KvCache* cache) {
    const int N = c_.N;
    Saved& s = slots_[size_t(slot)];
    QUINTET_CHECK(c_.B == 1 && !c_.bf16(), "MLA generation: one sequence, fp32");
    float* att = o_.input(slot, datt_);
    if (auto* fc = dynamic_cast<KvRowsCache*>(cache)) {  // per-head K|V, as training
        expand(slot, params, N);
        fc->attend(s.q, s.k, size_t(s_.Qw()), s.v, size_t(s_.Aw()), N, args(tok), att, lse_scratch_);
        o_.input_written(slot, att, size_t(N));
        return;
    }
    auto& lc = static_cast<MlaLatentCache&>(*cache);
    const bool batched = !lc.row_seq.empty();  // row r: the next token of sequence row_seq[r]
    QUINTET_CHECK(!batched || int(lc.row_seq.size()) == N, "MLA cache: a sequence for every new row");
    lc.reserve_rows(N);
    const int Lw = s_.Lw(), rkv = s_.rkv, dn = s_.dn, dv = s_.dv, NHl = s_.NHl;
    // The cache rows: [RMSNorm(c) | RoPE(kr)], at the end of their sequence.
    kv_norm_.forward(stage_, s.c_rstd, s.c, params, N);
    const int was = lc.selected;
    for (int r0 = 0; r0 < N;) {
        const int m = batched ? 1 : N;  // rows that go to one place
        if (batched) lc.select(lc.row_seq[size_t(r0)]);
        QUINTET_CHECK(lc.len + m <= lc.max_len, "KV cache: within max_len");
        float* row = lc.rows_of(lc.selected) + size_t(lc.len) * Lw;
        c_.be.copy_2d(row, Lw, stage_ + size_t(r0) * rkv, rkv, m, rkv, false);
        c_.be.copy_2d(row + rkv, Lw, kr_ + size_t(r0) * s_.dr, s_.dr, m, s_.dr, false);
        lc.len += m;
        r0 += m;
    }
    // Absorb kv_b's key half into the query: q_lat[h] = [q_nope[h] W_kb[h] | RoPE(q_rope[h])],
    // so that q_lat[h] . [cn | kr] = q_nope[h] . (W_kb[h] cn) + q_rope[h] . kr.
    const float* wkvb = params + kv_b_.offset();
    float* qlat = lc.qlat;  // [N, NHl, Lw]
    for (int hh = 0; hh < NHl; ++hh) {
        const float* wkb = wkvb + size_t(hh) * (dn + dv) * rkv;  // rows [h(dn+dv), h(dn+dv)+dn)
        c_.be.gemm(false, false, N, rkv, dn, 1.0f, s.q + size_t(hh) * s_.Dqk(), s_.Qw(), wkb, rkv, 0.0f,
                   qlat + size_t(hh) * Lw, NHl * Lw);
        c_.be.copy_2d(qlat + size_t(hh) * Lw + rkv, size_t(NHl) * Lw, s.q + size_t(hh) * s_.Dqk() + dn, s_.Qw(), N,
                      s_.dr, false);
    }
    // One latent "kv head" shared by every query head (MQA over [cn | kr], values cn).
    AttentionArgs a;
    a.B = 1, a.Tq = batched ? 1 : N;
    a.NH = NHl, a.NKV = 1;
    a.Dqk = Lw, a.Dv = rkv;
    a.q_stride = NHl * Lw, a.k_stride = a.v_stride = Lw, a.o_stride = NHl * rkv;
    a.scale = scale_;  // the scale of the uncompressed head dims, 1/sqrt(nope + rope)
    a.causal = true;
    a.k_pos = lc.pos;
    float* olat = lc.olat;  // [N, NHl * rkv]
    if (!batched) {
        a.Tk = lc.len, a.q_pos = tok.pos;
        c_.be.attention_forward(olat, lse_scratch_, qlat, lc.rows_of(lc.selected), lc.rows_of(lc.selected), a);
    } else {  // each row over its own sequence (the same work as that sequence's step alone)
        for (int r = 0; r < N; ++r) {
            const int sq = lc.row_seq[size_t(r)];
            a.Tk = lc.length(sq), a.q_pos = tok.pos + r;
            c_.be.attention_forward(olat + size_t(r) * a.o_stride, lse_scratch_ + size_t(r) * NHl,
                                    qlat + size_t(r) * a.q_stride, lc.rows_of(sq), lc.rows_of(sq), a);
        }
        lc.select(was);
    }
    // Absorb kv_b's value half into the output: out[h] = o_lat[h] W_vb[h]^T.
    for (int hh = 0; hh < NHl; ++hh) {
        const float* wvb = wkvb + (size_t(hh) * (dn + dv) + dn) * rkv;  // [dv, rkv]
        c_.be.gemm(false, true, N, dv, rkv, 1.0f, olat + size_t(hh) * rkv, NHl * rkv, wvb, rkv, 0.0f,
                   att + size_t(hh) * dv, s_.Aw());
    }
    o_.input_written(slot, att, size_t(N));
}

}  // namespace quintet
