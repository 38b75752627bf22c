// RoPE frequencies with optional YaRN scaling (definitions and derivation: docs/math.md §3-4), and
// the cos/sin tables the kernels read. Rotate-half convention: pair (i, i + HD/2) shares
// inv_freq[i].
#pragma once
#include <vector>

#include "quintet/model/config.hpp"

namespace quintet {

// inv_freq[i], i = 0..HD/2-1, with YaRN applied when rope.scaling = yarn.
// `seq_len` stands in for rope.original_max_position when that is 0.
std::vector<double> rope_inv_freq(const RopeConfig& rope, int head_dim, int seq_len);
// YaRN attention temperature: 0.1 ln(s) + 1 (1 without YaRN). Logits are scaled by mscale^2.
double rope_mscale(const RopeConfig& rope);
// cos/sin [T, HD/2] for positions 0..T-1, each multiplied by `amplitude` (MHA folds mscale here).
void rope_tables(std::vector<float>& cos, std::vector<float>& sin, int T,
                 const std::vector<double>& inv_freq, double amplitude);

}  // namespace quintet
