// Speculative greedy decoding with the MTP modules (docs/math.md §11). Module k (1-based) at row
// j embeds token t[j+k] and reads h^{k-1}[j], as in training; its cache holds the rows whose
// token is certain (j + k <= the last known token), so after each verification every cache is
// trimmed to the rows that were computed from accepted tokens only.
#include "quintet/model/speculative.hpp"

#include <algorithm>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {
int32_t greedy(const float* z, size_t V) { return int32_t(std::max_element(z, z + V) - z); }
}  // namespace

MtpSpeculator::MtpSpeculator(Decoder& dec, const std::vector<int32_t>& prompt)
    : dec_(dec), D_(dec.mtp_depth()), tokens_(prompt) {
    QUINTET_CHECK(D_ > 0 && !prompt.empty() && dec.cached() == int(prompt.size()),
                  "speculative decoding: a model with MTP modules, the prompt in the caches");
    C_ = int(dec.hidden().size() / prompt.size());
    h_.resize(size_t(D_) + 1);
    h_[0] = dec.hidden();
}

std::vector<int32_t> MtpSpeculator::advance(int32_t next, int limit) {
    QUINTET_CHECK(limit >= 1, "speculative decoding: at least one token to produce");
    const int n = int(tokens_.size());  // next sits at position n
    const int drafts = std::min(D_, limit);
    std::vector<int32_t> ext(tokens_);
    ext.push_back(next);
    // Draft: module k catches up on the rows it has not cached yet (the last one uses the draft
    // of module k - 1), and its last row drafts the token k + 1 after `next`.
    for (int k = 0; k < drafts; ++k) {
        const int from = dec_.mtp_cached(k), m = n - from;
        h_[size_t(k) + 1].resize(size_t(n) * C_);
        const std::vector<float>& z = dec_.mtp(k, h_[size_t(k)].data() + size_t(from) * C_, ext.data() + from + k + 1,
                                               m, from, h_[size_t(k) + 1].data() + size_t(from) * C_);
        ext.push_back(greedy(z.data(), z.size()));
    }
    // Verify: `next` and the drafts in one forward; row i's greedy token is the one after ext[n + i].
    const std::vector<float>& z = dec_.forward(ext.data() + n, drafts + 1, n);
    const size_t V = z.size() / size_t(drafts + 1);
    int a = 0;
    int32_t own = greedy(z.data(), V);
    while (a < drafts && ext[size_t(n + a + 1)] == own) {
        ++a;
        own = greedy(z.data() + size_t(a) * V, V);
    }
    // Keep what the accepted tokens computed: the main caches through ext[n + a], h^0 of those
    // rows; module k's rows j with j + k + 1 <= n + a.
    dec_.truncate(n + a + 1);
    h_[0].resize(size_t(n + a + 1) * C_);
    std::copy(dec_.hidden().begin(), dec_.hidden().begin() + size_t(a + 1) * C_, h_[0].begin() + size_t(n) * C_);
    for (int k = 0; k < D_; ++k)
        dec_.mtp_truncate(k, std::max(0, std::min(dec_.mtp_cached(k), n + a - k)));
    tokens_.insert(tokens_.end(), ext.begin() + n, ext.begin() + n + a + 1);
    ++stats_.rounds;
    stats_.drafted += drafts;
    stats_.accepted += a;
    std::vector<int32_t> out(ext.begin() + n + 1, ext.begin() + n + 1 + a);
    if (int(out.size()) < limit) out.push_back(own);
    return out;
}

}  // namespace quintet
