// Caching device allocator (see device_pool.cuh).
#include "cuda_check.cuh"
#include "device_pool.cuh"

namespace quintet::cuda {

size_t DevicePool::size_class(size_t bytes) {
    constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kSmallLimit = size_t(1) << 20;
    if (bytes == 0) bytes = 1;
    if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
    return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* DevicePool::alloc(size_t bytes) {
    const size_t cls = size_class(bytes);
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        used_.emplace(p, cls);
        in_use_ += cls;
        return p;
    }
    void* p = nullptr;
    cudaError_t rc = cudaMalloc(&p, cls);
    if (rc == cudaErrorMemoryAllocation) {  // give the cached blocks back and try once more
        (void)cudaGetLastError();
        trim();
        rc = cudaMalloc(&p, cls);
    }
    if (rc != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        rank_fail(std::string("cudaMalloc of ") + std::to_string(cls) + " bytes failed: " +
                  cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc) + " (device free " +
                  std::to_string(free_b >> 20) + " MiB of " + std::to_string(total_b >> 20) +
                  " MiB; this pool holds " + std::to_string(reserved_ >> 20) + " MiB)");
    }
    ++mallocs_;
    reserved_ += cls;
    in_use_ += cls;
    used_.emplace(p, cls);
    return p;
}

void DevicePool::release(void* p) {
    if (p == nullptr) return;
    auto it = used_.find(p);
    QUINTET_CHECK(it != used_.end(), "DevicePool::release of a pointer this pool did not hand out");
    const size_t cls = it->second;
    used_.erase(it);
    in_use_ -= cls;
    free_[cls].push_back(p);
}

void DevicePool::trim() {
    for (auto& [cls, blocks] : free_) {
        for (void* p : blocks) {
            QUINTET_CUDA_WARN(cudaFree(p));
            reserved_ -= cls;
        }
        blocks.clear();
    }
}

DevicePool::~DevicePool() {
    trim();
    for (auto& [p, cls] : used_) {
        QUINTET_CUDA_WARN(cudaFree(p));
        reserved_ -= cls;
    }
    used_.clear();
}

}  // namespace quintet::cuda
