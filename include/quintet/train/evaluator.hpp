// Validation loss of the rank's model (docs/math.md §10, docs/data.md): the mean cross-entropy
// (no auxiliary loss) over eval.batches fixed batches of data.micro_batch_size samples of each
// validation source (eval.batches = 0: every whole batch of it), forward only through the
// pipeline; the overall loss weighs every evaluated token alike. Used by the trainer every eval.every steps and by
// `quintet eval` on its own; it shares the model, and writes nothing.
#pragma once
#include <string>
#include <vector>

#include "quintet/data/sampler.hpp"
#include "quintet/train/rank_model.hpp"

namespace quintet {

class Evaluator {
public:
    // Stops with a ConfigError (data.val_fraction / data.val_path) when a validation split is
    // shorter than a sample. `each_token_once` (quintet eval): a source whose split holds fewer
    // whole batches than eval.batches is evaluated on those only (notes() says so, with both
    // numbers); otherwise (training) its samples wrap around the split and notes() warns.
    Evaluator(RankModel& model, const Sampler& sampler, bool each_token_once = false);
    // Mean validation cross-entropy (collective); NaN when a stop signal interrupted it.
    // by_position (rank 0, when given): the mean cross-entropy at each position of the samples [T].
    // per_source (when given): the mean cross-entropy of each validation source.
    double evaluate(std::vector<double>* by_position = nullptr, std::vector<double>* per_source = nullptr);
    // Target tokens one evaluation counts.
    int64_t tokens() const;
    // Batches evaluated of validation source v.
    int64_t batches(int v) const;
    // One line per source whose split holds fewer whole batches than eval.batches asks for.
    const std::vector<std::string>& notes() const { return notes_; }

private:
    RankModel& model_;
    const Sampler& sampler_;
    bool each_token_once_ = false;
    std::vector<std::string> notes_;
    std::vector<int32_t> ids_, tgt_;
};

}  // namespace quintet
