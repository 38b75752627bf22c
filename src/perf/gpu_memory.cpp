#include "quintet/perf/gpu_memory.hpp"

#include <algorithm>
#include <cmath>

namespace quintet {

double gpu_list_bytes(const std::vector<BufferSpec>& list, bool bf16) {
    double b = 0;
    for (const auto& s : list) b += double(s.n) * (s.elem == Elem::i32 ? 4.0 : s.elem == Elem::bf16 || bf16 ? 2.0 : 4.0);
    return b;
}

MemoryBytes gpu_memory(const GpuMemoryInput& in) {
    MemoryBytes m;
    const double wb = in.bf16 ? 2 : 4;
    const double P = in.params.sum(), Pd = in.params.r[size_t(int(Replicas::dense))],
                 Pe = in.params.r[size_t(int(Replicas::expert))];
    m.params = P * wb;
    // Gradients: accumulated (and reduced) in fp32, one per trainable parameter.
    m.grads = in.params.trainable() * 4;
    // fp32 master weights (bf16 runs) and AdamW's two moments; ZeRO-1 keeps this rank's shard.
    const double per = (in.bf16 ? 4 : 0) + 8;
    const double state = in.zero ? std::ceil(Pd / in.dense_group) + std::ceil(Pe / in.expert_group) : Pd + Pe;
    m.optimizer = per * state;
    // Muon keeps one fp32 momentum for its matrices instead of AdamW's two moments (its share of
    // the shard under ZeRO; the exchange's staging is left out).
    const double Md = in.muon.r[size_t(int(Replicas::dense))], Me = in.muon.r[size_t(int(Replicas::expert))];
    m.optimizer -= 4 * (in.zero ? Md / in.dense_group + Me / in.expert_group : Md + Me);
    if (in.zero >= 2) {  // the fp32 gradient slices and two unit windows (train/zero_state)
        const double shard = Pd / in.dense_group + Pe / in.expert_group;
        m.grads = shard * 4 + 2 * in.largest_unit * 4;
        if (in.zero == 3) m.params = (shard + in.params.r[size_t(int(Replicas::none))]) * wb + 2 * in.largest_unit * wb;
    }
    double act = 0;
    for (const auto& [cb, slots] : in.chunks) {
        // What a slot keeps of the chunk's own values: the layers' inputs (res.0 .. res.n-1), the
        // head's; not the chunk's output once sent to the next stage (GPU frameworks free it:
        // Megatron's output-tensor deallocation) nor the incoming and outgoing gradients, which
        // only the microbatch in its backward needs (one of each per chunk).
        std::vector<BufferSpec> keep, once;
        int outputs = 0;
        for (const auto& b : cb->own) outputs += b.name.rfind("res.", 0) == 0;
        const std::string output = "res." + std::to_string(outputs - 1);
        const bool sends = std::none_of(cb->own.begin(), cb->own.end(), [](const BufferSpec& b) { return b.name == "logits"; });
        for (const auto& b : cb->own) {
            if (b.name == "dout" || b.name == "dres") once.push_back(b);
            else if (!(sends && b.name == output)) keep.push_back(b);
        }
        double slot = gpu_list_bytes(keep, in.bf16) + 0, largest = 0;
        act += gpu_list_bytes(once, in.bf16);
        for (const auto& layer : cb->layer) {
            const double lb = gpu_list_bytes(layer, in.bf16);
            largest = std::max(largest, lb);
            if (!cb->full_recompute) slot += lb;
        }
        const double scores = in.score_values * (in.bf16 ? 2 : 4);
        if (!cb->full_recompute) slot += double(cb->layer.size()) * scores;
        act += double(slots) * slot + gpu_list_bytes(cb->shared, in.bf16);
        if (cb->full_recompute && !cb->layer.empty()) act += gpu_list_bytes(cb->workspace_own, in.bf16) + largest + scores;
    }
    m.activations = act;
    m.buffers = (in.boundary_values + in.ring_values + in.exchange_values) * wb;
    m.runtime = kGpuRuntimeBytes;
    m.total = m.params + m.grads + m.optimizer + m.activations + m.buffers + m.runtime;
    return m;
}

}  // namespace quintet
