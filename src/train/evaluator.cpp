#include "quintet/train/evaluator.hpp"

#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/train/signals.hpp"

namespace quintet {

Evaluator::Evaluator(RankModel& model, const Sampler& sampler) : model_(model), sampler_(sampler) {
    const auto& dc = model.deck().data;
    if (sampler_.val_len() < size_t(dc.seq_len) + 1)
        config_fail("data.val_fraction", deck_value(model.deck(), "data.val_fraction"),
                    "eval.every > 0 but the validation split has only " +
                        std::to_string(sampler_.val_len()) + " tokens; need at least seq_len + 1");
    ids_.resize(size_t(dc.micro_batch_size) * dc.seq_len);
    tgt_.resize(ids_.size());
}

// Forward only, through the pipeline virtual stage by virtual stage; batch i runs on replica i % dp.
double Evaluator::evaluate(std::vector<double>* by_position) {
    const Deck& deck = model_.deck();
    const ProcessGrid& grid = model_.grid();
    const int mbs = deck.data.micro_batch_size, T = deck.data.seq_len;
    const int dp = grid.dp().size(), r = grid.coord(kDP);
    std::vector<double> pos_sum(by_position ? size_t(T) : 0, 0.0);
    const ModelChunk& last = *model_.chunks().back();
    double sum = 0.0;
    // Under expert parallelism the replicas of an ep group exchange tokens in every forward, and
    // under ZeRO-3 they gather each unit's parameters together, so each runs as many forwards as
    // the busiest one (a replica without a batch of its own repeats batch 0 and counts nothing).
    const bool lockstep = model_.ep() || (model_.zero() && model_.zero()->level() == 3);
    const int nb = deck.eval.batches, rounds = (nb + dp - 1) / dp;
    for (int round = 0; round < rounds; ++round) {
        // A stop signal ends a long evaluation too (agreed on by every rank each round).
        if (stop_agreed(grid.world())) return std::nan("");
        const int i = round * dp + r;
        const bool counted = i < nb;
        if (!counted && !lockstep) continue;
        for (int j = 0; j < mbs; ++j)
            sampler_.val_sample(counted ? i : 0, j, mbs, ids_.data() + size_t(j) * T, tgt_.data() + size_t(j) * T);
        const double loss = model_.executor().forward_only(model_.params(), ids_.data(), tgt_.data());
        if (!counted) continue;
        sum += loss;
        if (by_position && last.plan().last) {
            const auto& l = last.token_losses();
            for (size_t n = 0; n < l.size(); ++n) pos_sum[size_t(last.position_of_row(int(n)))] += l[n];
        }
    }
    grid.pp().all_reduce_sum(&sum, 1);
    grid.dp_cp().all_reduce_sum(&sum, 1);  // cp ranks hold disjoint tokens of each sample
    if (by_position) {
        grid.pp().all_reduce_sum(pos_sum.data(), pos_sum.size());
        grid.dp_cp().all_reduce_sum(pos_sum.data(), pos_sum.size());
        const double samples = double(deck.eval.batches) * mbs;
        by_position->resize(size_t(T));
        for (int t = 0; t < T; ++t) (*by_position)[size_t(t)] = pos_sum[size_t(t)] / samples;
    }
    return sum / (double(deck.eval.batches) * mbs * T);
}

}  // namespace quintet
