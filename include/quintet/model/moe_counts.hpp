// What the MoE layers counted over one step's training forwards (recomputed forwards and
// evaluations are not counted): per rank as the blocks count, and -- once summed over every
// rank with one all-reduce of data() -- the step's figures: /moe/expert_load, /moe/dropped_tokens,
// /moe/aux, /moe/ep_tokens and the expert exchange's theoretical bytes. Dense layers read 0.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

namespace quintet {

class MoeCounts {
public:
    MoeCounts() = default;
    MoeCounts(int layers, int experts, int ep) : L_(layers), E_(experts), ep_(ep), v_(size_t(layers) * width(), 0.0) {}
    bool empty() const { return v_.empty(); }
    int layers() const { return L_; }
    int experts() const { return E_; }
    int ep() const { return ep_; }

    // Routing choices of expert e in `layer`, before any capacity drop.
    double& routed(int layer, int e) { return at(layer, e); }
    double routed(int layer, int e) const { return at(layer, e); }
    // Choices dropped by moe.capacity_factor.
    double& dropped(int layer) { return at(layer, E_); }
    double dropped(int layer) const { return at(layer, E_); }
    // The raw balance term E·Σ f_e P_e summed over the layer's microbatches, and how many.
    double& aux_sum(int layer) { return at(layer, E_ + 1); }
    double aux_sum(int layer) const { return at(layer, E_ + 1); }
    double& aux_count(int layer) { return at(layer, E_ + 2); }
    double aux_count(int layer) const { return at(layer, E_ + 2); }
    // Rows this rank sent to another ep rank's experts.
    double& sent_away(int layer) { return at(layer, E_ + 3); }
    double sent_away(int layer) const { return at(layer, E_ + 3); }
    // Rows ep rank g received (the expert side of the exchange).
    double& received(int layer, int g) { return at(layer, E_ + 4 + g); }
    double received(int layer, int g) const { return at(layer, E_ + 4 + g); }

    void add(const MoeCounts& o) {
        for (size_t i = 0; i < v_.size(); ++i) v_[i] += o.v_[i];
    }
    void clear() { std::fill(v_.begin(), v_.end(), 0.0); }
    // The flat form, for summing over ranks.
    double* data() { return v_.data(); }
    size_t size() const { return v_.size(); }

private:
    int width() const { return E_ + 4 + ep_; }
    double& at(int layer, int i) { return v_[size_t(layer) * size_t(width()) + size_t(i)]; }
    double at(int layer, int i) const { return v_[size_t(layer) * size_t(width()) + size_t(i)]; }
    int L_ = 0, E_ = 0, ep_ = 1;
    std::vector<double> v_;
};

}  // namespace quintet
