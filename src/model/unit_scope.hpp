// The ZeRO scope of the decoder's walks (private to model/; parallel/param_units.hpp is the seam).
#pragma once
#include "quintet/model/linear.hpp"
#include "quintet/parallel/param_units.hpp"

namespace quintet {

// The parameters and gradient window of one unit (parallel.zero >= 2; parallel/param_units.hpp)
// for one step of a walk: its parameters gathered, or waited for, when the scope opens (bf16: the
// GEMMs read its copy), released when it ends, and then its gradients reduced if asked. Without
// units: the whole arenas, and nothing else happens.
class UnitScope {
public:
    UnitScope(ParamUnits* units, LinearContext& lin, int unit, const float* params_, float* grads, bool use_params)
        : params(params_), units_(units), unit_(unit), grads_(grads) {
        if (!units_ || !use_params) return;
        const UnitParams p = units_->params(unit_);
        if (lin.bf16()) lin.set_bf16_weights(p.f, p.b);
        params = p.f;
        held_ = true;
    }
    ~UnitScope() {
        release();
        if (reduce_ && units_ && unit_ >= 0) units_->reduce(unit_);
    }
    UnitScope(const UnitScope&) = delete;
    UnitScope& operator=(const UnitScope&) = delete;
    void prefetch(int next) {
        if (units_ && next >= 0) units_->prefetch(next);
    }
    void release() {
        if (held_ && unit_ >= 0) units_->release(unit_);
        held_ = false;
    }
    float* grads() { return units_ ? units_->grads(unit_) : grads_; }  // base pointer
    void reduce_at_end() { reduce_ = true; }
    const float* params;  // base pointer

private:
    ParamUnits* units_;
    int unit_;
    float* grads_;
    bool held_ = false, reduce_ = false;
};

}  // namespace quintet
