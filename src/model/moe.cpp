// The feed-forward block on the layers moe.layers names: Mixture-of-Experts (DeepSeek-style;
// maths in docs/math.md §9). Per token row x of this rank:
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
// moe.capacity_factor > 0 caps each expert at ceil(cf * k * Nr / E) of the Nr rows a rank routes;
// the choices over the cap with the lowest weights are dropped (ties: the later token), their
// output is zero, and they are counted.
//
// Expert parallelism (parallel.ep, parallel/expert_parallel.hpp): this rank holds experts
// [e0, e0 + E/ep). The sorted rows go to their experts' ranks (counts first, then rows), are
// computed there as one GEMM pair per local expert, and come back; the backward reverses both.
// The shared expert's forward and most of its backward run while the dispatch is in flight.
//
// Tensor parallelism needs sequence parallelism: each tp rank routes its own rows through whole
// (replicated) experts, so every gradient here is a partial sum over tp (GradSync::tp) and no
// collective runs inside the block but the aux statistics' all-reduce and the ep exchange.
#include <algorithm>
#include <cmath>

#include "quintet/core/profile.hpp"
#include "quintet/core/error.hpp"
#include "quintet/model/block.hpp"

namespace quintet {

namespace {

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

int expert_width(const ModelConfig& m, const ModelDims& d) { return m.moe.ffn_dim > 0 ? m.moe.ffn_dim : d.F; }

class MoeFeedForward final : public FeedForwardBlock {
    // What the experts of this rank compute on: the rows they were sent, expert-major.
    struct Experts {
        Act x;                  // [rows, C] inputs
        float* gu;              // [rows, 2F] gate | up
        Act act;                // [rows, F]
        const int* count;       // [El] rows per local expert
        const int* offset;      // [El] first row
    };
    struct Saved {
        float* probs;        // [Nr, E]
        int32_t* expert;     // [Nr, k] chosen experts, descending score
        float* weight;       // [Nr, k]
        int32_t* slot;       // [Nr, k] row of each choice in the expert-sorted buffers (R: dropped)
        int32_t* src;        // [R] token row of each sorted row
        std::vector<int> count, offset;  // [E] kept rows per expert, first row (host)
        std::vector<int> routed;         // [E] choices per expert before the capacity (host)
        int kept = 0;                    // rows in the sorted buffers
        int count_in(int e0, int n) const {  // kept rows of experts [e0, e0 + n)
            int c = 0;
            for (int e = e0; e < e0 + n; ++e) c += count[size_t(e)];
            return c;
        }
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
          e0_(ep_ ? ep_->first_expert() : 0), k_(m.moe.top_k), F_(expert_width(m, ctx.d)),
          Fs_(m.moe.shared_experts * expert_width(m, ctx.d)), norm_(m.moe.norm_topk),
          balance_(m.moe.balance), coef_(m.moe.aux_coef), rate_(m.moe.bias_rate),
          capacity_(m.moe.capacity_factor) {
        QUINTET_CHECK(c_.tp.size() == 1 || c_.Nr < c_.N, "MoE with tp > 1 needs sequence parallelism");
        const std::string p = prefix(layer);
        wg_ = table.offset_of(p + "gate.weight");
        if (balance_ == "aux_free") bias_ = table.offset_of(p + "gate.e_score_correction_bias");
        for (int e = e0_; e < e0_ + El_; ++e) {
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
        const size_t Nr = size_t(c_.Nr), R = Nr * k_, C = size_t(c_.d.C), Rx = size_t(expert_rows());
        hn32_ = c_.scratch("moe.hn_fp32", Nr * C);
        xs32_ = c_.scratch("moe.xs_fp32", (R + 1) * C);
        logits_ = c_.scratch("moe.logits", Nr * E_);
        dy_ = c_.scratch("moe.dy", (R + 1) * C);
        dgu_ = c_.scratch("moe.dgu", Rx * 2 * F_);
        dact_ = c_.scratch("moe.dact", Rx * F_);
        dw_ = c_.scratch("moe.dweight", Nr * k_);
        stage_ = c_.scratch("moe.stage", std::max(Rx * F_, Nr * Fs_));
        if (Fs_ > 0) {
            dgu_s_ = c_.scratch("moe.dgu_shared", Nr * 2 * Fs_);
            dact_s_ = c_.scratch("moe.dact_shared", Nr * Fs_);
        }
        if (ep_) {
            xe32_ = c_.scratch("moe.xe_fp32", Rx * C);  // expert side: staging, outputs, dx
            dye_ = c_.scratch("moe.dye", Rx * C);
        }
        c_.reserve_lowp(std::max({Rx * C, Rx * 2 * size_t(F_), Nr * 2 * size_t(Fs_), Nr * C, Nr * E_}));
        counts_.assign(size_t(moe_counts_width(E_, ep_ ? ep_->size() : 1)), 0.0);
        host_expert_.resize(R);
        host_slot_.resize(R);
        host_src_.resize(R);
        host_weight_.resize(R);
        next_.resize(size_t(E_));
        host_probs_.resize(Nr * E_);
        host_stats_.resize(size_t(2 * E_ + 1));
        host_e_.resize(size_t(E_));
        host_psum_.resize(size_t(E_));
        if (capacity_ > 0) order_.reserve(R);
    }

    void add_slot() override {
        const size_t Nr = size_t(c_.Nr), R = Nr * k_, C = size_t(c_.d.C), Rx = size_t(expert_rows());
        Saved s;
        s.probs = c_.buf(Nr * E_, true);
        s.expert = c_.buf_i32(R);
        s.weight = c_.buf(R, true);
        s.slot = c_.buf_i32(R);
        s.src = c_.buf_i32(R);
        s.count.assign(size_t(E_), 0);
        s.offset.assign(size_t(E_), 0);
        s.routed.assign(size_t(E_), 0);
        s.y = c_.buf((R + 1) * C, true);
        s.xe = c_.act(Rx * C);
        s.gu = c_.buf(Rx * 2 * F_, true);
        s.act = c_.act(Rx * F_);
        if (ep_) ep_->prepare(s.x, int(Rx), int(C));
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
        {
            auto role = c_.role("gemm.router");
            c_.mm(false, true, Nr, E_, C, X, C, c_.weight(params + wg_), C, 0.0f, logits_, E_);
        }
        {
            QUINTET_PROFILE("moe.route");
            c_.be.moe_route(s.probs, s.expert, s.weight, logits_, bias_ ? params + bias_ : nullptr, Nr, E_, k_, norm_);
            plan(s);
        }
        auto role = c_.role("gemm.shared_expert");
        // Rows sorted by expert (stable in token order).
        const float* hn32 = hn.f;
        if (c_.bf16()) {
            c_.be.from_bf16(hn32_, hn.b, size_t(Nr) * C);
            hn32 = hn32_;
        }
        const Experts ex = experts_of(s);
        int rows = s.kept;
        if (!ep_) {
            float* xs = c_.produce(s.xe, xs32_);
            c_.be.gather_rows(xs, hn32, s.src, s.kept, C);
            c_.keep(s.xe, xs, size_t(s.kept) * C);
        } else {  // to the experts' ranks, the shared expert computed meanwhile
            c_.be.gather_rows(xs32_, hn32, s.src, s.kept, C);
            ep_->plan(s.x, s.count.data());
            ep_->dispatch_start(s.x, xs32_);
        }
        if (Fs_ > 0) {
            c_.mm(false, true, Nr, 2 * Fs_, C, X, C, c_.weight(params + wgu_s_), C, 0.0f, s.gu_s, 2 * Fs_);
            if (ep_) ep_->progress();
            float* as = c_.produce(s.act_s, stage_);
            c_.be.swiglu_forward(as, s.gu_s, Nr, Fs_);
            c_.keep(s.act_s, as, size_t(Nr) * Fs_);
        }
        if (ep_) {
            rows = s.x.rows;
            float* xe = c_.produce(s.xe, xe32_);
            ep_->dispatch_finish(s.x, xe);
            c_.keep(s.xe, xe, size_t(rows) * C);
        }
        // One GEMM pair per local expert over its rows.
        float* ye = ep_ ? xe32_ : s.y;
        experts_forward(ex, params, rows, ye);
        if (ep_) ep_->combine(s.x, ye, s.y);
        c_.be.zero(s.y + size_t(R) * C, size_t(C));
        // y = h + shared(x) + sum_j w_j expert_j(x), the choices summed in order.
        c_.be.copy(y, h, size_t(Nr) * C);
        if (Fs_ > 0)
            c_.mm(false, true, Nr, C, Fs_, c_.local(s.act_s), Fs_, c_.weight(params + wd_s_), Fs_, 1.0f, y, C);
        c_.be.moe_combine(y, s.y, s.slot, s.weight, Nr, k_, C);
        balance_stats(s);
        if (!c_.recomputing) {
            counts_[size_t(E_ + 4 + (ep_ ? ep_->rank() : 0))] += rows;
            if (ep_) counts_[size_t(E_ + 3)] += s.kept - s.count_in(e0_, El_);
        }
    }

    const float* backward(int slot, const float* params, float* grads, const Act& hn,
                          const float* dy) override {
        const int Nr = c_.Nr, C = c_.d.C, R = Nr * k_;
        Saved& s = slots_[size_t(slot)];
        const Mat X = c_.local(hn);
        auto role = c_.role("gemm.shared_expert");
        // Combine: d(expert outputs) and d(weights); the output gradients go to the experts.
        c_.be.moe_combine_backward(dy_, dw_, dy, s.y, s.slot, s.weight, Nr, k_, C);
        if (ep_) ep_->dispatch_start(s.x, dy_);
        // Meanwhile the shared expert (all but its dx) and the router (all but its dx).
        if (Fs_ > 0) {
            Mat D = c_.lowp(dy, size_t(Nr) * C);
            c_.mm(false, false, Nr, Fs_, C, D, C, c_.weight(params + wd_s_), Fs_, 0.0f, dact_s_, Fs_);
            c_.mm(true, false, C, Fs_, Nr, D, C, c_.local(s.act_s), Fs_, 1.0f, grads + wd_s_, Fs_);
            if (ep_) ep_->progress();
            c_.be.swiglu_backward(dgu_s_, dact_s_, s.gu_s, Nr, Fs_);
            Mat Ds = c_.lowp(dgu_s_, size_t(Nr) * 2 * Fs_);
            c_.mm(true, false, 2 * Fs_, C, Nr, Ds, 2 * Fs_, X, C, 1.0f, grads + wgu_s_, C);
        }
        c_.be.moe_route_backward(logits_, dw_, s.probs, s.expert, s.weight, s.daux, Nr, E_, k_, norm_);
        {
            auto router = c_.role("gemm.router");
            Mat Dz = c_.lowp(logits_, size_t(Nr) * E_);
            c_.mm(true, false, E_, C, Nr, Dz, E_, X, C, 1.0f, grads + wg_, C);
        }
        // The experts, down then gate|up, each over its rows; dx of their inputs.
        const float* dye = dy_;
        float* dxe = xs32_;
        int rows = s.kept;
        if (ep_) {
            ep_->dispatch_finish(s.x, dye_);
            dye = dye_, dxe = xe32_, rows = s.x.rows;
        }
        experts_backward(experts_of(s), params, grads, rows, dye, dxe);
        if (ep_) ep_->combine(s.x, dxe, xs32_);
        c_.be.zero(xs32_ + size_t(R) * C, size_t(C));
        // dx: each token's k sorted rows summed back in choice order, then the shared expert's
        // and the router's.
        float* dhn = c_.full_b;
        c_.be.zero(dhn, size_t(Nr) * C);
        c_.be.moe_combine(dhn, xs32_, s.slot, nullptr, Nr, k_, C);
        if (Fs_ > 0) {
            Mat Ds = c_.lowp(dgu_s_, size_t(Nr) * 2 * Fs_);
            c_.mm(false, false, Nr, C, 2 * Fs_, Ds, 2 * Fs_, c_.weight(params + wgu_s_), C, 1.0f, dhn, C);
        }
        auto router = c_.role("gemm.router");
        Mat Dz = c_.lowp(logits_, size_t(Nr) * E_);
        c_.mm(false, false, Nr, C, E_, Dz, E_, c_.weight(params + wg_), C, 1.0f, dhn, C);
        for (int j = 0; j < El_; ++j) {
            c_.done(grads + wd_[size_t(j)], size_t(C) * F_);
            c_.done(grads + wgu_[size_t(j)], size_t(2) * F_ * C);
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
    void take_counts(double* out) override {
        for (size_t i = 0; i < counts_.size(); ++i) out[i] += counts_[i];
        std::fill(counts_.begin(), counts_.end(), 0.0);
    }
    // aux_free (docs/math.md §9): bias_e += bias_rate * sign(mean_load - load_e), the global batch's loads.
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

    // Rows the experts of this rank may be handed: this rank's N*k choices, or under ep the
    // worst case of every rank sending min(k, El) rows per token (dropless whatever the balance).
    int expert_rows() const { return ep_ ? ep_->max_rows(c_.Nr, k_) : c_.Nr * k_; }

    Experts experts_of(const Saved& s) const {
        return {s.xe, s.gu, s.act, ep_ ? s.x.expert_rows.data() : s.count.data(),
                ep_ ? s.x.expert_off.data() : s.offset.data()};
    }

    void experts_forward(const Experts& ex, const float* params, int rows, float* out) {
        auto role = c_.role("gemm.experts");
        const int C = c_.d.C;
        for (int j = 0; j < El_; ++j)
            if (ex.count[j] > 0) {
                const size_t o = size_t(ex.offset[j]);
                c_.mm(false, true, ex.count[j], 2 * F_, C, this->rows(c_.local(ex.x), o * C), C,
                      c_.weight(params + wgu_[size_t(j)]), C, 0.0f, ex.gu + o * 2 * F_, 2 * F_);
            }
        float* act = c_.produce(ex.act, stage_);
        c_.be.swiglu_forward(act, ex.gu, rows, F_);
        c_.keep(ex.act, act, size_t(rows) * F_);
        for (int j = 0; j < El_; ++j)
            if (ex.count[j] > 0) {
                const size_t o = size_t(ex.offset[j]);
                c_.mm(false, true, ex.count[j], C, F_, this->rows(c_.local(ex.act), o * F_), F_,
                      c_.weight(params + wd_[size_t(j)]), F_, 0.0f, out + o * C, C);
            }
    }

    // From dy[rows, C] of the experts' outputs: their weight gradients, and dx[rows, C].
    void experts_backward(const Experts& ex, const float* params, float* grads, int rows, const float* dy,
                          float* dx) {
        auto role = c_.role("gemm.experts");
        const int C = c_.d.C;
        Mat Dy = c_.lowp(dy, size_t(rows) * C);
        for (int j = 0; j < El_; ++j)
            if (ex.count[j] > 0) {
                const int n = ex.count[j];
                const size_t o = size_t(ex.offset[j]);
                c_.mm(false, false, n, F_, C, this->rows(Dy, o * C), C, c_.weight(params + wd_[size_t(j)]), F_, 0.0f,
                      dact_ + o * F_, F_);
                c_.mm(true, false, C, F_, n, this->rows(Dy, o * C), C, this->rows(c_.local(ex.act), o * F_), F_,
                      1.0f, grads + wd_[size_t(j)], F_);
            }
        c_.be.swiglu_backward(dgu_, dact_, ex.gu, rows, F_);
        Mat Dgu = c_.lowp(dgu_, size_t(rows) * 2 * F_);
        for (int j = 0; j < El_; ++j)
            if (ex.count[j] > 0) {
                const int n = ex.count[j];
                const size_t o = size_t(ex.offset[j]);
                c_.mm(true, false, 2 * F_, C, n, this->rows(Dgu, o * 2 * F_), 2 * F_, this->rows(c_.local(ex.x), o * C),
                      C, 1.0f, grads + wgu_[size_t(j)], C);
                c_.mm(false, false, n, C, 2 * F_, this->rows(Dgu, o * 2 * F_), 2 * F_,
                      c_.weight(params + wgu_[size_t(j)]), C, 0.0f, dx + o * C, C);
            }
    }

    // The counting sort of the choices by expert (host): counts, offsets, each choice's sorted row
    // (slot) and each sorted row's token (src). Stable: within an expert, token order, then j.
    // Under moe.capacity_factor the choices over an expert's cap with the lowest weights get
    // slot R, the zero row.
    void plan(Saved& s) {
        const int Nr = c_.Nr, R = Nr * k_;
        c_.be.to_host_i32(host_expert_.data(), s.expert, size_t(R));
        std::fill(s.routed.begin(), s.routed.end(), 0);
        for (int i = 0; i < R; ++i) ++s.routed[size_t(host_expert_[size_t(i)])];
        s.count = s.routed;
        int dropped = 0;
        if (capacity_ > 0) {
            const int cap = int(std::ceil(capacity_ * double(k_) * double(Nr) / double(E_)));
            bool over = false;
            for (int e = 0; e < E_; ++e) over = over || s.count[size_t(e)] > cap;
            if (over) {
                c_.be.to_host(host_weight_.data(), s.weight, size_t(R));
                for (int e = 0; e < E_; ++e) {
                    if (s.count[size_t(e)] <= cap) continue;
                    order_.clear();
                    for (int i = 0; i < R; ++i)
                        if (host_expert_[size_t(i)] == e) order_.push_back(i);
                    // Keep the cap heaviest (ties: the earlier choice); mark the rest with -1.
                    std::sort(order_.begin(), order_.end(), [&](int a, int b) {
                        const float wa = host_weight_[size_t(a)], wb = host_weight_[size_t(b)];
                        return wa > wb || (wa == wb && a < b);
                    });
                    for (size_t q = size_t(cap); q < order_.size(); ++q) host_expert_[size_t(order_[q])] = -1;
                    dropped += s.count[size_t(e)] - cap;
                    s.count[size_t(e)] = cap;
                }
            }
        }
        int at = 0;
        for (int e = 0; e < E_; ++e) {
            s.offset[size_t(e)] = at;
            at += s.count[size_t(e)];
        }
        s.kept = at;
        if (!c_.recomputing) {
            for (int e = 0; e < E_; ++e) counts_[size_t(e)] += s.routed[size_t(e)];
            counts_[size_t(E_)] += dropped;
        }
        std::vector<int>& next = next_;
        std::copy(s.offset.begin(), s.offset.end(), next.begin());
        for (int i = 0; i < R; ++i) {
            const int e = host_expert_[size_t(i)];
            if (e < 0) {
                host_slot_[size_t(i)] = R;
                continue;
            }
            const int r = next[size_t(e)]++;
            host_slot_[size_t(i)] = r;
            host_src_[size_t(r)] = i / k_;
        }
        c_.be.from_host_i32(s.slot, host_slot_.data(), size_t(R));
        c_.be.from_host_i32(s.src, host_src_.data(), size_t(s.kept));
    }

    // f_e, P_e over the whole microbatch (tp and cp ranks summed), routing choices before any
    // capacity drop: the raw aux E·Σ f_e P_e, counted for /moe/aux under every balance; under
    // aux_loss the term aux_coef·aux on cp rank 0 (the loss counts it once) and its gradient
    // dL/dp_e = coef * scale * E f_e / T.
    void balance_stats(Saved& s) {
        s.aux = 0;
        const int Nr = c_.Nr;
        c_.be.to_host(host_probs_.data(), s.probs, host_probs_.size());
        std::vector<float>& st = host_stats_;  // counts | prob sums | tokens
        std::vector<double>& psum = host_psum_;
        std::fill(psum.begin(), psum.end(), 0.0);
        for (int t = 0; t < Nr; ++t)
            for (int e = 0; e < E_; ++e) psum[size_t(e)] += host_probs_[size_t(t) * E_ + e];
        for (int e = 0; e < E_; ++e) {
            st[size_t(e)] = float(s.routed[size_t(e)]);
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
        const bool counted_here = (!c_.cp || c_.cp->rank() == 0) && c_.tp.rank() == 0;
        if (!c_.recomputing && counted_here) {
            counts_[size_t(E_ + 1)] += aux;
            counts_[size_t(E_ + 2)] += 1;
        }
        if (balance_ != "aux_loss") return;
        c_.be.from_host(s.daux, daux.data(), size_t(E_));
        s.aux = (!c_.cp || c_.cp->rank() == 0) ? coef_ * aux : 0.0;
    }

    BlockContext& c_;
    ExpertParallel* const ep_;
    const int E_, El_, e0_, k_, F_, Fs_;
    const bool norm_;
    const std::string balance_;
    const double coef_, rate_, capacity_;
    size_t wg_ = 0, bias_ = 0, wgu_s_ = 0, wd_s_ = 0;
    std::vector<size_t> wgu_, wd_;  // [El] this rank's experts
    float *hn32_, *xs32_, *logits_, *dy_, *dgu_, *dact_, *dw_, *stage_;
    float *dgu_s_ = nullptr, *dact_s_ = nullptr, *xe32_ = nullptr, *dye_ = nullptr;
    std::vector<double> counts_;  // this step's counts (moe_counts_width), training forwards only
    std::vector<int32_t> host_expert_, host_slot_, host_src_;
    std::vector<float> host_weight_;
    std::vector<int> next_, order_;
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

std::unique_ptr<FeedForwardBlock> make_moe_feed_forward(BlockContext& ctx, const ModelConfig& m,
                                                        const ParamTable& table, int layer) {
    return std::make_unique<MoeFeedForward>(ctx, m, table, layer);
}

}  // namespace quintet
