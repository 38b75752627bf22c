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

#include "moe_experts.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/model/block.hpp"
#include "quintet/model/moe_dispatch.hpp"
#include "quintet/model/moe_router.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

class MoeFeedForward final : public FeedForwardBlock {
    struct Saved {
        MoeRouting route;
        float* y;            // [R+1, C] expert outputs, sorted; row R stays zero (dropped choices)
        Act xe;              // [Rx, C] the experts' inputs (ep = 1: the sorted rows themselves)
        float* gu;           // [Rx, 2F]
        Act act;             // [Rx, F]
        ExpertExchange x;    // ep > 1: the exchange of this microbatch
        float* gu_s = nullptr;  // [Nr, 2Fs] shared expert
        Act act_s;
        float* daux = nullptr;  // [E] dL/dp_e of the aux loss, per row (aux_loss only)
        double aux = 0;         // aux_coef * aux of the last forward, on cp rank 0 (else 0)
    };

public:
    MoeFeedForward(BlockContext& ctx, const ModelConfig& m, const ParamTable& table, int layer)
        : c_(ctx), ep_(ctx.ep), E_(m.moe.experts), El_(ep_ ? ep_->local_experts() : m.moe.experts),
          e0_(ep_ ? ep_->first_expert() : 0), k_(m.moe.top_k), F_(m.expert_ffn_width()),
          Fs_(m.moe.shared_experts * m.expert_ffn_width()), balance_(m.moe.balance), coef_(m.moe.aux_coef),
          rate_(m.moe.bias_rate), proportional_(m.moe.bias_update == "proportional"), router_(ctx.be, m.moe, ctx.Nr), dispatch_(ctx.be, ep_, m.moe, ctx.Nr, ctx.d.C),
          experts_(ctx, table, prefix(layer), e0_, El_, F_),
          Rx_(MoeDispatcher::expert_rows(m.moe, ctx.Nr, ep_ ? ep_->size() : 1)) {
        QUINTET_CHECK(c_.tp.size() == 1 || c_.Nr < c_.N, "MoE with tp > 1 needs sequence parallelism");
        const std::string p = prefix(layer);
        wg_ = table.offset_of(p + "gate.weight");
        if (balance_ == "aux_free") bias_ = table.offset_of(p + "gate.e_score_correction_bias");
        if (Fs_ > 0) {
            wgu_s_ = table.offset_of(p + "shared_experts.gate_proj.weight");
            QUINTET_CHECK(table.offset_of(p + "shared_experts.up_proj.weight") == wgu_s_ + size_t(Fs_) * c_.d.C,
                          "shared gate_proj and up_proj are not adjacent in the arena");
            wd_s_ = table.offset_of(p + "shared_experts.down_proj.weight");
        }
        const BufferViews& sh = c_.shared();
        hn32_ = sh.f32("moe.hn_fp32");
        xs32_ = sh.f32("moe.xs_fp32");
        logits_ = sh.f32("moe.logits");
        dy_ = sh.f32("moe.dy");
        dw_ = sh.f32("moe.dweight");
        stage_ = sh.f32("moe.stage");
        if (Fs_ > 0) {
            // fp32 without a split schedule: straight into the deferred buffer (under one, that
            // may be the shared gate|up's own bytes, which its SwiGLU's backward reads).
            if (c_.bf16() || c_.split_bw) dgu_s_ = sh.f32("moe.dgu_shared");
            dact_s_ = sh.f32("moe.dact_shared");
        }
        if (ep_) {
            xe32_ = sh.f32("moe.xe_fp32");  // expert side: staging, outputs, dx
            dye_ = sh.f32("moe.dye");
        }
        counts_ = MoeCounts(1, E_, ep_ ? ep_->size() : 1);
        stats_.resize(size_t(2 * E_ + 1));
        host_e_.resize(size_t(E_));
        load_.resize(size_t(E_));
    }

    // What the kind keeps (moe_declare_buffers below says how large).
    void add_slot(const BufferViews& v) override {
        Saved s;
        router_.init(s.route);
        s.route.probs = v.f32("moe.probs");
        s.route.expert = v.i32("moe.expert");
        s.route.weight = v.f32("moe.weight");
        s.route.slot = v.i32("moe.slot");
        s.route.src = v.i32("moe.src");
        s.y = v.f32("moe.y");
        s.xe = v.act("moe.x");
        s.gu = v.f32("moe.gate_up");
        s.act = v.act("moe.act");
        if (ep_) ep_->prepare(s.x, Rx_, c_.d.C, v.i32("moe.to_source"), v.i32("moe.to_expert"));
        if (Fs_ > 0) {
            s.gu_s = v.f32("moe.shared_gate_up");
            s.act_s = v.act("moe.shared_act");
        }
        if (balance_ == "aux_loss") s.daux = v.f32("moe.daux");
        slots_.push_back(std::move(s));
    }

    void add_deferred(const BufferViews& w) override {
        Deferred d;
        d.dz = w.act("w.moe.dz");
        d.dye = w.act("w.moe.dye");
        d.dgu = w.act("w.moe.dgu");
        if (Fs_ > 0) {
            d.dy = w.act("w.moe.dy");
            d.dgu_s = w.act("w.moe.dgu_shared");
        }
        wslots_.push_back(d);
    }

    void forward(int slot, const float* params, const Act& hn, const float* h, float* y) override {
        const int Nr = c_.Nr, C = c_.d.C, R = Nr * k_;
        Saved& s = slots_[size_t(slot)];
        const Mat X = c_.local(hn);
        // 1. The router: logits, softmax, top-k (bias only chooses); the choices sorted by expert.
        {
            auto role = c_.role("gemm.router");
            c_.mm(false, true, Nr, E_, C, X, C, c_.weight(params + wg_), C, 0.0f, logits_, E_);
        }
        {
            QUINTET_PROFILE("moe.route");
            router_.route(s.route, logits_, bias_ ? params + bias_ : nullptr);
            dispatch_.plan(s.route);
            if (!c_.recomputing) {
                for (int e = 0; e < E_; ++e) counts_.routed(0, e) += s.route.routed[size_t(e)];
                counts_.dropped(0) += s.route.dropped;
            }
        }
        auto role = c_.role("gemm.shared_expert");
        // 2. The rows to their experts, sorted by expert (stable in token order).
        const float* hn32 = hn.f;
        if (c_.bf16()) {
            c_.be.from_bf16(hn32_, hn.b, size_t(Nr) * C);
            hn32 = hn32_;
        }
        const MoeExperts::Rows ex = expert_rows(s);
        int rows = s.route.kept;
        if (!ep_) {
            float* xs = c_.produce(s.xe, xs32_);
            dispatch_.sort_rows(s.route, hn32, xs);
            c_.keep(s.xe, xs, size_t(s.route.kept) * C);
        } else {  // to the experts' ranks, the shared expert computed meanwhile
            dispatch_.sort_rows(s.route, hn32, xs32_);
            dispatch_.send(s.x, s.route, xs32_);
        }
        if (Fs_ > 0) {
            c_.mm(false, true, Nr, 2 * Fs_, C, X, C, c_.weight(params + wgu_s_), C, 0.0f, s.gu_s, 2 * Fs_);
            dispatch_.progress();
            float* as = c_.produce(s.act_s, stage_);
            c_.be.swiglu_forward(as, s.gu_s, Nr, Fs_);
            c_.keep(s.act_s, as, size_t(Nr) * Fs_);
        }
        if (ep_) {
            float* xe = c_.produce(s.xe, xe32_);
            rows = dispatch_.receive(s.x, xe);
            c_.keep(s.xe, xe, size_t(rows) * C);
        }
        // 3. The experts, one GEMM pair each over its rows; their outputs back in sorted order.
        float* ye = ep_ ? xe32_ : s.y;
        experts_.forward(ex, params, rows, ye);
        if (ep_) dispatch_.send_back(s.x, ye, s.y);
        c_.be.zero(s.y + size_t(R) * C, size_t(C));
        // y = h + shared(x) + sum_j w_j expert_j(x), the choices summed in order.
        c_.be.copy(y, h, size_t(Nr) * C);
        if (Fs_ > 0)
            c_.mm(false, true, Nr, C, Fs_, c_.local(s.act_s), Fs_, c_.weight(params + wd_s_), Fs_, 1.0f, y, C);
        dispatch_.combine(y, s.y, s.route, s.route.weight);
        balance(s);
        if (!c_.recomputing) {
            counts_.received(0, ep_ ? ep_->rank() : 0) += rows;
            if (ep_) counts_.sent_away(0) += s.route.kept - s.route.count_in(e0_, El_);
        }
    }

    // B: dhn through the combine, the experts (their rows to their ranks and back under ep),
    // the shared expert and the router; keeps each linear layer's output gradient for W.
    const float* backward_input(int slot, int wslot, const float* params, const Act& hn,
                                const float* dy) override {
        (void)hn;
        const int Nr = c_.Nr, C = c_.d.C, R = Nr * k_;
        Saved& s = slots_[size_t(slot)];
        Deferred& w = wslots_[size_t(wslot)];
        auto role = c_.role("gemm.shared_expert");
        // Combine: d(expert outputs) and d(weights); the output gradients go to the experts.
        dispatch_.combine_backward(dy_, dw_, dy, s.y, s.route);
        if (ep_) ep_->dispatch_start(s.x, dy_);
        // Meanwhile the shared expert (all but its dx) and the router (all but its dx).
        Mat Ds;
        if (Fs_ > 0) {
            const Mat D = c_.save(w.dy, dy, size_t(Nr) * C);
            c_.mm(false, false, Nr, Fs_, C, D, C, c_.weight(params + wd_s_), Fs_, 0.0f, dact_s_, Fs_);
            dispatch_.progress();
            float* dgu_s = c_.split_bw ? dgu_s_ : c_.produce(w.dgu_s, dgu_s_);
            c_.be.swiglu_backward(dgu_s, dact_s_, s.gu_s, Nr, Fs_);
            Ds = c_.save(w.dgu_s, dgu_s, size_t(Nr) * 2 * Fs_);
        }
        router_.backward(logits_, dw_, s.route, s.daux);
        const Mat Dz = c_.save(w.dz, logits_, size_t(Nr) * E_);
        // The experts, down then gate|up, each over its rows; dx of their inputs.
        const float* dye = dy_;
        float* dxe = xs32_;
        int rows = s.route.kept;
        if (ep_) {
            rows = dispatch_.receive(s.x, dye_);
            dye = dye_, dxe = xe32_;
        }
        experts_.backward_input(expert_rows(s), params, rows, dye, dxe, w.dye, w.dgu);
        if (ep_) dispatch_.send_back(s.x, dxe, xs32_);
        c_.be.zero(xs32_ + size_t(R) * C, size_t(C));
        // dx: each token's k sorted rows summed back in choice order, then the shared expert's
        // and the router's.
        float* dhn = c_.full_b;
        c_.be.zero(dhn, size_t(Nr) * C);
        dispatch_.combine(dhn, xs32_, s.route, nullptr);
        if (Fs_ > 0) c_.mm(false, false, Nr, C, 2 * Fs_, Ds, 2 * Fs_, c_.weight(params + wgu_s_), C, 1.0f, dhn, C);
        auto router = c_.role("gemm.router");
        c_.mm(false, false, Nr, C, E_, Dz, E_, c_.weight(params + wg_), C, 1.0f, dhn, C);
        return dhn;
    }

    // W: the shared expert's, the router's and the experts' weight gradients.
    void backward_weight(int slot, int wslot, float* grads, const Act& hn) override {
        const int Nr = c_.Nr, C = c_.d.C;
        Saved& s = slots_[size_t(slot)];
        Deferred& w = wslots_[size_t(wslot)];
        const Mat X = c_.local(hn);
        if (Fs_ > 0) {
            auto role = c_.role("gemm.shared_expert");
            c_.mm(true, false, C, Fs_, Nr, c_.deferred(w.dy), C, c_.local(s.act_s), Fs_, 1.0f, grads + wd_s_, Fs_);
            c_.mm(true, false, 2 * Fs_, C, Nr, c_.deferred(w.dgu_s), 2 * Fs_, X, C, 1.0f, grads + wgu_s_, C);
        }
        {
            auto router = c_.role("gemm.router");
            c_.mm(true, false, E_, C, Nr, c_.deferred(w.dz), E_, X, C, 1.0f, grads + wg_, C);
        }
        experts_.backward_weight(expert_rows(s), grads, w.dye, w.dgu);
        experts_.done(grads);
        if (Fs_ > 0) {
            c_.done(grads + wd_s_, size_t(C) * Fs_);
            c_.done(grads + wgu_s_, size_t(2) * Fs_ * C);
        }
        c_.done(grads + wg_, size_t(E_) * C);
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
    MoeExperts::Rows expert_rows(const Saved& s) const {
        return {s.xe, s.gu, s.act, ep_ ? s.x.expert_rows.data() : s.route.count.data(),
                ep_ ? s.x.expert_off.data() : s.route.offset.data()};
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
    MoeExperts experts_;
    const int Rx_;  // rows this rank's experts may be handed
    size_t wg_ = 0, bias_ = 0, wgu_s_ = 0, wd_s_ = 0;
    float *hn32_, *xs32_, *logits_, *dy_, *dw_, *stage_;
    float *dgu_s_ = nullptr, *dact_s_ = nullptr, *xe32_ = nullptr, *dye_ = nullptr;
    MoeCounts counts_;  // this step's counts as layer 0, training forwards only
    std::vector<float> stats_, host_e_;  // host staging, sized once
    std::vector<double> load_;
    struct Deferred {  // B -> W
        Act dz;        // [Nr, E] the router logits' gradient
        Act dye, dgu;  // [Rx, C], [Rx, 2F] the experts' down and gate|up output gradients (their rows)
        Act dy, dgu_s; // [Nr, C], [Nr, 2Fs] the shared expert's
    };
    std::vector<Saved> slots_;
    std::vector<Deferred> wslots_;
};

}  // namespace

bool moe_layer(const ModelConfig& m, int layer) { return m.moe.experts > 0 && m.moe.layers.contains(layer); }

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
    out.save("moe.probs", Nr * E_, Elem::f32, true);
    out.save("moe.expert", R, Elem::i32);
    out.save("moe.weight", R);
    out.save("moe.slot", R, Elem::i32);
    out.save("moe.src", R, Elem::i32);
    // The experts' side, sized for the dropless worst case.
    out.save("moe.y", (R + 1) * C, Elem::f32, true);  // their outputs in sorted order; row R is zero
    out.save("moe.x", Rx * C, Elem::act);       // their inputs
    out.save("moe.gate_up", Rx * 2 * F, Elem::f32, true);
    out.save("moe.act", Rx * F, Elem::act);
    if (s.ep > 1) {
        out.save("moe.to_source", std::max<size_t>(Rx, 1), Elem::i32);
        out.save("moe.to_expert", std::max<size_t>(Rx, 1), Elem::i32);
        out.exchange = std::max<size_t>(Rx, 1) * C;
    }
    if (Fs > 0) {
        out.save("moe.shared_gate_up", Nr * 2 * Fs, Elem::f32, true);
        out.save("moe.shared_act", Nr * Fs, Elem::act);
    }
    if (m.moe.balance == "aux_loss") out.save("moe.daux", E_);
    out.scratch("moe.hn_fp32", Nr * C);
    out.scratch("moe.xs_fp32", (R + 1) * C);
    out.scratch("moe.logits", Nr * E_);
    out.scratch("moe.dy", (R + 1) * C);
    // What W needs, each written once B has read what it may live in: the combine's backward
    // (the first thing B does) reads moe.y, the router's backward the probabilities, the
    // SwiGLUs' backwards their gate|up.
    out.defer("w.moe.dz", Nr * E_, Elem::act, {"moe.probs"});
    out.defer("w.moe.dye", Rx * C, Elem::act, {"moe.y"});
    out.defer("w.moe.dgu", Rx * 2 * F, Elem::act, {"moe.gate_up"});
    if (Fs > 0) {
        out.defer("w.moe.dy", Nr * C, Elem::act, {"moe.y"});
        out.defer("w.moe.dgu_shared", Nr * 2 * Fs, Elem::act, {"moe.shared_gate_up"});
    }
    // fp32 before it is rounded (bf16) or copied (a split schedule) into w.moe.dgu
    if (s.bf16 || s.split_bw) out.scratch("moe.dgu", Rx * 2 * F);
    out.scratch("moe.dact", Rx * F);
    out.scratch("moe.dweight", Nr * k);
    out.scratch("moe.stage", std::max(Rx * F, Nr * Fs));
    if (Fs > 0) {
        if (s.bf16 || s.split_bw) out.scratch("moe.dgu_shared", Nr * 2 * Fs);  // fp32 before w.moe.dgu_shared
        out.scratch("moe.dact_shared", Nr * Fs);
    }
    if (s.ep > 1) {
        out.scratch("moe.xe_fp32", Rx * C);
        out.scratch("moe.dye", Rx * C);
    }
}

std::unique_ptr<FeedForwardBlock> make_moe_feed_forward(BlockContext& ctx, const ModelConfig& m,
                                                        const ParamTable& table, int layer) {
    return std::make_unique<MoeFeedForward>(ctx, m, table, layer);
}

}  // namespace quintet
