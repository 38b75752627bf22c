// The generation caches (quintet generate, model/decoder.hpp): what an attention block keeps of
// every past token so that each new token costs one row of work. Each attention kind has its own
// (MLA's compressed latent cache is in model/mla_generate.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quintet/kernels/backend.hpp"

namespace quintet {

// A generation cache for one attention block (quintet generate): what the block keeps of every
// past token so that each new token costs one row of work. Each attention kind has its own.
struct KvCache {
    virtual ~KvCache() = default;
    virtual size_t bytes_per_token() const = 0;
};

// What every cache keeps beside its rows: the positions 0, 1, ... of the cached tokens (backend
// memory: the keys' positions the causal mask reads) and how many tokens are cached.
struct PositionedCache : KvCache {
    PositionedCache(Backend& be, int max_len);
    ~PositionedCache() override;
    PositionedCache(const PositionedCache&) = delete;
    PositionedCache& operator=(const PositionedCache&) = delete;
    Backend& be;
    int32_t* pos = nullptr;  // [max_len]
    int len = 0, max_len = 0;
};

// Per token, the keys [kw] and the values [vw] that attention reads (MHA's K|V of its kv
// heads; MLA's uncompressed per-head K|V).
struct KvRowsCache final : PositionedCache {
    KvRowsCache(Backend& be, int max_len, int kw, int vw);
    ~KvRowsCache() override;
    size_t bytes_per_token() const override { return size_t(kw + vw) * sizeof(float); }
    // n new rows (one sequence): their keys k[n, kw] and values v[n, vw] (row strides ldk, ldv)
    // appended, then the attention of their queries q over every cached row into out and lse
    // (`a` as for training, with its key length, strides and positions set here).
    void attend(const float* q, const float* knew, size_t ldk, const float* vnew, size_t ldv, int n, AttentionArgs a,
                float* out, float* lse);
    float *k = nullptr, *v = nullptr;  // [max_len, kw], [max_len, vw]
    int kw = 0, vw = 0;
};

}  // namespace quintet
