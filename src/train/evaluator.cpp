#include "quintet/train/evaluator.hpp"

#include <algorithm>
#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/train/signals.hpp"

namespace quintet {

Evaluator::Evaluator(RankModel& model, const Sampler& sampler, bool each_token_once)
    : model_(model), sampler_(sampler), each_token_once_(each_token_once) {
    const Deck& deck = model.deck();
    const auto& dc = deck.data;
    for (int v = 0; v < int(sampler_.val_sources().size()); ++v) {
        const Source& src = sampler_.val_sources()[size_t(v)];
        if (src.len < int64_t(dc.seq_len) + 1) {
            if (dc.val_path.empty())
                config_fail("data.val_fraction", deck_value(deck, "data.val_fraction"),
                            "eval.every > 0 but the validation split of '" + src.spec + "' has only " +
                                std::to_string(src.len) + " tokens; need at least seq_len + 1");
            config_fail("data.val_path", dc.val_path, "source '" + src.spec + "' has only " + std::to_string(src.len) +
                                                          " tokens; need at least seq_len + 1");
        }
        const int64_t whole = sampler_.val_batches(v, dc.micro_batch_size, 0);
        if (deck.eval.batches == 0 && whole < 1)
            config_fail("eval.batches", "0", "validation source '" + src.spec + "' holds fewer than micro_batch_size = " +
                                                 std::to_string(dc.micro_batch_size) + " whole samples; give eval.batches > 0");
        if (deck.eval.batches > whole) {
            // Batches past the split's whole ones wrap around it: tokens counted twice.
            const std::string what = "eval.batches = " + std::to_string(deck.eval.batches) + " batches of " +
                                     std::to_string(dc.micro_batch_size) + " x " + std::to_string(dc.seq_len) +
                                     " tokens, but the validation split of '" + src.spec + "' (" +
                                     std::to_string(src.len) + " tokens) holds " + std::to_string(whole) + " whole batch" +
                                     (whole == 1 ? "" : "es");
            if (each_token_once_ && whole < 1)
                config_fail("eval.batches", std::to_string(deck.eval.batches),
                            what + ": it cannot be evaluated at this data.seq_len and data.micro_batch_size");
            notes_.push_back(each_token_once_
                                 ? what + ": evaluating those " + std::to_string(whole) +
                                       " (each token once) instead of " + std::to_string(deck.eval.batches)
                                 : what + ": the samples past them wrap around the split, so the validation loss counts "
                                          "tokens more than once; lower eval.batches to " +
                                       std::to_string(std::max<int64_t>(whole, 1)) + " or less to count each once");
        }
    }
    ids_.resize(size_t(dc.micro_batch_size) * dc.seq_len);
    tgt_.resize(ids_.size());
}

int64_t Evaluator::batches(int v) const {
    const auto& d = model_.deck();
    const int64_t asked = sampler_.val_batches(v, d.data.micro_batch_size, d.eval.batches);
    return each_token_once_ ? std::min(asked, sampler_.val_batches(v, d.data.micro_batch_size, 0)) : asked;
}

int64_t Evaluator::tokens() const {
    const auto& d = model_.deck();
    int64_t n = 0;
    for (int v = 0; v < int(sampler_.val_sources().size()); ++v) n += batches(v);
    return n * d.data.micro_batch_size * d.data.seq_len;
}

// Forward only, through the pipeline virtual stage by virtual stage; batch i of a source runs on
// replica i % dp.
double Evaluator::evaluate(std::vector<double>* by_position, std::vector<double>* per_source) {
    const Deck& deck = model_.deck();
    const ProcessGrid& grid = model_.grid();
    const int mbs = deck.data.micro_batch_size, T = deck.data.seq_len;
    const int dp = grid.dp().size(), r = grid.coord(kDP);
    std::vector<double> pos_sum(by_position ? size_t(T) : 0, 0.0);
    const ModelChunk& last = *model_.chunks().back();
    const bool lockstep = model_.ep() || (model_.zero() && model_.zero()->level() == 3);
    const int nv = int(sampler_.val_sources().size());
    std::vector<double> sums(size_t(nv), 0.0);
    double total_batches = 0;
    for (int v = 0; v < nv; ++v) {
        double& sum = sums[size_t(v)];
        // Under expert parallelism the replicas of an ep group exchange tokens in every forward, and
        // under ZeRO-3 they gather each unit's parameters together, so each runs as many forwards as
        // the busiest one (a replica without a batch of its own repeats batch 0 and counts nothing).
        const int64_t nb = batches(v), rounds = (nb + dp - 1) / dp;
        total_batches += double(nb);
        for (int64_t round = 0; round < rounds; ++round) {
            // A stop signal ends a long evaluation too (agreed on by every rank each round).
            if (stop_agreed(grid.world())) return std::nan("");
            const int64_t i = round * dp + r;
            const bool counted = i < nb;
            if (!counted && !lockstep) continue;
            for (int j = 0; j < mbs; ++j)
                sampler_.val_sample(v, counted ? i : 0, j, mbs, ids_.data() + size_t(j) * T, tgt_.data() + size_t(j) * T);
            const double loss = model_.executor().forward_only(model_.params(), ids_.data(), tgt_.data());
            if (!counted) continue;
            sum += loss;
            if (by_position && last.plan().last) {
                const auto& l = last.token_losses();
                for (size_t n = 0; n < l.size(); ++n) pos_sum[size_t(last.position_of_row(int(n)))] += l[n];
            }
        }
    }
    grid.pp().all_reduce_sum(sums.data(), sums.size());
    grid.dp_cp().all_reduce_sum(sums.data(), sums.size());  // cp ranks hold disjoint tokens of each sample
    if (by_position) {
        grid.pp().all_reduce_sum(pos_sum.data(), pos_sum.size());
        grid.dp_cp().all_reduce_sum(pos_sum.data(), pos_sum.size());
        const double samples = total_batches * mbs;
        by_position->resize(size_t(T));
        for (int t = 0; t < T; ++t) (*by_position)[size_t(t)] = pos_sum[size_t(t)] / samples;
    }
    if (per_source) {
        per_source->resize(size_t(nv));
        for (int v = 0; v < nv; ++v)
            (*per_source)[size_t(v)] =
                sums[size_t(v)] / (double(batches(v)) * mbs * T);
    }
    double sum = 0;
    for (double x : sums) sum += x;
    return sum / (total_batches * mbs * T);
}

}  // namespace quintet
