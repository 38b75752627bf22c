// The coordinate check's measurements (train.probe_rms, quintet mup-check): the root mean square
// of each kind of layer output over the tokens of a step -- the quantities whose growth with
// width µP is designed to stop (docs/scaling-laws.md).
#pragma once
#include <array>
#include <cmath>
#include <cstddef>

namespace quintet {

// embedding: the embedding's output; attn_logits: the attention scores q.k x scale (causal pairs);
// attn_out, ffn_out: the attention and feed-forward blocks' outputs (what they add to the residual
// stream); residual: the residual stream after the last layer; output_logits: the LM head's logits.
enum class ProbeKind { embedding, attn_logits, attn_out, ffn_out, residual, output_logits };
constexpr int kNumProbeKinds = 6;
inline constexpr std::array<const char*, kNumProbeKinds> kProbeNames = {"embedding", "attn_logits", "attn_out",
                                                                        "ffn_out",   "residual",    "output_logits"};

// Sums of squares and counts, added up by the layers of a rank, then over the ranks.
struct RmsProbe {
    std::array<double, kNumProbeKinds> sumsq{}, count{};
    void add(ProbeKind k, double ss, double n) {
        sumsq[size_t(k)] += ss;
        count[size_t(k)] += n;
    }
    double rms(ProbeKind k) const {
        const size_t i = size_t(k);
        return count[i] > 0 ? std::sqrt(sumsq[i] / count[i]) : std::nan("");
    }
    void clear() { sumsq.fill(0), count.fill(0); }
};

}  // namespace quintet
