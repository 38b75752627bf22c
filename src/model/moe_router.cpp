#include "quintet/model/moe_router.hpp"

#include <algorithm>
#include <cmath>


namespace quintet {

MoeRouteRule moe_route_rule(const MoeConfig& moe) {
    MoeRouteRule r;
    r.sigmoid = moe.scoring == "sigmoid";
    r.method = moe.topk_method == "noaux_tc"               ? MoeRouteRule::group_top2
               : moe.topk_method == "group_limited_greedy" ? MoeRouteRule::group_max
                                                           : MoeRouteRule::greedy;
    r.groups = moe.groups;
    r.group_top_k = moe.group_top_k;
    r.norm = moe.norm_topk;
    r.scale = float(moe.routed_scaling);
    return r;
}

MoeRouter::MoeRouter(Backend& be, const MoeConfig& moe, int rows)
    : be_(be), E_(moe.experts), k_(moe.top_k), rows_(rows), rule_(moe_route_rule(moe)) {
    host_probs_.resize(size_t(rows) * E_);
    psum_.resize(size_t(E_));
}

void MoeRouter::init(MoeRouting& r) const {
    r.count.assign(size_t(E_), 0);
    r.offset.assign(size_t(E_), 0);
    r.routed.assign(size_t(E_), 0);
}

void MoeRouter::route(MoeRouting& r, const float* logits, const float* bias) {
    be_.moe_route(r.probs, r.expert, r.weight, logits, bias, rows_, E_, k_, rule_);
}

void MoeRouter::balance_stats(const MoeRouting& r, float* out) {
    const int Nr = rows_;
    be_.to_host(host_probs_.data(), r.probs, host_probs_.size());
    std::fill(psum_.begin(), psum_.end(), 0.0);
    for (int t = 0; t < Nr; ++t) {
        const float* p = host_probs_.data() + size_t(t) * E_;
        if (rule_.sigmoid) {  // the scores normalised to sum 1, as the kernel's backward assumes
            float sum = 0.0f;
            for (int e = 0; e < E_; ++e) sum += p[e];
            for (int e = 0; e < E_; ++e) psum_[size_t(e)] += p[e] / sum;
        } else {
            for (int e = 0; e < E_; ++e) psum_[size_t(e)] += p[e];
        }
    }
    for (int e = 0; e < E_; ++e) {
        out[e] = float(r.routed[size_t(e)]);
        out[E_ + e] = float(psum_[size_t(e)]);
    }
    out[2 * E_] = float(Nr);
}

double MoeRouter::balance_loss(const float* st, double coef, float* daux) const {
    const double T = st[2 * E_];
    double aux = 0;
    for (int e = 0; e < E_; ++e) {
        const double f = st[e] / (double(k_) * T), P = st[E_ + e] / T;
        aux += double(E_) * f * P;
        daux[e] = float(coef * double(E_) * f / T);
    }
    return aux;
}

void MoeRouter::backward(float* dlogits, const float* dweight, const MoeRouting& r, const float* daux) const {
    be_.moe_route_backward(dlogits, dweight, r.probs, r.expert, r.weight, daux, rows_, E_, k_, rule_);
}

void MoeRouter::update_bias(float* bias, const double* load, int E, double rate, bool proportional) {
    double mean = 0;
    for (int e = 0; e < E; ++e) mean += load[e] / E;
    for (int e = 0; e < E; ++e) {
        const double d = mean - load[e];
        if (proportional) bias[e] += mean > 0 ? float(rate * d / mean) : 0.0f;
        else bias[e] += float(rate) * float((d > 0) - (d < 0));
    }
}

}  // namespace quintet
