#include "quintet/model/rms_norm.hpp"

#include "quintet/core/profile.hpp"

namespace quintet {

RmsNormLayer::RmsNormLayer(LinearContext& c, const ParamTable& t, const std::string& tensor, int width, float eps,
                           std::string_view id)
    : c_(c), w_(t.offset_of(tensor)), width_(width), eps_(eps), dy_name_("w." + std::string(id) + ".dy") {}

void RmsNormLayer::declare_grad(BufferDecl& out, std::string_view id, size_t rows, size_t width,
                                const std::vector<std::string_view>& over) {
    const std::string name = "w." + std::string(id) + ".dy";
    out.defer(F32Buf{name}, rows * width, over);
}

void RmsNormLayer::add_w_slot(const BufferViews& w) { dy_.push_back(w[F32Buf{dy_name_}]); }

void RmsNormLayer::forward(float* out, float* rstd, const float* x, const float* params, int rows) const {
    QUINTET_PROFILE("rmsnorm");
    c_.be.rmsnorm_forward(out, rstd, x, params + w_, rows, width_, eps_);
}

void RmsNormLayer::forward(const Act& out, float* staging, float* rstd, const float* x, const float* params,
                           int rows) const {
    QUINTET_PROFILE("rmsnorm");
    float* o = c_.produce(out, staging);
    c_.be.rmsnorm_forward(o, rstd, x, params + w_, rows, width_, eps_);
    c_.keep(out, o, size_t(rows) * width_);
}

void RmsNormLayer::backward(float* dx, float* grads, const float* dy, const float* x, const float* params,
                            const float* rstd, int rows) {
    {
        QUINTET_PROFILE("rmsnorm");
        c_.be.rmsnorm_backward(dx, grads + w_, dy, x, params + w_, rstd, rows, width_);
    }
    c_.done(grads + w_, size_t(width_));
}

void RmsNormLayer::backward_input(int wslot, float* dx, const float* dy, const float* x, const float* params,
                                  const float* rstd, int rows) {
    QUINTET_PROFILE("rmsnorm");
    float* kept = dy_[size_t(wslot)];
    if (dy != kept) c_.be.copy(kept, dy, size_t(rows) * width_);
    c_.be.rmsnorm_backward(dx, nullptr, kept, x, params + w_, rstd, rows, width_);
}

void RmsNormLayer::backward_weight(int wslot, float* grads, const float* x, const float* rstd, int rows) {
    {
        QUINTET_PROFILE("rmsnorm");
        c_.be.rmsnorm_backward(nullptr, grads + w_, dy_[size_t(wslot)], x, nullptr, rstd, rows, width_);
    }
    c_.done(grads + w_, size_t(width_));
}

}  // namespace quintet
