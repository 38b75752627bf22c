// The generation caches (quintet generate, model/decoder.hpp): what an attention block keeps of
// every past token so that each new token costs one row of work. Each attention kind has its own
// (MLA's compressed latent cache is in model/mla_generate.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quintet/kernels/backend.hpp"

namespace quintet {

// A generation cache for one attention block (quintet generate): what the block keeps of every
// past token so that each new token costs one row of work. Each attention kind has its own.
struct KvCache {
    virtual ~KvCache() = default;
    virtual size_t bytes_per_token() const = 0;
};

// What every cache keeps beside its rows: the positions 0, 1, ... of the cached tokens (backend
// memory: the keys' positions the causal mask reads) and how many tokens are cached. A cache
// holds `sequences` independent sequences (quintet generate --prompts decodes several at once),
// each with its own rows and length; one of them is selected at a time (`len` is its length)
// for a forward of consecutive rows of one sequence (a prompt, a step, a verification).
struct PositionedCache : KvCache {
    PositionedCache(Backend& be, int max_len, int sequences);
    ~PositionedCache() override;
    PositionedCache(const PositionedCache&) = delete;
    PositionedCache& operator=(const PositionedCache&) = delete;
    Backend& be;
    int32_t* pos = nullptr;  // [max_len]: every sequence's row t sits at position t
    int len = 0, max_len = 0;  // the selected sequence's cached tokens
    int sequences = 1, selected = 0;
    // A batched step (quintet generate --prompts): row r of the new rows is the next token of
    // sequence row_seq[r]; empty: the rows extend the selected sequence, in order.
    std::vector<int> row_seq;
    void select(int s);
    int length(int s) const { return s == selected ? len : lens_[size_t(s)]; }
    void reset(int s);  // sequence s forgets its tokens (its slot takes the next prompt)

private:
    std::vector<int> lens_;  // per sequence; the selected one's is `len`
};

// Per token, the keys [kw] and the values [vw] that attention reads (MHA's K|V of its kv
// heads; MLA's uncompressed per-head K|V).
struct KvRowsCache final : PositionedCache {
    KvRowsCache(Backend& be, int max_len, int kw, int vw, int sequences = 1);
    ~KvRowsCache() override;
    size_t bytes_per_token() const override { return size_t(kw + vw) * sizeof(float); }
    // n new rows: their keys k[n, kw] and values v[n, vw] (row strides ldk, ldv) appended (to
    // the selected sequence, or row r to sequence row_seq[r]), then the attention of their
    // queries q over every cached row of their sequence into out and lse (`a` as for training,
    // with its key length, strides and positions set here).
    void attend(const float* q, const float* knew, size_t ldk, const float* vnew, size_t ldv, int n, AttentionArgs a,
                float* out, float* lse);
    float *k = nullptr, *v = nullptr;  // [sequences, max_len, kw], [sequences, max_len, vw]
    int kw = 0, vw = 0;
};

}  // namespace quintet
