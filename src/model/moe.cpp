// The feed-forward block on the layers moe.layers names: Mixture-of-Experts (DeepSeek-style;
// maths in docs/math.md §9). Per token row x of this rank:
//     p = softmax(x Wg^T)            the router over E experts
//     top-k experts by p (+ bias under aux_free, which only chooses), weights w = their p
//     (renormalised to sum 1 under norm_topk)
//     y = sum_j w_j SwiGLU_{e_j}(x) + SharedSwiGLU(x)
// Three stages, each a unit of its own: the router (model/moe_router: scores, top-k, balancing,
// bias), the token dispatcher (model/moe_dispatch: the choices sorted by expert, the capacity
// drops, the expert-parallel exchange, the weighted sum back per token) and the experts
// (model/moe_experts: one GEMM pair per local expert over its rows). Dropless by default; the
// sorted buffers are sized for the worst case, so nothing is allocated in the steady state.
//
// Balancing (moe.balance): aux_loss adds aux = E * sum_e f_e P_e per layer and microbatch, f_e
// and P_e over all the microbatch's tokens (summed over the tp and cp ranks that hold parts of
// it); aux_free keeps a bias per expert (a buffer, e_score_correction_bias) that the trainer
// moves after each step from the global batch's loads (update_bias); none does neither.
//
// Expert parallelism (parallel.ep): this rank holds experts [e0, e0 + E/ep); the sorted rows go
// to their experts' ranks and come back; the shared expert's forward and most of its backward
// run while the dispatch is in flight.
//
// Tensor parallelism needs sequence parallelism: each tp rank routes its own rows through whole
// (replicated) experts, so every gradient here is a partial sum over tp (GradSync::tp) and no
// collective runs inside the block but the balance statistics' all-reduce and the ep exchange.
#include <algorithm>
#include <cmath>

#include <memory>

#include "moe_experts.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/block.hpp"
#include "quintet/model/moe_dispatch.hpp"
#include "quintet/model/moe_router.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

constexpr F32Buf kProbs{"moe.probs"}, kWeight{"moe.weight"}, kY{"moe.y"}, kDaux{"moe.daux"};
constexpr I32Buf kExpert{"moe.expert"}, kSlot{"moe.slot"}, kSrc{"moe.src"};
constexpr I32Buf kToSource{"moe.to_source"}, kToExpert{"moe.to_expert"};
constexpr F32Buf kSharedGateUp{"moe.shared_gate_up"};
constexpr F32Buf kHn32{"moe.hn_fp32"}, kXs32{"moe.xs_fp32"}, kLogits{"moe.logits"}, kDy{"moe.dy"};
constexpr F32Buf kDweight{"moe.dweight"}, kStage{"moe.stage"}, kDactShared{"moe.dact_shared"};
constexpr F32Buf kXe32{"moe.xe_fp32"}, kDye{"moe.dye"};

// The linear layers beside the experts: the router and the shared expert (whole on every tp rank,
// on this rank's Nr rows: no collective). Fs: the shared expert's width.
LinearDecl router_decl(size_t Nr, size_t C, size_t E) {
    return {"moe.router", Nr, C, E, LinearInput::given, {kProbs.name}};
}
LinearDecl shared_gate_up_decl(size_t Nr, size_t C, size_t Fs) {
    return {"moe.shared_gate_up", Nr, C, 2 * Fs, LinearInput::given, {kSharedGateUp.name}, true};
}
LinearDecl shared_down_decl(size_t Nr, size_t C, size_t Fs) {
    return {"moe.shared_down", Nr, Fs, C, LinearInput::kept, {kY.name}};
}

class MoeFeedForward final : public FeedForwardBlock {
    struct Saved {
        MoeRouting route;
        float* y;            // [R+1, C] expert outputs, sorted; row R stays zero (dropped choices)
        ExpertExchange x;    // ep > 1: the exchange of this microbatch
        float* gu_s = nullptr;  // [Nr, 2Fs] shared expert
        float* daux = nullptr;  // [E] dL/dp_e of the aux loss, per row (aux_loss only)
        double aux = 0;         // aux_coef * aux of the last forward, on cp rank 0 (else 0)
    };

public:
    MoeFeedForward(BlockContext& ctx, const ModelConfig& m, const ParamTable& table, int layer)
        : c_(ctx), ep_(ctx.ep), E_(m.moe.experts), El_(ep_ ? ep_->local_experts() : m.moe.experts),
          e0_(ep_ ? ep_->first_expert() : 0), k_(m.moe.top_k), F_(m.expert_ffn_width()),
          Fs_(m.moe.shared_experts * m.expert_ffn_width()), balance_(m.moe.balance), coef_(m.moe.aux_coef),
          rate_(m.moe.bias_rate), proportional_(m.moe.bias_update == "proportional"), router_(ctx.be, m.moe, ctx.Nr),
          dispatch_(ctx.be, ep_, m.moe, ctx.Nr, ctx.d.C),
          Rx_(MoeDispatcher::expert_rows(m.moe, ctx.Nr, ep_ ? ep_->size() : 1)),
          experts_(ctx, table, prefix(layer), e0_, El_, F_, Rx_),
          gate_(ctx.lin, table, router_decl(size_t(ctx.Nr), size_t(ctx.d.C), size_t(E_)), prefix(layer) + "gate.weight",
                "gemm.router") {
        QUINTET_CHECK(c_.tp.size() == 1 || c_.Nr < c_.N, "MoE with tp > 1 needs sequence parallelism");
        const std::string p = prefix(layer);
        if (balance_ == "aux_free") bias_ = table.offset_of(p + "gate.e_score_correction_bias");
        if (Fs_ > 0) {
            const size_t Nr = size_t(c_.Nr), C = size_t(c_.d.C), Fs = size_t(Fs_);
            shared_gu_ = std::make_unique<Linear>(ctx.lin, table, shared_gate_up_decl(Nr, C, Fs),
                                                  fused_weight(table, p + "shared_experts.", {"gate_proj", "up_proj"}),
                                                  "gemm.shared_expert");
            shared_down_ = std::make_unique<Linear>(ctx.lin, table, shared_down_decl(Nr, C, Fs),
                                                    p + "shared_experts.down_proj.weight", "gemm.shared_expert");
            dact_s_ = c_.shared()[kDactShared];
        }
        const BufferViews& sh = c_.shared();
        hn32_ = sh[kHn32], xs32_ = sh[kXs32], logits_ = sh[kLogits], dy_ = sh[kDy], dw_ = sh[kDweight];
        stage_ = sh[kStage];
        if (ep_) xe32_ = sh[kXe32], dye_ = sh[kDye];  // expert side: staging, outputs, dx
        counts_ = MoeCounts(1, E_, ep_ ? ep_->size() : 1);
        stats_.resize(size_t(2 * E_ + 1));
        host_e_.resize(size_t(E_));
        load_.resize(size_t(E_));
    }

    void add_slot(const BufferViews& v) override {
        Saved s;
        router_.init(s.route);
        s.route.probs = v[kProbs], s.route.expert = v[kExpert], s.route.weight = v[kWeight];
        s.route.slot = v[kSlot], s.route.src = v[kSrc];
        s.y = v[kY];
        experts_.add_slot(v);
        if (ep_) ep_->prepare(s.x, Rx_, c_.d.C, v[kToSource], v[kToExpert]);
        if (Fs_ > 0) {
            s.gu_s = v[kSharedGateUp];
            shared_down_->add_slot(v);
        }
        if (balance_ == "aux_loss") s.daux = v[kDaux];
        slots_.push_back(std::move(s));
    }

    void add_w_slot(const BufferViews& w) override {
        gate_.add_w_slot(w);
        experts_.add_w_slot(w);
        if (Fs_ > 0) {
            shared_down_->add_w_slot(w);
            shared_gu_->add_w_slot(w);
        }
    }

    void forward(int slot, const float* params, const Act& hn, const float* h, float* y) override {
        const int Nr = c_.Nr, C = c_.d.C, R = Nr * k_;
        Saved& s = slots_[size_t(slot)];
        const Mat X = c_.lin.local(hn);
        // 1. The router: logits, softmax, top-k (bias only chooses); the choices sorted by expert.
        gate_.forward(X, Nr, logits_, params);
        {
            QUINTET_PROFILE("moe.route");
            router_.route(s.route, logits_, bias_ ? params + bias_ : nullptr);
            dispatch_.plan(s.route);
            if (!c_.recomputing) {
                for (int e = 0; e < E_; ++e) counts_.routed(0, e) += s.route.routed[size_t(e)];
                counts_.dropped(0) += s.route.dropped;
            }
        }
        // 2. The rows to their experts, sorted by expert (stable in token order).
        const float* hn32 = hn.f;
        if (c_.bf16()) {
            c_.be.from_bf16(hn32_, hn.b, size_t(Nr) * C);
            hn32 = hn32_;
        }
        int rows = s.route.kept;
        if (!ep_) {
            float* xs = experts_.input(slot, xs32_);
            dispatch_.sort_rows(s.route, hn32, xs);
            experts_.input_written(slot, xs, s.route.kept);
        } else {  // to the experts' ranks, the shared expert computed meanwhile
            dispatch_.sort_rows(s.route, hn32, xs32_);
            dispatch_.send(s.x, s.route, xs32_);
        }
        if (Fs_ > 0) {
            shared_gu_->forward(X, Nr, s.gu_s, params);
            dispatch_.progress();
            float* as = shared_down_->input(slot, stage_);
            c_.be.swiglu_forward(as, s.gu_s, Nr, Fs_);
            shared_down_->input_written(slot, as, size_t(Nr));
        }
        if (ep_) {
            float* xe = experts_.input(slot, xe32_);
            rows = dispatch_.receive(s.x, xe);
            experts_.input_written(slot, xe, rows);
        }
        // 3. The experts, one GEMM pair each over its rows; their outputs back in sorted order.
        float* ye = ep_ ? xe32_ : s.y;
        experts_.forward(slot, groups(s), rows, ye, params);
        if (ep_) dispatch_.send_back(s.x, ye, s.y);
        c_.be.zero(s.y + size_t(R) * C, size_t(C));
        // y = h + shared(x) + sum_j w_j expert_j(x), the choices summed in order.
        c_.be.copy(y, h, size_t(Nr) * C);
        if (Fs_ > 0) shared_down_->forward_kept(slot, Nr, y, params, 1.0f);
        dispatch_.combine(y, s.y, s.route, s.route.weight);
        balance(s);
        if (!c_.recomputing) {
            counts_.received(0, ep_ ? ep_->rank() : 0) += rows;
            if (ep_) counts_.sent_away(0) += s.route.kept - s.route.count_in(e0_, El_);
        }
    }

    // B: dhn through the combine, the experts (their rows to their ranks and back under ep),
    // the shared expert and the router.
    const float* backward_input(int slot, int wslot, const float* params, const Act&, const float* dy) override {
        const int Nr = c_.Nr, C = c_.d.C, R = Nr * k_;
        Saved& s = slots_[size_t(slot)];
        // Combine: d(expert outputs) and d(weights); the output gradients go to the experts.
        dispatch_.combine_backward(dy_, dw_, dy, s.y, s.route);
        if (ep_) ep_->dispatch_start(s.x, dy_);
        // Meanwhile the shared expert (all but its dx) and the router (all but its dx).
        Mat Ds;
        if (Fs_ > 0) {
            shared_down_->backward_input(wslot, dy, Nr, dact_s_, params);
            dispatch_.progress();
            float* dgu_s = shared_gu_->grad_target(wslot);
            c_.be.swiglu_backward(dgu_s, dact_s_, s.gu_s, Nr, Fs_);
            Ds = shared_gu_->keep_grad(wslot, dgu_s, Nr);
        }
        router_.backward(logits_, dw_, s.route, s.daux);
        const Mat Dz = gate_.keep_grad(wslot, logits_, Nr);
        // The experts, down then gate|up, each over its rows; dx of their inputs.
        const float* dye = dy_;
        float* dxe = xs32_;
        int rows = s.route.kept;
        if (ep_) {
            rows = dispatch_.receive(s.x, dye_);
            dye = dye_, dxe = xe32_;
        }
        experts_.backward_input(slot, wslot, groups(s), rows, dye, dxe, params);
        if (ep_) dispatch_.send_back(s.x, dxe, xs32_);
        c_.be.zero(xs32_ + size_t(R) * C, size_t(C));
        // dx: each token's k sorted rows summed back in choice order, then the shared expert's
        // and the router's.
        float* dhn = c_.lin.full_b;
        c_.be.zero(dhn, size_t(Nr) * C);
        dispatch_.combine(dhn, xs32_, s.route, nullptr);
        if (Fs_ > 0) shared_gu_->input_grad(Ds, Nr, dhn, params, 1.0f);
        gate_.input_grad(Dz, Nr, dhn, params, 1.0f);
        return dhn;
    }

    // W: the shared expert's, the router's and the experts' weight gradients.
    void backward_weight(int slot, int wslot, float* grads, const Act& hn) override {
        const Mat X = c_.lin.local(hn);
        if (Fs_ > 0) {
            shared_down_->backward_weight_kept(slot, wslot, c_.Nr, grads);
            shared_gu_->backward_weight(wslot, X, c_.Nr, grads);
        }
        gate_.backward_weight(wslot, X, c_.Nr, grads);
        experts_.backward_weight(slot, wslot, groups(slots_[size_t(slot)]), grads);
    }

    double aux_loss(int slot) const override { return slots_[size_t(slot)].aux; }
    int experts() const override { return E_; }
    void take_counts(MoeCounts& out, int layer) override {
        for (int e = 0; e < E_; ++e) out.routed(layer, e) += counts_.routed(0, e);
        out.dropped(layer) += counts_.dropped(0);
        out.aux_sum(layer) += counts_.aux_sum(0);
        out.aux_count(layer) += counts_.aux_count(0);
        out.sent_away(layer) += counts_.sent_away(0);
        for (int g = 0; g < counts_.ep(); ++g) out.received(layer, g) += counts_.received(0, g);
        counts_.clear();
    }
    // aux_free (docs/math.md §9): the router's sign rule on the global batch's loads.
    void update_bias(float* params, const MoeCounts& step, int layer) override {
        if (!bias_) return;
        for (int e = 0; e < E_; ++e) load_[size_t(e)] = step.routed(layer, e);
        std::vector<float>& b = host_e_;
        c_.be.to_host(b.data(), params + bias_, size_t(E_));
        MoeRouter::update_bias(b.data(), load_.data(), E_, rate_, proportional_);
        c_.be.from_host(params + bias_, b.data(), size_t(E_));
    }

private:
    MoeExperts::Groups groups(const Saved& s) const {
        return {ep_ ? s.x.expert_rows.data() : s.route.count.data(), ep_ ? s.x.expert_off.data() : s.route.offset.data()};
    }

    // f_e, P_e over the whole microbatch (tp and cp ranks summed), routing choices before any
    // capacity drop: the raw aux E·Σ f_e P_e, counted for /moe/aux under every balance; under
    // aux_loss the term aux_coef·aux on cp rank 0 (the loss counts it once) and its gradient.
    void balance(Saved& s) {
        s.aux = 0;
        router_.balance_stats(s.route, stats_.data());
        if (c_.tp.size() > 1) c_.tp.all_reduce_sum(stats_.data(), stats_.size());
        if (c_.cp) c_.cp->all_reduce_sum(stats_.data(), stats_.size());
        const double aux = router_.balance_loss(stats_.data(), coef_ * c_.aux_scale, host_e_.data());
        const bool counted_here = (!c_.cp || c_.cp->rank() == 0) && c_.tp.rank() == 0;
        if (!c_.recomputing && counted_here) {
            counts_.aux_sum(0) += aux;
            counts_.aux_count(0) += 1;
        }
        if (balance_ != "aux_loss") return;
        c_.be.from_host(s.daux, host_e_.data(), size_t(E_));
        s.aux = (!c_.cp || c_.cp->rank() == 0) ? coef_ * aux : 0.0;
    }

    BlockContext& c_;
    ExpertParallel* const ep_;
    const int E_, El_, e0_, k_, F_, Fs_;
    const std::string balance_;
    const double coef_, rate_;
    const bool proportional_;
    MoeRouter router_;
    MoeDispatcher dispatch_;
    const int Rx_;  // rows this rank's experts may be handed
    MoeExperts experts_;
    Linear gate_;                                   // the router's logits
    std::unique_ptr<Linear> shared_gu_, shared_down_;  // the shared expert (moe.shared_experts > 0)
    size_t bias_ = 0;
    float *hn32_, *xs32_, *logits_, *dy_, *dw_, *stage_;
    float *dact_s_ = nullptr, *xe32_ = nullptr, *dye_ = nullptr;
    MoeCounts counts_;  // this step's counts as layer 0, training forwards only
    std::vector<float> stats_, host_e_;  // host staging, sized once
    std::vector<double> load_;
    std::vector<Saved> slots_;
};

}  // namespace

// An MTP module's layer (index >= n_layers) has the last decoder layer's feed-forward kind.
bool moe_layer(const ModelConfig& m, int layer) {
    if (layer >= m.n_layers) return moe_layer(m, m.n_layers - 1);
    return m.moe.experts > 0 && m.moe.layers.contains(layer);
}

void moe_add_params(const ModelConfig& m, ParamBuilder& b, int layer) {
    const ModelDims& d = b.dims();
    const bool held = b.holds_layer(layer);
    const std::string p = prefix(layer);
    const int E = m.moe.experts, F = m.expert_ffn_width(), Fs = m.moe.shared_experts * F;
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
    // Expert e lives on ep rank e / (E/ep) only (contiguous groups, docs/parallelism.md "Expert parallelism").
    const int El = E / b.plan().ep, e0 = b.plan().ep_rank * El;
    for (int e = 0; e < E; ++e) {
        const std::string q = p + "experts." + std::to_string(e) + ".";
        const bool mine = held && e >= e0 && e < e0 + El;
        auto expert = [&](ParamSpec s) {
            s.replicas = Replicas::expert;
            if (b.plan().ep > 1) s.shard = Shard::ep;
            if (d.tp > 1) s.sync = GradSync::tp;
            s.writer = d.tp_rank == 0;
            b.add(s, mine, false);
        };
        expert(ParamBuilder::whole(q + "gate_proj.weight", F, d.C, InitRule::normal));
        expert(ParamBuilder::whole(q + "up_proj.weight", F, d.C, InitRule::normal));
        expert(ParamBuilder::whole(q + "down_proj.weight", d.C, F, InitRule::out_proj));
    }
    if (Fs > 0) {
        add(ParamBuilder::whole(p + "shared_experts.gate_proj.weight", Fs, d.C, InitRule::normal), Replicas::dense);
        add(ParamBuilder::whole(p + "shared_experts.up_proj.weight", Fs, d.C, InitRule::normal), Replicas::dense);
        add(ParamBuilder::whole(p + "shared_experts.down_proj.weight", d.C, Fs, InitRule::out_proj), Replicas::dense);
    }
    // P of 6·N·P counts the parameters a token multiplies: the router, k experts, the shared one.
    b.add_active(size_t(E) * d.C + size_t(m.moe.top_k) * 3 * F * d.C + size_t(3) * Fs * d.C);
}

void moe_declare_buffers(const ModelConfig& m, const ModelDims& d, const BufferShape& s, BufferDecl& out) {
    const int E = m.moe.experts, k = m.moe.top_k;
    const size_t Nr = size_t(s.Nr), R = Nr * k, C = size_t(d.C), E_ = size_t(E);
    const size_t F = size_t(m.expert_ffn_width()), Fs = size_t(m.moe.shared_experts) * F;
    const size_t Rx = size_t(MoeDispatcher::expert_rows(m.moe, s.Nr, s.ep));
    // The routing, kept for the backward.
    // B's only (b_only): the router's backward reads the probabilities, the combine's the
    // experts' outputs, the SwiGLUs' backwards their inputs; W reads none of them.
    out.per_slot(kProbs, Nr * E_, true);
    out.per_slot(kExpert, R);
    out.per_slot(kWeight, R);
    out.per_slot(kSlot, R);
    out.per_slot(kSrc, R);
    // The experts' side, sized for the dropless worst case.
    out.per_slot(kY, (R + 1) * C, true);  // their outputs in sorted order; row R is zero
    MoeExperts::declare_saved(out, Rx, C, F);
    if (s.ep > 1) {
        out.per_slot(kToSource, std::max<size_t>(Rx, 1));
        out.per_slot(kToExpert, std::max<size_t>(Rx, 1));
        out.exchange = std::max<size_t>(Rx, 1) * C;
    }
    if (Fs > 0) {
        out.per_slot(kSharedGateUp, Nr * 2 * Fs, true);
        declare_input(out, shared_down_decl(Nr, C, Fs));  // the shared expert's activation
    }
    if (m.moe.balance == "aux_loss") out.per_slot(kDaux, E_);
    out.scratch(kHn32, Nr * C);
    out.scratch(kXs32, (R + 1) * C);
    out.scratch(kLogits, Nr * E_);
    out.scratch(kDy, (R + 1) * C);
    // What W needs, each written once B has read what it may live in: the combine's backward
    // (the first thing B does) reads moe.y, the router's backward the probabilities, the
    // SwiGLUs' backwards their gate|up.
    declare_grad(out, router_decl(Nr, C, E_), s);
    MoeExperts::declare_grads(out, Rx, C, F, kY.name, s);
    if (Fs > 0) {
        declare_grad(out, shared_down_decl(Nr, C, Fs), s);
        declare_grad(out, shared_gate_up_decl(Nr, C, Fs), s);
    }
    MoeExperts::declare_scratch(out, Rx, F);
    out.scratch(kDweight, Nr * k);
    out.scratch(kStage, std::max(Rx * F, Nr * Fs));
    if (Fs > 0) out.scratch(kDactShared, Nr * Fs);
    if (s.ep > 1) {
        out.scratch(kXe32, Rx * C);
        out.scratch(kDye, Rx * C);
    }
}

std::unique_ptr<FeedForwardBlock> make_moe_feed_forward(BlockContext& ctx, const ModelConfig& m,
                                                        const ParamTable& table, int layer) {
    return std::make_unique<MoeFeedForward>(ctx, m, table, layer);
}

}  // namespace quintet
