// Token embedding on the GPU. ids[n] < 0 marks a token of another rank's vocabulary shard: a
// zero row forward, nothing backward. Backward is deterministic without atomics: a stable radix
// sort of (id, token) pairs groups the tokens of each id in token order, and one block per run
// of equal ids adds those rows onto dwte[id] in that order (the CPU backend's order exactly).
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "embedding_kernels.cuh"
#include "cuda_check.cuh"
#include "kernels.cuh"

namespace quintet::cuda {

using namespace kern;

namespace {

// Bits that hold every key in [0, V] (V itself is the "not in this shard" key).
int key_bits(int V) {
    int bits = 1;
    while (bits < 32 && (int64_t(1) << bits) <= int64_t(V)) ++bits;
    return bits;
}

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

size_t cub_temp_bytes(int N, int V) {
    size_t temp = 0;
    QUINTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, temp, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), N, 0,
        key_bits(V)));
    return temp;
}

}  // namespace

void embedding_forward(cudaStream_t st, float* out, const int32_t* ids, const float* wte, int N,
                       int C) {
    if (N <= 0 || C <= 0) return;
    embedding_forward_kernel<<<N, kThreads, 0, st>>>(out, ids, wte, C);
    QUINTET_CUDA_LAUNCHED();
}

size_t embedding_backward_scratch_bytes(int N, int V) {
    // keys in, token indices in, sorted keys, sorted token indices, CUB temp storage
    return 4 * align256(size_t(N) * sizeof(uint32_t)) + align256(cub_temp_bytes(N, V));
}

void embedding_backward(cudaStream_t st, float* dwte, const float* dout, const int32_t* ids,
                        int N, int C, int V, void* scratch, size_t scratch_bytes) {
    if (N <= 0 || C <= 0) return;
    char* base = static_cast<char*>(scratch);
    const size_t a = align256(size_t(N) * sizeof(uint32_t));
    auto* keys_in = reinterpret_cast<uint32_t*>(base);
    auto* toks_in = reinterpret_cast<uint32_t*>(base + a);
    auto* keys_out = reinterpret_cast<uint32_t*>(base + 2 * a);
    auto* toks_out = reinterpret_cast<uint32_t*>(base + 3 * a);
    void* temp = base + 4 * a;
    size_t temp_bytes = cub_temp_bytes(N, V);
    QUINTET_CHECK(4 * a + temp_bytes <= scratch_bytes, "embedding_backward: scratch too small");
    embedding_keys_kernel<<<grid_for(size_t(N)), kThreads, 0, st>>>(keys_in, toks_in, ids, N, V);
    QUINTET_CUDA_LAUNCHED();
    // Keys in [0, V] sorted on their low key_bits(V) bits. The sort is stable, so the tokens of
    // one id stay in increasing token order.
    QUINTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        temp, temp_bytes, static_cast<const uint32_t*>(keys_in), keys_out,
        static_cast<const uint32_t*>(toks_in), toks_out, N, 0, key_bits(V), st));
    embedding_backward_runs_kernel<<<N, kThreads, 0, st>>>(dwte, dout, keys_out, toks_out, N, C,
                                                            V);
    QUINTET_CUDA_LAUNCHED();
}

}  // namespace quintet::cuda
