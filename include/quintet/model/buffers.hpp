// Activation memory, declared like parameters (docs/architecture.md, "Activation buffers"):
// every block kind states, beside its parameter specs, what it keeps per microbatch in flight
// (saved), what the blocks of a chunk share (scratch, one buffer per name, the largest asked
// for), the widest GEMM operand it rounds to bf16, and what it needs of the context ring and
// the expert exchange. A chunk lays these lists out -- one arena per slot, one workspace, one
// shared arena -- and hands each block named views; the planner (perf/planner.cpp) lays out the
// same lists, so its activation and buffer bytes are the trainer's to the byte.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/kernels/backend.hpp"

namespace quintet {

// train.recompute: what the backward recomputes instead of keeping from the forward.
//   selective: the attention core (its output and log-sum-exp), from the kept q|k|v;
//   full:      whole layers, from their inputs (one layer's activations are kept, shared).
enum class Recompute { none, selective, full };

// A saved input of a linear layer: fp32 (f) or, in bf16 mode, bf16 only (b).
struct Act {
    float* f = nullptr;
    bf16_bits* b = nullptr;
};
// A GEMM operand: its fp32 form (fp32 mode) or its bf16 form (bf16 mode).
struct Mat {
    const float* f = nullptr;
    const bf16_bits* b = nullptr;
};

// The element type of a buffer; `act` is the chunk's activation precision (bf16 when
// train.precision = bf16, else fp32).
enum class Elem : uint8_t { f32, bf16, i32, act };

// A buffer's name and element type, shared by its declaration and its use: a kind names each of
// its buffers once (`constexpr F32Buf kLse{"attention.lse"};`), declares it with that constant
// and takes its view with it, so a misspelt name or another element type does not compile.
template <Elem E>
struct Buf {
    std::string_view name;
};
using F32Buf = Buf<Elem::f32>;
using Bf16Buf = Buf<Elem::bf16>;
using I32Buf = Buf<Elem::i32>;
using ActBuf = Buf<Elem::act>;
// What a view of each element type is.
template <Elem E> struct BufView;
template <> struct BufView<Elem::f32> { using type = float*; };
template <> struct BufView<Elem::bf16> { using type = bf16_bits*; };
template <> struct BufView<Elem::i32> { using type = int32_t*; };
template <> struct BufView<Elem::act> { using type = Act; };

struct BufferSpec {
    std::string name;
    size_t n = 0;  // elements
    Elem elem = Elem::f32;
    // A saved buffer that only B reads (W never does): once B has read it, its bytes are free
    // until the slot's next forward, and under a split schedule hold what B keeps for W.
    bool b_only = false;
    // A deferred buffer: the b_only saved buffers of its layer it may live in, in order of
    // preference, provided B writes it only after it has read them (it lives in its own bytes
    // when none has room). This is what keeps a zero-bubble slot near 1F1B's size.
    std::vector<std::string> over;
};

// What the buffers depend on: one chunk of one rank.
struct BufferShape {
    int B = 1;       // samples per microbatch
    int T = 1;       // rows of each sample on this rank (seq_len / cp)
    int N = 1;       // B * T
    int Nr = 1;      // rows of the residual stream (N / tp under sequence parallelism)
    bool bf16 = false;
    bool sp = false;  // sequence parallelism (tp > 1)
    Recompute recompute = Recompute::none;
    int cp = 1;
    bool mla_latent = false;  // parallel.cp_mla_kv = latent (cp > 1)
    int ep = 1;
    int max_positions = 1;    // RoPE tables cover positions [0, max_positions)
    // The schedule splits each backward into B (the input's gradient) and W (the weights'),
    // and W may run later (parallel.schedule = zb_h1, zbv): what W needs of B is kept per slot.
    bool split_bw = false;
};

// One block's (or the chunk's own) declarations.
struct BufferDecl {
    std::vector<BufferSpec> saved;   // per microbatch in flight
    std::vector<BufferSpec> shared;  // one per chunk and name
    // What the weight-gradient part of the backward (W) needs of its input part (B): the output
    // gradients of the linear layers, as GEMM operands. Per microbatch in flight when the
    // schedule runs W later (BufferShape::split_bw; then even under full recomputation), else
    // shared scratch (W follows B at once).
    std::vector<BufferSpec> deferred;
    size_t operand = 0;              // bf16 staging of GEMM operands, elements (bf16 mode only)
    // The context ring (parallel/context_parallel): floats of one K|V block, of a partial
    // output and of its log-sum-exp. The expert exchange: floats of its staging.
    size_t ring_kv = 0, ring_out = 0, ring_lse = 0, exchange = 0;

    template <Elem E>
    void per_slot(Buf<E> b, size_t n, bool b_only = false) {
        saved.push_back({std::string(b.name), n, E, b_only, {}});
    }
    template <Elem E>
    void scratch(Buf<E> b, size_t n) {
        shared.push_back({std::string(b.name), n, E, false, {}});
    }
    // `over`: the b_only saved buffers of the layer it may live in (BufferSpec::over).
    template <Elem E>
    void defer(Buf<E> b, size_t n, const std::vector<std::string_view>& over = {}) {
        deferred.push_back({std::string(b.name), n, E, false, {over.begin(), over.end()}});
    }
    void operands(size_t n) { operand = n > operand ? n : operand; }
};

size_t elem_bytes(Elem e, bool bf16);
// Every buffer starts on a 64-byte boundary (a cache line; the widest vector load).
constexpr size_t kBufferAlign = 64;
// Bytes of `list` laid out in order.
size_t layout_bytes(const std::vector<BufferSpec>& list, bool bf16);
// `add` merged into `into` by name, keeping the larger size of a name (shared scratch).
void merge_shared(std::vector<BufferSpec>& into, const std::vector<BufferSpec>& add, bool bf16);

// A deferred buffer placed inside a b_only saved buffer of its layer, `offset` bytes in.
struct PlacedBuffer {
    BufferSpec spec;
    std::string target;
    size_t offset = 0;
};
// Splits `deferred` into those that fit, in declaration order, into the b_only buffers of
// `saved` their `over` names (packed one after the other, each 64-byte aligned; a run of
// consecutive b_only buffers is one region, named by its first -- so a run must belong to one
// block, all of it read by that block's B before its deferred buffers are written) and the rest.
void place_deferred(const std::vector<BufferSpec>& saved, const std::vector<BufferSpec>& deferred, bool bf16,
                    std::vector<PlacedBuffer>& placed, std::vector<BufferSpec>& rest);

// Named pointers into one laid-out region (its base at least 64-byte aligned).
class BufferViews {
public:
    BufferViews() = default;
    BufferViews(const std::vector<BufferSpec>& list, void* base, bool bf16);
    // The view of a declared buffer (fails when it was not declared with this type).
    template <Elem E>
    typename BufView<E>::type operator[](Buf<E> b) const {
        void* p = find(b.name, E).p;
        if constexpr (E == Elem::act) return bf16_ ? Act{nullptr, static_cast<bf16_bits*>(p)} : Act{static_cast<float*>(p), nullptr};
        else return static_cast<typename BufView<E>::type>(p);
    }
    bool has(std::string_view name) const;
    void* address(std::string_view name) const;
    // A view at a given place (a deferred buffer living in a saved one).
    void add(const BufferSpec& spec, void* p) { views_.push_back({spec.name, p, spec.elem}); }

private:
    struct View {
        std::string name;
        void* p;
        Elem elem;
    };
    const View& find(std::string_view name, Elem elem) const;
    std::vector<View> views_;
    bool bf16_ = false;
};

}  // namespace quintet
