// The MoE experts (docs/math.md §9), the last of the MoE block's stages: this rank's experts,
// each a SwiGLU of moe.ffn_dim -- two grouped linear layers (gate|up, down; one GEMM per expert
// over its contiguous rows, which the dispatcher sorted) around the SwiGLU -- with no per-token
// loops, no padding to a capacity, and the same bits whatever the imbalance. Private to model/.
#pragma once
#include <string>
#include <vector>

#include "quintet/model/block.hpp"

namespace quintet {

class MoeExperts {
public:
    // What they keep per slot (their input rows, gate|up, the activation) and what W needs of B;
    // Rx: the most rows this rank's experts may be handed. The kept output gradients may live in
    // the experts' outputs `y_sorted` and in their gate|up once B has read them.
    static void declare_saved(BufferDecl& out, size_t Rx, size_t C, size_t F);
    static void declare_grads(BufferDecl& out, size_t Rx, size_t C, size_t F, std::string_view y_sorted,
                              const BufferShape& s);
    static void declare_scratch(BufferDecl& out, size_t Rx, size_t F);
    // Experts [e0, e0 + El) of the layer whose tensors start with `prefix` (gate|up adjacent, checked).
    MoeExperts(BlockContext& c, const ParamTable& table, const std::string& prefix, int e0, int El, int F, int Rx);
    void add_slot(const BufferViews& saved);
    void add_w_slot(const BufferViews& w);
    using Groups = GroupedLinear::Groups;
    // Their input rows, expert-major: where the dispatcher writes them (fp32), then written.
    float* input(int slot, float* staging) const { return gate_up_.input(slot, staging); }
    void input_written(int slot, const float* staging, int rows) { gate_up_.input_written(slot, staging, size_t(rows)); }
    // out[rows, C] = each row's expert applied to it.
    void forward(int slot, const Groups& g, int rows, float* out, const float* params);
    // B, from dy[rows, C]: dx[rows, C]; W: the experts' weight gradients (accumulated).
    void backward_input(int slot, int wslot, const Groups& g, int rows, const float* dy, float* dx,
                        const float* params);
    void backward_weight(int slot, int wslot, const Groups& g, float* grads);

private:
    BlockContext& c_;
    const int F_;
    GroupedLinear gate_up_, down_;
    float *dact_, *stage_;      // shared scratch
    std::vector<float*> gu_;    // per slot: [rows, 2F] gate | up
};

}  // namespace quintet
