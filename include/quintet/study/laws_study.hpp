// A scaling-law study (docs/scaling-laws.md, "Study decks for laws"): the study deck's [laws]
// section lists FLOP budgets and a model family (a list of shapes, or a rule: widths with depth
// and heads derived from an aspect ratio and a head dim), and how N is counted. Each (budget,
// shape) is one run trained on D = C / (6 N) tokens: train.steps follows from D and the global
// batch, so the cosine schedule ends with the run.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "quintet/deck/deck.hpp"

namespace quintet {

// One model shape: deck keys and values ("model.d_model" -> "128", ...), and a short name.
struct Shape {
    std::string name;
    std::vector<std::pair<std::string, std::string>> keys;
    std::string text() const;  // "model.d_model=128 model.n_layers=4 ..."
};

// A family rule: `widths=64,96,128 aspect=32 head_dim=32 ffn_ratio=2.75 q_per_kv=1`.
// n_layers = max(1, round(width / aspect)), n_heads = width / head_dim, n_kv_heads = n_heads /
// q_per_kv, ffn_dim = ffn_ratio x width rounded to a multiple of 8. Omitted values come from
// the base deck's shape (its d_model / n_layers, d_model / n_heads, ffn_dim / d_model,
// n_heads / n_kv_heads; a base ffn_dim of 0 keeps the model's own default); widths may be
// omitted only where the caller enumerates them (`quintet plan --family`).
struct FamilyRule {
    std::vector<int> widths;
    double aspect = 0, ffn_ratio = -1;  // 0 / -1: from the base deck
    int head_dim = 0, q_per_kv = 0;     // 0: from the base deck
    std::string text;                   // as written
};
FamilyRule parse_family(const std::string& text, const std::string& key);  // key: for messages
// The shape of `width` under the rule, the base deck filling what the rule leaves open. Throws
// ConfigError when the width does not split into heads of head_dim (or kv heads).
Shape family_shape(const FamilyRule& rule, const Deck& base, int width);

// The shapes a plan may pick from: the rule's widths, or (none given) every width that splits
// into whole heads and kv heads, from one head up to 65536.
std::vector<Shape> family_candidates(const FamilyRule& rule, const Deck& base);

// ';'-separated shapes of model keys ("d_model=64 n_layers=2; d_model=128 n_layers=4"), each
// key and value checked as the deck checks it; `key` names the source in messages.
std::vector<Shape> parse_shapes(const std::string& text, const std::string& key);

// Parameters of a model, counted three ways: total (every trained tensor), non_embedding
// (without the token embedding and the LM head), active (what a token multiplies: the LM head
// included, the embedding lookup not, only the k routed experts of a MoE layer -- the P of the
// 6 N D convention).
struct ParamCounts {
    double total = 0, non_embedding = 0, active = 0;
    double of(const std::string& kind) const;  // "total" | "non_embedding" | "active"
};
ParamCounts count_params(const ModelConfig& m);  // m.vocab_size set

struct LawsSpec {
    bool present = false;
    std::vector<double> budgets;  // FLOPs, C = 6 N D
    std::vector<Shape> shapes;    // a list of shapes ...
    FamilyRule family;            // ... or a rule (family.text non-empty)
    std::string params = "active";
    double smooth = 0.1;            // the smoothed final training loss: over this last fraction of the steps
    double warmup_fraction = -1;    // train.warmup = this x the run's steps (-1: the base deck's warmup)
    std::string family_text() const;  // the rule, or the shapes ';'-separated (study.h5's laws_family)
};

// The [laws] section's keys (without the "laws." prefix); throws ConfigError naming a bad one.
LawsSpec read_laws_section(const std::map<std::string, std::string>& kv);

// The loss at the last step of a run, smoothed: a least-squares line through the last
// max(5, fraction x steps) losses, evaluated at the last step (a mean would lag behind a loss
// that is still falling).
double smoothed_final(const std::vector<double>& loss, double fraction);

// "C1e13", "C3.2e14": a budget in a run's name.
std::string budget_tag(double C);

}  // namespace quintet
