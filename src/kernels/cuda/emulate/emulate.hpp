// Runs the device code of quintet's CUDA kernels (*_kernels.cuh) on CPU threads, so their logic
// (indexing, causal masking, tiling, __syncthreads placement, reduction order) is checked against
// the CPU backend on machines without a GPU. One std::thread per CUDA thread of a block, blocks
// one after another; __syncthreads is a std::barrier over the block; warp shuffles exchange
// through a per-warp buffer between two 32-way barriers; dynamic shared memory is a per-block
// buffer filled with NaN (a read before a write shows up in the results). It emulates only what
// those headers use (1-D blocks, full-warp shuffles). It says nothing about performance, the
// GPU memory model's corner cases or the launchers' CUDA API calls: only a GPU run does.
#pragma once
#define QUINTET_KERNEL_EMULATION 1

#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace quintet_emu {

struct Block {
    explicit Block(unsigned threads, size_t smem_bytes)
        : bar(std::ptrdiff_t(threads)),
          slots((threads + 31) / 32),
          smem(smem_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN()) {
        for (unsigned w = 0; w < (threads + 31) / 32; ++w)
            warp_bar.push_back(std::make_unique<std::barrier<>>(32));
    }
    std::barrier<> bar;
    std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
    std::vector<std::array<uint64_t, 32>> slots;
    std::vector<float> smem;
};

inline thread_local Block* tl_block = nullptr;

}  // namespace quintet_emu

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __launch_bounds__(...)
#define __shared__ static  // blocks run one at a time: a static is the block's shared array
#define QUINTET_DYNAMIC_SMEM(name) float* name = ::quintet_emu::tl_block->smem.data()

inline void __syncthreads() { quintet_emu::tl_block->bar.arrive_and_wait(); }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a wider type");
    quintet_emu::Block* b = quintet_emu::tl_block;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    std::memcpy(&b->slots[warp][lane], &v, sizeof(T));
    b->warp_bar[warp]->arrive_and_wait();
    T r;
    std::memcpy(&r, &b->slots[warp][lane ^ unsigned(lane_mask)], sizeof(T));
    b->warp_bar[warp]->arrive_and_wait();
    return r;
}

using std::max;
using std::min;

namespace quintet_emu {

// kernel<<<grid, block, smem>>>(...) becomes launch(grid, block, smem, [&] { kernel(...); }).
// One std::thread per CUDA thread of a block for the whole launch; they run the blocks in order,
// with a barrier between blocks (which also refills shared memory with NaN).
template <typename Body>
void launch(dim3 grid, dim3 block, size_t smem_bytes, Body body) {
    const unsigned threads = block.x;
    if (block.y != 1 || block.z != 1 || threads % 32 != 0)
        throw std::runtime_error("emulate: only 1-D blocks of whole warps");
    Block b(threads, smem_bytes);
    auto refill = [&b]() noexcept {
        std::fill(b.smem.begin(), b.smem.end(), std::numeric_limits<float>::quiet_NaN());
    };
    std::barrier<decltype(refill)> next_block(std::ptrdiff_t(threads), refill);
    std::vector<std::thread> ts;
    ts.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
            threadIdx = dim3(t);
            blockDim = block;
            gridDim = grid;
            tl_block = &b;
            for (unsigned z = 0; z < grid.z; ++z)
                for (unsigned y = 0; y < grid.y; ++y)
                    for (unsigned x = 0; x < grid.x; ++x) {
                        blockIdx = dim3(x, y, z);
                        body();
                        next_block.arrive_and_wait();
                    }
        });
    }
    for (auto& th : ts) th.join();
}

}  // namespace quintet_emu
