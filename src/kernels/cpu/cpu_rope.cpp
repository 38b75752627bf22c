// RoPE on the CPU (the twin of src/kernels/cuda/rope.cu): the rotate-half convention of
// docs/math.md §3, in place, on the rotated columns [col0, col0 + dim) of each head of each
// token, at the token's position. The backward is the rotation by the opposite angle (the
// sine negated). YaRN lives in the cos/sin tables (src/model/rope.cpp), not here.
#include "cpu_backend.hpp"

namespace quintet::cpu {

namespace {

// sign = +1: rotate by the position's angles (forward); -1: by their negatives (backward).
void rope_apply(float* x, const float* cs, const float* sn, const int32_t* pos, const RopeArgs& a,
                float sign) {
    const int half = a.dim / 2;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < a.N; ++n) {
        const float* c = cs + size_t(pos[n]) * half;
        const float* s = sn + size_t(pos[n]) * half;
        for (int h = 0; h < a.n_heads; ++h) {
            float* x1 = x + size_t(n) * a.row_stride + size_t(h) * a.head_stride + a.col0;
            float* x2 = x1 + half;
#pragma omp simd
            for (int i = 0; i < half; ++i) {
                float p = x1[i], q = x2[i];
                float si = sign * s[i];
                x1[i] = p * c[i] - q * si;
                x2[i] = q * c[i] + p * si;
            }
        }
    }
}

}  // namespace

void CpuBackend::rope_forward(float* x, const float* cs, const float* sn, const int32_t* pos,
                              const RopeArgs& a) {
    rope_apply(x, cs, sn, pos, a, 1.0f);
}
void CpuBackend::rope_backward(float* dx, const float* cs, const float* sn, const int32_t* pos,
                               const RopeArgs& a) {
    rope_apply(dx, cs, sn, pos, a, -1.0f);
}

}  // namespace quintet::cpu
