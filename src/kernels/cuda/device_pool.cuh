// Caching device allocator: blocks are rounded to a size class and kept on a free list per
// class when released, so a steady-state step reuses memory and never calls cudaMalloc.
// Releases are stream-ordered with respect to the backend's compute stream (the only stream
// kernels run on): a block released while kernels that use it are still queued is handed out
// again only to work queued after them. Not thread-safe (one host thread drives a backend).
#pragma once
#include <cstddef>
#include <unordered_map>
#include <vector>

namespace quintet::cuda {

class DevicePool {
public:
    DevicePool() = default;
    ~DevicePool();  // cudaFree of every block; the owner synchronises first
    DevicePool(const DevicePool&) = delete;
    DevicePool& operator=(const DevicePool&) = delete;

    void* alloc(size_t bytes);   // 256-byte aligned, not initialised
    void release(void* p);       // nullptr is a no-op; unknown pointers are an error
    void trim();                 // return every cached (free) block to the driver

    size_t device_mallocs() const { return mallocs_; }
    size_t bytes_reserved() const { return reserved_; }
    size_t bytes_in_use() const { return in_use_; }

    // 512 B granularity up to 1 MiB, then 2 MiB: few classes, little waste.
    static size_t size_class(size_t bytes);

private:
    std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
    std::unordered_map<void*, size_t> used_;               // block -> its size class
    size_t mallocs_ = 0, reserved_ = 0, in_use_ = 0;
};

}  // namespace quintet::cuda
