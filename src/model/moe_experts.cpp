#include "moe_experts.hpp"


namespace quintet {

namespace {
constexpr F32Buf kGateUp{"moe.gate_up"}, kDact{"moe.dact"}, kStage{"moe.stage"};

LinearDecl gate_up_decl(size_t Rx, size_t C, size_t F) {
    return {"moe.experts_gate_up", Rx, C, 2 * F, LinearInput::kept, {kGateUp.name}, true};
}
LinearDecl down_decl(size_t Rx, size_t C, size_t F, std::string_view y_sorted = {}) {
    LinearDecl d{"moe.experts_down", Rx, F, C, LinearInput::kept};
    if (!y_sorted.empty()) d.over = {y_sorted};
    return d;
}
// Each local expert's gate|up (checked adjacent: one GEMM) or down_proj.
std::vector<std::string> tensors(const ParamTable& t, const std::string& prefix, int e0, int El, bool gate_up) {
    std::vector<std::string> out;
    for (int e = e0; e < e0 + El; ++e) {
        const std::string q = prefix + "experts." + std::to_string(e) + ".";
        out.push_back(gate_up ? fused_weight(t, q, {"gate_proj", "up_proj"}) : q + "down_proj.weight");
    }
    return out;
}
}  // namespace

void MoeExperts::declare_saved(BufferDecl& out, size_t Rx, size_t C, size_t F) {
    declare_input(out, gate_up_decl(Rx, C, F));  // their inputs
    out.per_slot(kGateUp, Rx * 2 * F, true);         // the SwiGLU's input (B's only)
    declare_input(out, down_decl(Rx, C, F));     // the activation, down's input
}

void MoeExperts::declare_grads(BufferDecl& out, size_t Rx, size_t C, size_t F, std::string_view y_sorted,
                               const BufferShape& s) {
    declare_grad(out, down_decl(Rx, C, F, y_sorted), s);  // once the combine's backward has read y
    declare_grad(out, gate_up_decl(Rx, C, F), s);         // once the SwiGLU's backward has read gate|up
}

void MoeExperts::declare_scratch(BufferDecl& out, size_t Rx, size_t F) { out.scratch(kDact, Rx * F); }

MoeExperts::MoeExperts(BlockContext& c, const ParamTable& table, const std::string& prefix, int e0, int El, int F,
                       int Rx)
    : c_(c), F_(F),
      gate_up_(c.lin, table, gate_up_decl(size_t(Rx), size_t(c.d.C), size_t(F)), tensors(table, prefix, e0, El, true),
               "gemm.experts"),
      down_(c.lin, table, down_decl(size_t(Rx), size_t(c.d.C), size_t(F)), tensors(table, prefix, e0, El, false),
            "gemm.experts") {
    dact_ = c_.shared()[kDact];
    stage_ = c_.shared()[kStage];
}

void MoeExperts::add_slot(const BufferViews& saved) {
    gate_up_.add_slot(saved);
    gu_.push_back(saved[kGateUp]);
    down_.add_slot(saved);
}

void MoeExperts::add_w_slot(const BufferViews& w) {
    gate_up_.add_w_slot(w);
    down_.add_w_slot(w);
}

void MoeExperts::forward(int slot, const Groups& g, int rows, float* out, const float* params) {
    float* gu = gu_[size_t(slot)];
    gate_up_.forward(slot, g, gu, params);
    float* act = down_.input(slot, stage_);
    c_.be.swiglu_forward(act, gu, rows, F_);
    down_.input_written(slot, act, size_t(rows));
    down_.forward(slot, g, out, params);
}

void MoeExperts::backward_input(int slot, int wslot, const Groups& g, int rows, const float* dy, float* dx,
                                const float* params) {
    down_.backward_input(wslot, g, dy, rows, dact_, params);
    float* dgu = gate_up_.grad_target(wslot);
    c_.be.swiglu_backward(dgu, dact_, gu_[size_t(slot)], rows, F_);
    gate_up_.backward_input(wslot, g, dgu, rows, dx, params);
}

void MoeExperts::backward_weight(int slot, int wslot, const Groups& g, float* grads) {
    down_.backward_weight(slot, wslot, g, grads);
    gate_up_.backward_weight(slot, wslot, g, grads);
}

}  // namespace quintet
