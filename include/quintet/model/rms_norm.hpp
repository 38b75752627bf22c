// RMSNorm with its weight as a layer (docs/math.md §2): out = x * rsqrt(mean(x^2) + eps) * w, the
// decoder's two per layer and its final one, MLA's query and latent norms. Like a linear layer
// it has a backward in two parts: B, the input's gradient (accumulated: the norms sit on the
// residual stream), keeping its output gradient for W; W, the weight's gradient from it.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "quintet/model/linear.hpp"

namespace quintet {

class RmsNormLayer {
public:
    // The weight `tensor` (width floats) of the table; `id` names the kept output gradient
    // (`w.<id>.dy`, fp32), which declare_grad declares where the schedule needs it.
    RmsNormLayer(LinearContext& c, const ParamTable& t, const std::string& tensor, int width, float eps,
                 std::string_view id);
    static void declare_grad(BufferDecl& out, std::string_view id, size_t rows, size_t width,
                             const std::vector<std::string_view>& over = {});
    void add_w_slot(const BufferViews& w);
    void add_w_slot(float* dy) { dy_.push_back(dy); }  // kept elsewhere (the chunk's own buffers)

    // out[rows, width] (fp32) and rstd[rows] from x.
    void forward(float* out, float* rstd, const float* x, const float* params, int rows) const;
    // The same, the output kept in the activation precision (`staging`: its fp32 form in bf16).
    void forward(const Act& out, float* staging, float* rstd, const float* x, const float* params, int rows) const;
    // B and W at once: dx += (dy through the norm), dw += ..., then the hook is told.
    void backward(float* dx, float* grads, const float* dy, const float* x, const float* params, const float* rstd,
                  int rows);
    // B: dy kept for W (copied unless it was written where grad_target said), dx += (dy through the norm).
    float* grad_target(int wslot) const { return dy_[size_t(wslot)]; }
    void backward_input(int wslot, float* dx, const float* dy, const float* x, const float* params,
                        const float* rstd, int rows);
    // W: dw += ... from the kept dy, then the hook is told.
    void backward_weight(int wslot, float* grads, const float* x, const float* rstd, int rows);

private:
    LinearContext& c_;
    size_t w_;
    int width_;
    float eps_;
    std::string dy_name_;
    std::vector<float*> dy_;  // per wslot
};

}  // namespace quintet
