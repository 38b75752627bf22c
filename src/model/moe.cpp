// The feed-forward block on the layers moe.layers names: Mixture-of-Experts (DeepSeek-style;
// DESIGN §2 "MoE", maths in docs/math.md §9). Per token row x of this rank:
//     p = softmax(x Wg^T)            the router over E experts
//     top-k experts by p (+ bias under aux_free, which only chooses), weights w = their p
//     (renormalised to sum 1 under norm_topk)
//     y = sum_j w_j SwiGLU_{e_j}(x) + SharedSwiGLU(x)
// Dropless: every choice is computed. The rows are sorted by expert (a counting sort of the
// N*k choices, stable in token order), each expert is one GEMM pair over its contiguous rows,
// and the results are gathered back per token in choice order -- no per-token loops, no padding
// to a capacity, and the same bits whatever the imbalance. The sorted buffers hold exactly N*k
// rows, so their size is fixed: no allocation in the steady state.
//
// Balancing (moe.balance): aux_loss adds aux = E * sum_e f_e P_e per layer and microbatch, f_e
// and P_e over all the microbatch's tokens (summed over the tp and cp ranks that hold parts of
// it); aux_free keeps a bias per expert (a buffer, e_score_correction_bias) that the trainer
// moves after each step from the global batch's loads (update_bias); none does neither.
//
// Tensor parallelism needs sequence parallelism: each tp rank routes its own rows through whole
// (replicated) experts, so every gradient here is a partial sum over tp (GradSync::tp) and no
// collective runs inside the block but the aux statistics' all-reduce.
#include <algorithm>
#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/model/block.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

int expert_width(const ModelConfig& m, const ModelDims& d) { return m.moe.ffn_dim > 0 ? m.moe.ffn_dim : d.F; }

class MoeFeedForward final : public FeedForwardBlock {
    struct Saved {
        float* probs;        // [Nr, E]
        int32_t* expert;     // [Nr, k] chosen experts, descending score
        float* weight;       // [Nr, k]
        int32_t* slot;       // [Nr, k] row of each choice in the expert-sorted buffers
        int32_t* src;        // [Nr*k] token row of each sorted row
        std::vector<int> count, offset;  // [E] rows per expert, first row (host)
        Act xs;              // [Nr*k, C] inputs sorted by expert
        float* gu;           // [Nr*k, 2F] gate | up
        Act act;             // [Nr*k, F]
        float* y;            // [Nr*k, C] expert outputs
        float* gu_s = nullptr;  // [Nr, 2Fs] shared expert
        Act act_s;
        float* daux = nullptr;  // [E] dL/dp_e of the aux loss, per row (aux_loss only)
        double aux = 0;         // aux_coef * aux of the last forward, on cp rank 0 (else 0)
    };

public:
    MoeFeedForward(BlockContext& ctx, const ModelConfig& m, const ParamTable& table, int layer)
        : c_(ctx), E_(m.moe.experts), k_(m.moe.top_k), F_(expert_width(m, ctx.d)),
          Fs_(m.moe.shared_experts * expert_width(m, ctx.d)), norm_(m.moe.norm_topk),
          balance_(m.moe.balance), coef_(m.moe.aux_coef), rate_(m.moe.bias_rate) {
        QUINTET_CHECK(c_.tp.size() == 1 || c_.Nr < c_.N, "MoE with tp > 1 needs sequence parallelism");
        const std::string p = prefix(layer);
        wg_ = table.offset_of(p + "gate.weight");
        if (balance_ == "aux_free") bias_ = table.offset_of(p + "gate.e_score_correction_bias");
        for (int e = 0; e < E_; ++e) {
            const std::string q = p + "experts." + std::to_string(e) + ".";
            wgu_.push_back(table.offset_of(q + "gate_proj.weight"));
            QUINTET_CHECK(table.offset_of(q + "up_proj.weight") == wgu_.back() + size_t(F_) * c_.d.C,
                          "expert gate_proj and up_proj are not adjacent in the arena");
            wd_.push_back(table.offset_of(q + "down_proj.weight"));
        }
        if (Fs_ > 0) {
            wgu_s_ = table.offset_of(p + "shared_experts.gate_proj.weight");
            QUINTET_CHECK(table.offset_of(p + "shared_experts.up_proj.weight") == wgu_s_ + size_t(Fs_) * c_.d.C,
                          "shared gate_proj and up_proj are not adjacent in the arena");
            wd_s_ = table.offset_of(p + "shared_experts.down_proj.weight");
        }
        const size_t Nr = size_t(c_.Nr), R = Nr * k_, C = size_t(c_.d.C);
        hn32_ = c_.scratch("moe.hn_fp32", Nr * C);
        xs32_ = c_.scratch("moe.xs_fp32", R * C);
        logits_ = c_.scratch("moe.logits", Nr * E_);
        dy_ = c_.scratch("moe.dy", R * C);
        dgu_ = c_.scratch("moe.dgu", R * 2 * std::max(F_, Fs_));
        dact_ = c_.scratch("moe.dact", R * std::max(F_, Fs_));
        dw_ = c_.scratch("moe.dweight", Nr * k_);
        stage_ = c_.scratch("moe.stage", R * std::max(F_, Fs_));
        c_.reserve_lowp(std::max({R * C, R * 2 * size_t(F_), Nr * 2 * size_t(Fs_), Nr * C, Nr * E_}));
        load_.assign(size_t(E_), 0.0);
        host_expert_.resize(R);
        host_slot_.resize(R);
        host_src_.resize(R);
        next_.resize(size_t(E_));
        host_probs_.resize(Nr * E_);
        host_stats_.resize(size_t(2 * E_ + 1));
        host_e_.resize(size_t(E_));
        host_psum_.resize(size_t(E_));
    }

    void add_slot() override {
        const size_t Nr = size_t(c_.Nr), R = Nr * k_, C = size_t(c_.d.C);
        Saved s;
        s.probs = c_.buf(Nr * E_, true);
        s.expert = c_.buf_i32(R);
        s.weight = c_.buf(R, true);
        s.slot = c_.buf_i32(R);
        s.src = c_.buf_i32(R);
        s.count.assign(size_t(E_), 0);
        s.offset.assign(size_t(E_), 0);
        s.xs = c_.act(R * C);
        s.gu = c_.buf(R * 2 * F_, true);
        s.act = c_.act(R * F_);
        s.y = c_.buf(R * C, true);
        if (Fs_ > 0) {
            s.gu_s = c_.buf(Nr * 2 * Fs_, true);
            s.act_s = c_.act(Nr * Fs_);
        }
        if (balance_ == "aux_loss") s.daux = c_.buf(size_t(E_), false);
        slots_.push_back(std::move(s));
    }

    void forward(int slot, const float* params, const Act& hn, const float* h, float* y) override {
        const int Nr = c_.Nr, C = c_.d.C, R = Nr * k_;
        Saved& s = slots_[size_t(slot)];
        const Mat X = c_.local(hn);
        // The router: logits, softmax, top-k (bias only chooses).
        c_.mm(false, true, Nr, E_, C, X, C, c_.weight(params + wg_), C, 0.0f, logits_, E_);
        c_.be.moe_route(s.probs, s.expert, s.weight, logits_, bias_ ? params + bias_ : nullptr, Nr, E_, k_, norm_);
        plan(s);
        // Rows sorted by expert (stable in token order), then one GEMM pair per expert.
        const float* hn32 = hn.f;
        if (c_.bf16()) {
            c_.be.from_bf16(hn32_, hn.b, size_t(Nr) * C);
            hn32 = hn32_;
        }
        float* xs = c_.produce(s.xs, xs32_);
        c_.be.gather_rows(xs, hn32, s.src, R, C);
        c_.keep(s.xs, xs, size_t(R) * C);
        for (int e = 0; e < E_; ++e)
            if (s.count[size_t(e)] > 0) {
                const size_t o = size_t(s.offset[size_t(e)]);
                c_.mm(false, true, s.count[size_t(e)], 2 * F_, C, rows(c_.local(s.xs), o * C), C,
                      c_.weight(params + wgu_[size_t(e)]), C, 0.0f, s.gu + o * 2 * F_, 2 * F_);
            }
        float* act = c_.produce(s.act, stage_);
        c_.be.swiglu_forward(act, s.gu, R, F_);
        c_.keep(s.act, act, size_t(R) * F_);
        for (int e = 0; e < E_; ++e)
            if (s.count[size_t(e)] > 0) {
                const size_t o = size_t(s.offset[size_t(e)]);
                c_.mm(false, true, s.count[size_t(e)], C, F_, rows(c_.local(s.act), o * F_), F_,
                      c_.weight(params + wd_[size_t(e)]), F_, 0.0f, s.y + o * C, C);
            }
        // y = h + shared(x) + sum_j w_j expert_j(x), the choices summed in order.
        c_.be.copy(y, h, size_t(Nr) * C);
        if (Fs_ > 0) {
            c_.mm(false, true, Nr, 2 * Fs_, C, X, C, c_.weight(params + wgu_s_), C, 0.0f, s.gu_s, 2 * Fs_);
            float* as = c_.produce(s.act_s, stage_);
            c_.be.swiglu_forward(as, s.gu_s, Nr, Fs_);
            c_.keep(s.act_s, as, size_t(Nr) * Fs_);
            c_.mm(false, true, Nr, C, Fs_, c_.local(s.act_s), Fs_, c_.weight(params + wd_s_), Fs_, 1.0f, y, C);
        }
        c_.be.moe_combine(y, s.y, s.slot, s.weight, Nr, k_, C);
        balance_stats(s);
    }

    const float* backward(int slot, const float* params, float* grads, const Act& hn,
                          const float* dy) override {
        const int Nr = c_.Nr, C = c_.d.C, R = Nr * k_;
        Saved& s = slots_[size_t(slot)];
        // Combine: d(expert outputs) and d(weights).
        c_.be.moe_combine_backward(dy_, dw_, dy, s.y, s.slot, s.weight, Nr, k_, C);
        // Experts, down then gate|up, each over its rows.
        Mat Dy = c_.lowp(dy_, size_t(R) * C);
        for (int e = 0; e < E_; ++e)
            if (s.count[size_t(e)] > 0) {
                const int n = s.count[size_t(e)];
                const size_t o = size_t(s.offset[size_t(e)]);
                c_.mm(false, false, n, F_, C, rows(Dy, o * C), C, c_.weight(params + wd_[size_t(e)]), F_, 0.0f,
                      dact_ + o * F_, F_);
                c_.mm(true, false, C, F_, n, rows(Dy, o * C), C, rows(c_.local(s.act), o * F_), F_, 1.0f,
                      grads + wd_[size_t(e)], F_);
            }
        c_.be.swiglu_backward(dgu_, dact_, s.gu, R, F_);
        Mat Dgu = c_.lowp(dgu_, size_t(R) * 2 * F_);
        for (int e = 0; e < E_; ++e)
            if (s.count[size_t(e)] > 0) {
                const int n = s.count[size_t(e)];
                const size_t o = size_t(s.offset[size_t(e)]);
                c_.mm(true, false, 2 * F_, C, n, rows(Dgu, o * 2 * F_), 2 * F_, rows(c_.local(s.xs), o * C), C, 1.0f,
                      grads + wgu_[size_t(e)], C);
                c_.mm(false, false, n, C, 2 * F_, rows(Dgu, o * 2 * F_), 2 * F_, c_.weight(params + wgu_[size_t(e)]),
                      C, 0.0f, xs32_ + o * C, C);
            }
        // dx: each token's k sorted rows summed back in choice order.
        float* dhn = c_.full_b;
        c_.be.zero(dhn, size_t(Nr) * C);
        c_.be.moe_combine(dhn, xs32_, s.slot, nullptr, Nr, k_, C);
        // The shared expert.
        const Mat X = c_.local(hn);
        if (Fs_ > 0) {
            Mat D = c_.lowp(dy, size_t(Nr) * C);
            c_.mm(false, false, Nr, Fs_, C, D, C, c_.weight(params + wd_s_), Fs_, 0.0f, dact_, Fs_);
            c_.mm(true, false, C, Fs_, Nr, D, C, c_.local(s.act_s), Fs_, 1.0f, grads + wd_s_, Fs_);
            c_.be.swiglu_backward(dgu_, dact_, s.gu_s, Nr, Fs_);
            Mat Ds = c_.lowp(dgu_, size_t(Nr) * 2 * Fs_);
            c_.mm(true, false, 2 * Fs_, C, Nr, Ds, 2 * Fs_, X, C, 1.0f, grads + wgu_s_, C);
            c_.mm(false, false, Nr, C, 2 * Fs_, Ds, 2 * Fs_, c_.weight(params + wgu_s_), C, 1.0f, dhn, C);
        }
        // The router: through the chosen weights (and the aux loss's P_e), the softmax, the gate.
        c_.be.moe_route_backward(logits_, dw_, s.probs, s.expert, s.weight, s.daux, Nr, E_, k_, norm_);
        Mat Dz = c_.lowp(logits_, size_t(Nr) * E_);
        c_.mm(true, false, E_, C, Nr, Dz, E_, X, C, 1.0f, grads + wg_, C);
        c_.mm(false, false, Nr, C, E_, Dz, E_, c_.weight(params + wg_), C, 1.0f, dhn, C);
        for (int e = 0; e < E_; ++e) {
            c_.done(grads + wd_[size_t(e)], size_t(C) * F_);
            c_.done(grads + wgu_[size_t(e)], size_t(2) * F_ * C);
        }
        if (Fs_ > 0) {
            c_.done(grads + wd_s_, size_t(C) * Fs_);
            c_.done(grads + wgu_s_, size_t(2) * Fs_ * C);
        }
        c_.done(grads + wg_, size_t(E_) * C);
        return dhn;
    }

    double aux_loss(int slot) const override { return slots_[size_t(slot)].aux; }
    int experts() const override { return E_; }
    void take_load(double* out) override {
        for (int e = 0; e < E_; ++e) out[e] += load_[size_t(e)];
        std::fill(load_.begin(), load_.end(), 0.0);
    }
    // aux_free (DESIGN §2): bias_e += bias_rate * sign(mean_load - load_e), the global batch's loads.
    void update_bias(float* params, const double* load) override {
        if (!bias_) return;
        double mean = 0;
        for (int e = 0; e < E_; ++e) mean += load[e] / E_;
        std::vector<float>& b = host_e_;
        c_.be.to_host(b.data(), params + bias_, size_t(E_));
        for (int e = 0; e < E_; ++e) {
            const double d = mean - load[e];
            b[size_t(e)] += float(rate_) * float((d > 0) - (d < 0));
        }
        c_.be.from_host(params + bias_, b.data(), size_t(E_));
    }

private:
    // A GEMM operand starting `off` elements into `m`.
    static Mat rows(Mat m, size_t off) { return {m.f ? m.f + off : nullptr, m.b ? m.b + off : nullptr}; }

    // The counting sort of the choices by expert (host): counts, offsets, each choice's sorted row
    // (slot) and each sorted row's token (src). Stable: within an expert, token order, then j.
    void plan(Saved& s) {
        const int Nr = c_.Nr, R = Nr * k_;
        c_.be.to_host_i32(host_expert_.data(), s.expert, size_t(R));
        std::fill(s.count.begin(), s.count.end(), 0);
        for (int i = 0; i < R; ++i) ++s.count[size_t(host_expert_[size_t(i)])];
        int at = 0;
        for (int e = 0; e < E_; ++e) {
            s.offset[size_t(e)] = at;
            at += s.count[size_t(e)];
            if (!c_.recomputing) load_[size_t(e)] += s.count[size_t(e)];
        }
        std::vector<int>& next = next_;
        std::copy(s.offset.begin(), s.offset.end(), next.begin());
        for (int i = 0; i < R; ++i) {
            const int r = next[size_t(host_expert_[size_t(i)])]++;
            host_slot_[size_t(i)] = r;
            host_src_[size_t(r)] = i / k_;
        }
        c_.be.from_host_i32(s.slot, host_slot_.data(), size_t(R));
        c_.be.from_host_i32(s.src, host_src_.data(), size_t(R));
    }

    // aux_loss: f_e, P_e over the whole microbatch (tp and cp ranks summed); the aux value on cp
    // rank 0 (the loss counts it once) and its gradient dL/dp_e = coef * scale * E f_e / T.
    void balance_stats(Saved& s) {
        s.aux = 0;
        if (balance_ != "aux_loss") return;
        const int Nr = c_.Nr;
        c_.be.to_host(host_probs_.data(), s.probs, host_probs_.size());
        std::vector<float>& st = host_stats_;  // counts | prob sums | tokens
        std::vector<double>& psum = host_psum_;
        std::fill(psum.begin(), psum.end(), 0.0);
        for (int t = 0; t < Nr; ++t)
            for (int e = 0; e < E_; ++e) psum[size_t(e)] += host_probs_[size_t(t) * E_ + e];
        for (int e = 0; e < E_; ++e) {
            st[size_t(e)] = float(s.count[size_t(e)]);
            st[size_t(E_ + e)] = float(psum[size_t(e)]);
        }
        st[size_t(2 * E_)] = float(Nr);
        if (c_.tp.size() > 1) c_.tp.all_reduce_sum(st.data(), st.size());
        if (c_.cp) c_.cp->all_reduce_sum(st.data(), st.size());
        const double T = st[size_t(2 * E_)];
        double aux = 0;
        std::vector<float>& daux = host_e_;
        for (int e = 0; e < E_; ++e) {
            const double f = st[size_t(e)] / (double(k_) * T), P = st[size_t(E_ + e)] / T;
            aux += double(E_) * f * P;
            daux[size_t(e)] = float(coef_ * c_.aux_scale * double(E_) * f / T);
        }
        c_.be.from_host(s.daux, daux.data(), size_t(E_));
        s.aux = (!c_.cp || c_.cp->rank() == 0) ? coef_ * aux : 0.0;
    }

    BlockContext& c_;
    const int E_, k_, F_, Fs_;
    const bool norm_;
    const std::string balance_;
    const double coef_, rate_;
    size_t wg_ = 0, bias_ = 0, wgu_s_ = 0, wd_s_ = 0;
    std::vector<size_t> wgu_, wd_;
    float *hn32_, *xs32_, *logits_, *dy_, *dgu_, *dact_, *dw_, *stage_;
    std::vector<double> load_;  // this step's routing choices per expert (all microbatches)
    std::vector<int32_t> host_expert_, host_slot_, host_src_;
    std::vector<int> next_;
    // Host staging, sized once (no allocation in the steady state).
    std::vector<float> host_probs_, host_stats_, host_e_;
    std::vector<double> host_psum_;
    std::vector<Saved> slots_;
};

}  // namespace

bool moe_layer(const ModelConfig& m, int layer) {
    if (m.moe.experts <= 0) return false;
    if (m.moe.layers == "all" || m.moe.layers.empty()) return true;
    size_t at = 0;
    const std::string& s = m.moe.layers;
    while (at <= s.size()) {
        const size_t comma = std::min(s.find(',', at), s.size());
        if (std::stoi(s.substr(at, comma - at)) == layer) return true;
        at = comma + 1;
    }
    return false;
}

void moe_add_params(const ModelConfig& m, ParamBuilder& b, int layer) {
    const ModelDims& d = b.dims();
    const bool held = b.holds_layer(layer);
    const std::string p = prefix(layer);
    const int E = m.moe.experts, F = expert_width(m, d), Fs = m.moe.shared_experts * F;
    // Every tensor is whole on each tp rank (each routes its own rows): partial gradients over tp.
    auto add = [&](ParamSpec s, Replicas r) {
        s.replicas = r;
        if (d.tp > 1) s.sync = GradSync::tp;
        s.writer = d.tp_rank == 0;
        b.add(s, held, false);
    };
    add(ParamBuilder::whole(p + "gate.weight", E, d.C, InitRule::normal), Replicas::dense);
    if (m.moe.balance == "aux_free") {
        ParamSpec bias = ParamBuilder::vector(p + "gate.e_score_correction_bias", E, InitRule::zeros);
        bias.replicas = Replicas::none;
        bias.writer = d.tp_rank == 0;
        b.add(bias, held, false);
    }
    for (int e = 0; e < E; ++e) {
        const std::string q = p + "experts." + std::to_string(e) + ".";
        add(ParamBuilder::whole(q + "gate_proj.weight", F, d.C, InitRule::normal), Replicas::expert);
        add(ParamBuilder::whole(q + "up_proj.weight", F, d.C, InitRule::normal), Replicas::expert);
        add(ParamBuilder::whole(q + "down_proj.weight", d.C, F, InitRule::out_proj), Replicas::expert);
    }
    if (Fs > 0) {
        add(ParamBuilder::whole(p + "shared_experts.gate_proj.weight", Fs, d.C, InitRule::normal), Replicas::dense);
        add(ParamBuilder::whole(p + "shared_experts.up_proj.weight", Fs, d.C, InitRule::normal), Replicas::dense);
        add(ParamBuilder::whole(p + "shared_experts.down_proj.weight", d.C, Fs, InitRule::out_proj), Replicas::dense);
    }
    // P of 6·N·P counts the parameters a token multiplies: the router, k experts, the shared one.
    b.add_active(size_t(E) * d.C + size_t(m.moe.top_k) * 3 * F * d.C + size_t(3) * Fs * d.C);
}

std::unique_ptr<FeedForwardBlock> make_moe_feed_forward(BlockContext& ctx, const ModelConfig& m,
                                                        const ParamTable& table, int layer) {
    return std::make_unique<MoeFeedForward>(ctx, m, table, layer);
}

}  // namespace quintet
