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
// YaRN's attention temperature as DeepSeek writes it: 0.1 c ln(s) + 1 for s > 1, else 1.
double yarn_mscale(double s, double c);
// The factors of docs/math.md §4.4 (1 without YaRN): cos and sin times
// m(mscale) / m(mscale_all_dim), the softmax scale times m(mscale_all_dim)^2. MHA, which rotates
// every q/k dim, folds their product, m(mscale), into cos and sin alone.
double rope_table_factor(const RopeConfig& rope);
double rope_softmax_factor(const RopeConfig& rope);
double rope_mscale(const RopeConfig& rope);  // m(mscale): MHA's cos/sin factor
// cos/sin [T, HD/2] for positions 0..T-1, each multiplied by `amplitude` (MHA folds mscale here).
void rope_tables(std::vector<float>& cos, std::vector<float>& sin, int T,
                 const std::vector<double>& inv_freq, double amplitude);

}  // namespace quintet
