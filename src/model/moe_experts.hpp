// The MoE experts (docs/math.md §9), the last of the MoE block's stages: this rank's experts,
// each a SwiGLU of moe.ffn_dim, computed as one GEMM pair per expert over its contiguous rows
// (the dispatcher sorted them) -- no per-token loops, no padding to a capacity, and the same
// bits whatever the imbalance. Private to model/.
#pragma once
#include <string>
#include <vector>

#include "quintet/model/block.hpp"

namespace quintet {

class MoeExperts {
public:
    // The rows the experts compute on, expert-major: their inputs x [rows, C] (saved in the
    // chunk's precision), gate|up [rows, 2F], the activation [rows, F] (saved), and each local
    // expert's row count and first row.
    struct Rows {
        Act x;
        float* gu;
        Act act;
        const int* count;   // [El]
        const int* offset;  // [El]
    };
    // Experts [e0, e0 + El) of layer `layer` (their gate|up adjacent in the arena, checked).
    MoeExperts(BlockContext& c, const ParamTable& table, const std::string& prefix, int e0, int El, int F);
    // out[rows, C] = each row's expert applied to it.
    void forward(const Rows& r, const float* params, int rows, float* out);
    // B, from dy[rows, C]: dx[rows, C]; keeps dy and d(gate|up) as W's operands in wdy [rows, C]
    // and wdgu [rows, 2F] (deferred buffers of the chunk's activation precision).
    void backward_input(const Rows& r, const float* params, int rows, const float* dy, float* dx, const Act& wdy,
                        const Act& wdgu);
    // W: the experts' weight gradients (accumulated) from what B kept.
    void backward_weight(const Rows& r, float* grads, const Act& wdy, const Act& wdgu);
    void done(float* grads) const;  // every local expert's gradients are final (the hook)

private:
    BlockContext& c_;
    const int El_, F_;
    std::vector<size_t> wgu_, wd_;  // [El] arena offsets
    float *dgu_ = nullptr, *dact_, *stage_;  // shared scratch ("moe.dgu" (bf16 only), "moe.dact", "moe.stage")
};

}  // namespace quintet
