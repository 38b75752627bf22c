// The compute backend: a narrow interface of the ops the model needs, on memory the backend
// owns (host memory for CPU, device memory for CUDA). Model code calls these, never a BLAS.
// The CPU backend (OpenBLAS + OpenMP) is the reference every other backend is tested against.
//
// Dimension letters (docs/architecture.md): N = B*T tokens of a microbatch, C = d_model,
// NH/NKV query/key-value heads, Dqk/Dv head dims, F ffn hidden width, V vocabulary.
// Conventions (llm.c style): outputs first, then saved values, then inputs, then weights, then
// dims. Parameter gradients accumulate (+=); activation gradients overwrite (=) unless the
// function says it accumulates (the residual stream).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace quintet {

enum class Device { cpu, cuda };

// bf16 values are stored as their 16-bit patterns (the upper half of the fp32 pattern).
using bf16_bits = uint16_t;

// Where RoPE rotates inside each row (Backend::rope_forward).
struct RopeArgs {
    int N = 0;            // rows
    int n_heads = 0;      // heads rotated per row
    int head_stride = 0;  // columns from one head to the next
    int col0 = 0;         // first rotated column inside a head
    int dim = 0;          // rotated columns per head (even); the tables have dim/2 columns
    int row_stride = 0;   // columns per row
};

// The shape of one attention call (Backend::attention_forward).
struct AttentionArgs {
    int B = 0, Tq = 0, Tk = 0;  // sequences; query rows and key rows per sequence
    int NH = 0, NKV = 0;        // query heads; kv heads (NH % NKV == 0: GQA groups)
    int Dqk = 0, Dv = 0;        // head dims of q.k and of v (and the output)
    int q_stride = 0, k_stride = 0, v_stride = 0, o_stride = 0;  // row strides in floats
    float scale = 1.0f;         // softmax scale (MLA under YaRN folds mscale^2 in here)
    bool causal = true;
    const int32_t* q_pos = nullptr;  // [B*Tq] global positions (backend memory, required)
    const int32_t* k_pos = nullptr;  // [B*Tk]
    const int32_t* q_doc = nullptr;  // [B*Tq] document ids, or null: no document mask
    const int32_t* k_doc = nullptr;  // [B*Tk] (both or neither)
};

// How the MoE router scores, chooses and weighs experts (docs/math.md §9; model/moe_router.hpp
// makes it from the [moe] keys). Plain data, passed to the device kernels by value.
struct MoeRouteRule {
    enum Method : int { greedy = 0, group_max = 1, group_top2 = 2 };  // greedy | group_limited_greedy | noaux_tc
    bool sigmoid = false;  // scores: sigmoid (else softmax)
    int method = greedy;
    int groups = 1, group_top_k = 1;  // groups <= 64
    bool norm = true;      // the chosen scores renormalised to sum 1
    float scale = 1.0f;    // routed scaling factor
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual Device device() const = 0;
    virtual std::string name() const = 0;
    virtual int threads() const = 0;

    // ---- memory (elements are float unless named otherwise) ----
    virtual float* alloc(size_t n) = 0;          // zero-filled
    virtual void release(float* p) = 0;
    virtual void zero(float* p, size_t n) = 0;
    virtual void copy(float* dst, const float* src, size_t n) = 0;          // same device
    virtual void to_host(float* host, const float* src, size_t n) = 0;
    virtual void from_host(float* dst, const float* host, size_t n) = 0;
    virtual int32_t* alloc_i32(size_t n) = 0;
    virtual void release_i32(int32_t* p) = 0;
    virtual void from_host_i32(int32_t* dst, const int32_t* host, size_t n) = 0;
    virtual void to_host_i32(int32_t* host, const int32_t* src, size_t n) = 0;

    // ---- dense algebra, row-major ----
    // C[M,N] = alpha * op(A) op(B) + beta * C; op = transpose when the flag is set.
    virtual void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                      int lda, const float* B, int ldb, float beta, float* C, int ldc) = 0;

    // ---- bf16 mixed precision (train.precision = bf16; docs/cuda.md "bf16") ----
    virtual bf16_bits* alloc_bf16(size_t n) = 0;  // zero-filled
    virtual void release_bf16(bf16_bits* p) = 0;
    // dst[n] = round-to-nearest-even(src[n]) (NaN stays NaN); and the exact widening back.
    virtual void to_bf16(bf16_bits* dst, const float* src, size_t n) = 0;
    virtual void from_bf16(float* dst, const bf16_bits* src, size_t n) = 0;
    // C[M,N] = alpha * op(A) op(B) + beta * C like gemm, with A and B bf16 and C fp32. Products
    // of two bf16 values are exact in fp32, so any backend differs only in summation order.
    virtual void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                           const bf16_bits* A, int lda, const bf16_bits* B, int ldb, float beta,
                           float* C, int ldc) = 0;

    // ---- element-wise and row-wise kernels ----
    // out[N,C] = wte[ids[n], :]; ids[n] < 0 (a token of another rank's vocabulary shard) gives 0
    virtual void embedding_forward(float* out, const int32_t* ids, const float* wte, int N, int C) = 0;
    // dwte[ids[n], :] += dout[n, :] for ids[n] >= 0 (deterministic: rows of one id summed in token order)
    virtual void embedding_backward(float* dwte, const float* dout, const int32_t* ids, int N, int C,
                                    int V) = 0;
    // out[N,C] = inp * rstd * w ; rstd[N] saved
    virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                                 int C, float eps) = 0;
    // dinp[N,C] += d(out)/d(inp)^T dout (accumulates: the residual stream); dw[C] += ...
    // Either part may be skipped with a null pointer (the split backward: dinp in B, dw in W);
    // w may be null when dinp is. Each part's bits do not depend on the other's presence.
    virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                  const float* w, const float* rstd, int N, int C) = 0;
    // RoPE (rotate-half, docs/math.md §3) in place on rows x[N, row_stride]: in each of heads
    // [0, n_heads) (head h starts at column h*head_stride) the columns [col0, col0 + dim) are
    // split in halves and rotated by the angle of position pos[n] (backend int32 memory [N]),
    // read from tables cos/sin [positions, dim/2]. MLA rotates a sub-range of each head.
    virtual void rope_forward(float* x, const float* cos, const float* sin, const int32_t* pos,
                              const RopeArgs& a) = 0;
    // The transpose rotation, in place on dx.
    virtual void rope_backward(float* dx, const float* cos, const float* sin, const int32_t* pos,
                               const RopeArgs& a) = 0;

    // ---- attention: one general operation (derivation in docs/math.md §5) ----
    // Tiled with an online softmax (never a Tq x Tk matrix). Query head h of query row
    // (b, t) is at q[(b*Tq + t)*q_stride + h*Dqk]; kv head g = h / (NH/NKV) of key row (b, s) at
    // k[(b*Tk + s)*k_stride + g*Dqk] and v[(b*Tk + s)*v_stride + g*Dv]. Key s is visible to
    // query t when (not causal or k_pos <= q_pos) and (no document ids or k_doc == q_doc).
    // out[(b*Tq + t)*o_stride + h*Dv]; lse[B, NH, Tq] = log-sum-exp of the scaled logits (a row
    // that sees no key gets out = 0, lse = -inf). Fully masked tiles are skipped.
    virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                   const float* v, const AttentionArgs& a) = 0;
    // (out, lse) <- the softmax over the union of two disjoint key sets, from (out, lse) over
    // one and (out2, lse2) over the other (same layout as attention_forward's outputs).
    virtual void attention_merge(float* out, float* lse, const float* out2, const float* lse2,
                                 const AttentionArgs& a) = 0;
    // From the final out and lse (which may span more keys than k, v: ring attention), dq, dk,
    // dv ACCUMULATE (+=) the gradients of these keys' share; laid out like q, k, v (same
    // strides); dout like out.
    virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                    const float* out, const float* lse, const float* q,
                                    const float* k, const float* v, const AttentionArgs& a) = 0;
    // gu[N, 2F] = [gate | up]; out[N,F] = silu(gate) * up
    virtual void swiglu_forward(float* out, const float* gu, int N, int F) = 0;
    // dgu[N, 2F] from dout[N,F] (overwrites)
    virtual void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) = 0;
    // a[n] += b[n]
    virtual void add_inplace(float* a, const float* b, size_t n) = 0;
    // dst[r*ld_dst + c] = src[r*ld_src + c] (accumulate: +=) for r < rows, c < cols: packing
    // strided columns (K|V blocks of the context-parallel ring) and adding them back.
    virtual void copy_2d(float* dst, size_t ld_dst, const float* src, size_t ld_src, size_t rows,
                         size_t cols, bool accumulate) = 0;
    // ---- Mixture of Experts (docs/math.md §9) ----
    // The router, per row of logits[N,E]: scores s = softmax(logits) or sigmoid(logits) into
    // probs; the choice scores c = s + bias (bias[E] or null); under a group method the experts
    // in `groups` equal groups, of which the group_top_k of best group score are kept
    // (group_limited_greedy: the group's largest c; noaux_tc: the sum of its two largest c); the
    // k kept experts of largest c (ties to the lower index), in descending order, into
    // expert[N,k] (backend int32 memory); their s into weight[N,k], renormalised to sum 1 when
    // `norm`, times `scale`.
    // dlogits[N,E] (overwritten) from dweight[N,k]; daux[E] (or null) is added to every row's
    // dL/d(the balance loss's probabilities): the scores themselves under softmax, the scores
    // normalised to sum 1 under sigmoid.
    virtual void moe_route(float* probs, int32_t* expert, float* weight, const float* logits,
                           const float* bias, int N, int E, int k, const MoeRouteRule& rule) = 0;
    virtual void moe_route_backward(float* dlogits, const float* dweight, const float* probs,
                                    const int32_t* expert, const float* weight, const float* daux,
                                    int N, int E, int k, const MoeRouteRule& rule) = 0;
    // dst[r, :] = src[idx[r], :] for r < n, rows of C floats.
    virtual void gather_rows(float* dst, const float* src, const int32_t* idx, int n, int C) = 0;
    // out[t, :] += sum over j < k, in order, of weight[t,j] * y[slot[t,j], :] (weight null: 1).
    virtual void moe_combine(float* out, const float* y, const int32_t* slot, const float* weight,
                             int N, int k, int C) = 0;
    // dy[slot[t,j], :] = weight[t,j] * dout[t, :] (every slot row written once), and
    // dweight[t,j] = dout[t, :] . y[slot[t,j], :].
    virtual void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y,
                                      const int32_t* slot, const float* weight, int N, int k,
                                      int C) = 0;

    // Fused softmax cross-entropy: logits[N,V] are replaced by grad_scale * (softmax - onehot);
    // losses[N] (host memory) gets each row's -log p(target). Targets < 0 are ignored (loss 0, grad 0).
    virtual void xent_forward_backward(float* logits, float* losses, const int32_t* targets, int N,
                                       int V, float grad_scale) = 0;
    // Loss only (evaluation): logits untouched.
    virtual void xent_forward(float* losses, const float* logits, const int32_t* targets, int N,
                              int V) = 0;

    // Vocab-parallel cross-entropy, step 1 (docs/parallelism.md): per row of this rank's logit
    // shard, its max, sum of exp(z - max) and the target's logit (0 when targets[n] < 0, i.e. the
    // target lives on another rank). Outputs are host arrays [N].
    virtual void xent_local_stats(float* rowmax, float* rowsum, float* target_logit,
                                  const float* logits, const int32_t* targets, int N, int V);
    // Step 2, after the stats are combined over tp: logits[N,V] are replaced by
    // grad_scale * (exp(z - gmax) / gsum - onehot(targets >= 0)). gmax, gsum: host arrays [N].
    virtual void xent_grad_from_stats(float* logits, const float* gmax, const float* gsum,
                                      const int32_t* targets, int N, int V, float grad_scale);

    // ---- optimizer ----
    // Sum of squares of x[0,n) in double, deterministic for a given thread count.
    virtual double sumsq(const float* x, size_t n) = 0;
    virtual void scale(float* x, size_t n, float s) = 0;
    // PyTorch AdamW on n elements: p -= lr*wd*p; m,v moments; bias corrections bc1, bc2 given.
    virtual void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, float bc1, float bc2) = 0;
};

// threads = 0: OMP_NUM_THREADS, else all cores.
std::unique_ptr<Backend> make_cpu_backend(int threads);
// Throws ConfigError naming train.device when built without CUDA or when no GPU is present.
std::unique_ptr<Backend> make_cuda_backend(int device_index);
bool cuda_available();

// Measured single-precision GEMM rate of the CPU backend (GFLOP/s) on this machine.
double cpu_measure_sgemm_gflops(Backend& be, int size = 1024, int repeats = 4);
// What bounds a decoder step on the CPU (quintet peak --memory): the rate (GB/s) at which the
// backend's threads read a `mib` MiB array, and at which a product of `rows` rows with an
// [out, in] weight of that size reads the weight; medians of `repeats`.
double cpu_measure_read_gbs(Backend& be, int mib = 256, int repeats = 7);
double cpu_measure_rows_gbs(Backend& be, int rows, int mib = 256, int repeats = 7);

// The fp32 FMA peak of `threads` cores (GFLOP/s), measured with a loop of independent FMAs in
// the widest vector ISA the CPU reports at run time (kernels/cpu/cpu_fma_peak.cpp).
struct FmaPeak {
    double gflops = 0;
    int threads = 1;
    const char* isa = "scalar";  // "avx512f", "avx2+fma" or "scalar"
};
FmaPeak cpu_measure_fma_peak(int threads);

// The most fp32 FMA work one core of this CPU can do by its own figures: the lanes of the widest
// vector ISA it reports (CPUID: 16 for AVX-512, 8 for AVX2+FMA, 4 for SSE) x 2 FMA units (the most
// any x86 core issues per cycle) x 2 flops x the highest clock the kernel reports -- cpufreq's
// cpuinfo_max_freq or CPUID leaf 0x16's maximum (times 1.3: some drivers report the clock without
// boost), else the brand string's or /proc/cpuinfo's clock (a base or current clock, as a
// virtual machine shows it: times 2 for turbo). An upper bound, not an estimate: a measurement
// above it is an error (a clock that jumped), and a cached figure above it is not used.
struct FmaCeiling {
    double gflops_per_core = 0;  // 0: no clock is reported (then nothing is bounded)
    double ghz = 0;              // the clock as reported
    double allowance = 1;        // the factor on it (boost or turbo not included in the report)
    int lanes = 1, fma_units = 2;
    std::string clock_from;      // where the clock was read
    std::string describe() const;  // "2 FMA units x 16 lanes x 2 flops x 2.30 GHz (/proc/cpuinfo) x 2 (turbo)"
};
FmaCeiling cpu_fma_ceiling();

}  // namespace quintet
