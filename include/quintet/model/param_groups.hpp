// Parameter groups: what each tensor is to the optimizer and the initialisation -- its group,
// its init std, and its learning-rate and weight-decay multipliers -- as the deck's init.scheme
// says (docs/math.md "µP", docs/scaling-laws.md). Under init.scheme = mup (the maximal update
// parametrisation for AdamW, with the base shape of [init]) a learning rate tuned at the base
// width carries to other widths; the other schemes give every group multiplier 1. The groups'
// multipliers may be set by hand ([groups] in the deck); AdamW applies them per tensor, Muon takes
// the hidden matrices and experts.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "quintet/model/params.hpp"

namespace quintet {

enum class ParamGroup { embedding, hidden, output, norm, router, expert, buffer };
constexpr int kNumParamGroups = 7;
const char* group_name(ParamGroup g);  // "embedding", "hidden", ...

// A group's multipliers as the deck sets them: negative = the scheme's ("auto").
struct GroupOverrides {
    std::array<double, kNumParamGroups> lr{-1, -1, -1, -1, -1, -1, -1}, wd{-1, -1, -1, -1, -1, -1, -1};
};

// One tensor's rule.
struct TensorRule {
    ParamGroup group = ParamGroup::hidden;
    double std = 0;        // init std of a normal-initialised tensor (ones/zeros ignore it)
    double lr_mult = 1.0;  // of train.lr
    double wd_mult = 1.0;  // of train.weight_decay (applied to rank >= 2 tensors only)
    double width_mult = 1.0;  // the multiplier of its fan-in against the base shape (mup; else 1)
};

// The width multipliers of the µP base shape: m = d_model / base_width, m_ffn = F / base_ffn
// (m where base_ffn = 0), and the attention score multiplier sqrt(base_head_dim / head_dim).
struct MupShape {
    double width = 1.0, ffn = 1.0, attn = 1.0;
};
MupShape mup_shape(const ModelConfig& m, const InitConfig& init);

// The group of a tensor, by its Hugging Face name (and whether it is trained).
ParamGroup param_group(const ParamSpec& s);
ParamGroup param_group(const LogicalTensor& t);

// Under train.optimizer = muon, Muon updates exactly the 2-D matrices of the hidden and expert
// groups (each Hugging Face tensor on its own: q, k and v apart, gate and up apart, each expert's
// matrices one expert at a time); every other tensor keeps AdamW (docs/math.md, "Muon").
bool muon_takes(const ParamSpec& s);
bool muon_takes(const LogicalTensor& t);

// A tensor's rule under the scheme (its logical shape and init rule from `s`), the deck's
// overrides applied.
TensorRule tensor_rule(const ParamSpec& s, const ModelConfig& m, const InitConfig& init, const GroupOverrides& over = {});

// The rule of every tensor of `t` (t.specs order).
std::vector<TensorRule> tensor_rules(const ParamTable& t, const ModelConfig& m, const InitConfig& init,
                                     const GroupOverrides& over);

// Each group of the whole model with its tensors, elements and multipliers, for the start-up
// table and the checkpoint's record.
struct GroupSummary {
    ParamGroup group = ParamGroup::hidden;
    int tensors = 0;
    size_t elements = 0;
    double lr_min = 0, lr_max = 0, wd = 1, std_min = 0, std_max = 0;
};
std::vector<GroupSummary> summarise_groups(const ModelConfig& m, const InitConfig& init, const GroupOverrides& over);
// One line per group ("hidden      14 tensors   2.10M   lr x0.25-0.5   wd x1   init std 0.01-0.0141").
std::string groups_text(const std::vector<GroupSummary>& g);

}  // namespace quintet
