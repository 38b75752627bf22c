// The dense Llama-style decoder: forward and backward of one microbatch, written out layer by
// layer (no autograd tape). Parameters and gradients live in arenas owned by the caller (the
// trainer); this class owns the activations it saves for backward, allocated once for a fixed
// microbatch shape, so the steady-state step allocates nothing.
#pragma once
#include <cstdint>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/params.hpp"

namespace quintet {

class Transformer {
public:
    // B, T: the microbatch shape this instance serves.
    Transformer(Backend& be, const ModelConfig& m, const RopeConfig& rope, const ParamTable& table,
                int B, int T);
    ~Transformer();
    Transformer(const Transformer&) = delete;
    Transformer& operator=(const Transformer&) = delete;

    // Forward + backward of one microbatch. ids/targets: host [B*T]. Gradients accumulate into
    // `grads` (same layout as `params`), scaled by grad_scale (1 / tokens of the global batch).
    // Returns the sum of the token losses of this microbatch.
    double forward_backward(const float* params, float* grads, const int32_t* ids,
                            const int32_t* targets, float grad_scale);
    // Forward only: sum of token losses (evaluation).
    double forward_loss(const float* params, const int32_t* ids, const int32_t* targets);

    const ModelDims& dims() const { return d_; }
    // Bytes of activations held for backward (reported at start).
    size_t activation_bytes() const { return act_floats_ * sizeof(float); }

private:
    void forward(const ModelView& w, bool need_saved);
    void backward(const ModelView& w, const ModelView& g);

    Backend& be_;
    ModelDims d_;
    const ParamTable& table_;
    int B_, T_, N_;
    float eps_, attn_scale_;
    float *cos_, *sin_;                 // [T, HD/2]
    int32_t *ids_, *tgt_;               // [N]
    std::vector<float> losses_;         // [N] host
    struct Saved {
        float *res, *rstd1, *xn1, *qkv, *att, *lse, *h, *rstd2, *xn2, *gu, *act;
    };
    std::vector<Saved> saved_;          // per layer
    float *res_final_, *rstd_f_, *xf_, *logits_;
    float *dres_, *dxn_, *datt_, *dqkv_, *dgu_, *dact_;  // gradient scratch
    std::vector<float*> owned_;
    size_t act_floats_ = 0;
};

}  // namespace quintet
