// The MoE router (docs/math.md §9), the first of the MoE block's stages (router -> token
// dispatcher -> experts): scores, top-k, the balancing statistics and loss, the aux-loss-free
// bias rule. It makes no collective call (the block sums the statistics over the ranks that
// share a microbatch), so it is tested on its own.
#pragma once
#include <cstdint>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/config.hpp"

namespace quintet {

// One microbatch's routing through one MoE layer, kept per slot for its backward.
struct MoeRouting {
    float* probs = nullptr;     // [Nr, E] router probabilities (backend memory)
    int32_t* expert = nullptr;  // [Nr, k] chosen experts, descending score
    float* weight = nullptr;    // [Nr, k] their weights
    int32_t* slot = nullptr;    // [Nr, k] row of each choice in the expert-sorted order (R = Nr*k: dropped)
    int32_t* src = nullptr;     // [R] token row of each sorted row
    std::vector<int> count, offset;  // [E] kept rows per expert, and the first (host)
    std::vector<int> routed;         // [E] choices per expert before the capacity (host)
    int kept = 0;                    // rows in the sorted order
    int dropped = 0;                 // choices over an expert's capacity
    int count_in(int e0, int n) const {  // kept rows of experts [e0, e0 + n)
        int c = 0;
        for (int e = e0; e < e0 + n; ++e) c += count[size_t(e)];
        return c;
    }
};

// The kernels' routing rule from the [moe] keys (docs/math.md §9).
MoeRouteRule moe_route_rule(const MoeConfig& moe);

class MoeRouter {
public:
    // rows: the token rows this rank routes per microbatch (Nr). Host staging is sized here.
    MoeRouter(Backend& be, const MoeConfig& moe, int rows);
    int experts() const { return E_; }
    int top_k() const { return k_; }
    int rows() const { return rows_; }
    void init(MoeRouting& r) const;  // sizes the host parts of one slot's routing

    // From logits [Nr, E]: scores p = softmax or sigmoid (moe.scoring); the top-k by p (by p +
    // bias under aux_free; the bias only chooses; ties: the lower expert) among the experts of
    // the groups moe.topk_method keeps; weights = the chosen p (renormalised under
    // moe.norm_topk) times moe.routed_scaling, into r.probs, r.expert, r.weight.
    void route(MoeRouting& r, const float* logits, const float* bias);
    // The balance statistics of this rank's rows, out[2E+1] = [choices per expert (before any
    // drop) | probability sums | rows], to be summed over the ranks holding the microbatch. The
    // probabilities are the softmax scores, or the sigmoid scores normalised to sum 1 per row.
    void balance_stats(const MoeRouting& r, float* out);
    // From the summed statistics: the raw term E·Σ f_e·P_e (f_e: the share of the k·T choices
    // that picked e; P_e: the mean probability of e), and its gradient dL/dp_e = coef·E·f_e/T
    // per row, into daux[E] (host).
    double balance_loss(const float* stats, double coef, float* daux) const;
    // dlogits[Nr, E] from the weights' gradient and (aux_loss) the balance term's.
    void backward(float* dlogits, const float* dweight, const MoeRouting& r, const float* daux) const;
    // aux_free, from the global batch's loads: bias_e += rate · sign(mean load − load_e) (sign),
    // or rate · (mean load − load_e) / mean load (proportional).
    static void update_bias(float* bias, const double* load, int E, double rate, bool proportional = false);

private:
    Backend& be_;
    const int E_, k_, rows_;
    const MoeRouteRule rule_;
    // Host staging, sized once (no allocation in the steady state).
    std::vector<float> host_probs_;
    std::vector<double> psum_;
};

}  // namespace quintet
