#include "moe_experts.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

namespace {
// A GEMM operand starting `off` elements into `m`.
Mat rows_of(Mat m, size_t off) { return {m.f ? m.f + off : nullptr, m.b ? m.b + off : nullptr}; }
}  // namespace

MoeExperts::MoeExperts(BlockContext& c, const ParamTable& table, const std::string& prefix, int e0, int El, int F)
    : c_(c), El_(El), F_(F) {
    for (int e = e0; e < e0 + El; ++e) {
        const std::string q = prefix + "experts." + std::to_string(e) + ".";
        wgu_.push_back(table.offset_of(q + "gate_proj.weight"));
        QUINTET_CHECK(table.offset_of(q + "up_proj.weight") == wgu_.back() + size_t(F_) * c_.d.C,
                      "expert gate_proj and up_proj are not adjacent in the arena");
        wd_.push_back(table.offset_of(q + "down_proj.weight"));
    }
    const BufferViews& sh = c_.shared();
    // fp32 without a split schedule: straight into the deferred buffer (under one, that may be
    // gate|up's own bytes, which the SwiGLU's backward reads).
    if (c_.bf16() || c_.split_bw) dgu_ = sh.f32("moe.dgu");
    dact_ = sh.f32("moe.dact");
    stage_ = sh.f32("moe.stage");
}

void MoeExperts::forward(const Rows& ex, const float* params, int rows, float* out) {
    auto role = c_.role("gemm.experts");
    const int C = c_.d.C;
    for (int j = 0; j < El_; ++j)
        if (ex.count[j] > 0) {
            const size_t o = size_t(ex.offset[j]);
            c_.mm(false, true, ex.count[j], 2 * F_, C, rows_of(c_.local(ex.x), o * C), C,
                  c_.weight(params + wgu_[size_t(j)]), C, 0.0f, ex.gu + o * 2 * F_, 2 * F_);
        }
    float* act = c_.produce(ex.act, stage_);
    c_.be.swiglu_forward(act, ex.gu, rows, F_);
    c_.keep(ex.act, act, size_t(rows) * F_);
    for (int j = 0; j < El_; ++j)
        if (ex.count[j] > 0) {
            const size_t o = size_t(ex.offset[j]);
            c_.mm(false, true, ex.count[j], C, F_, rows_of(c_.local(ex.act), o * F_), F_,
                  c_.weight(params + wd_[size_t(j)]), F_, 0.0f, out + o * C, C);
        }
}

void MoeExperts::backward_input(const Rows& ex, const float* params, int rows, const float* dy, float* dx,
                                const Act& wdy, const Act& wdgu) {
    auto role = c_.role("gemm.experts");
    const int C = c_.d.C;
    const Mat Dy = c_.save(wdy, dy, size_t(rows) * C);
    for (int j = 0; j < El_; ++j)
        if (ex.count[j] > 0) {
            const int n = ex.count[j];
            const size_t o = size_t(ex.offset[j]);
            c_.mm(false, false, n, F_, C, rows_of(Dy, o * C), C, c_.weight(params + wd_[size_t(j)]), F_, 0.0f,
                  dact_ + o * F_, F_);
        }
    float* dgu = c_.split_bw ? dgu_ : c_.produce(wdgu, dgu_);
    c_.be.swiglu_backward(dgu, dact_, ex.gu, rows, F_);
    const Mat Dgu = c_.save(wdgu, dgu, size_t(rows) * 2 * F_);
    for (int j = 0; j < El_; ++j)
        if (ex.count[j] > 0) {
            const int n = ex.count[j];
            const size_t o = size_t(ex.offset[j]);
            c_.mm(false, false, n, C, 2 * F_, rows_of(Dgu, o * 2 * F_), 2 * F_, c_.weight(params + wgu_[size_t(j)]),
                  C, 0.0f, dx + o * C, C);
        }
}

void MoeExperts::backward_weight(const Rows& ex, float* grads, const Act& wdy, const Act& wdgu) {
    auto role = c_.role("gemm.experts");
    const int C = c_.d.C;
    const Mat Dy = c_.deferred(wdy), Dgu = c_.deferred(wdgu);
    for (int j = 0; j < El_; ++j)
        if (ex.count[j] > 0) {
            const int n = ex.count[j];
            const size_t o = size_t(ex.offset[j]);
            c_.mm(true, false, C, F_, n, rows_of(Dy, o * C), C, rows_of(c_.local(ex.act), o * F_), F_, 1.0f,
                  grads + wd_[size_t(j)], F_);
            c_.mm(true, false, 2 * F_, C, n, rows_of(Dgu, o * 2 * F_), 2 * F_, rows_of(c_.local(ex.x), o * C), C, 1.0f,
                  grads + wgu_[size_t(j)], C);
        }
}

void MoeExperts::done(float* grads) const {
    const size_t C = size_t(c_.d.C);
    for (int j = 0; j < El_; ++j) {
        c_.done(grads + wd_[size_t(j)], C * F_);
        c_.done(grads + wgu_[size_t(j)], size_t(2) * F_ * C);
    }
}

}  // namespace quintet
