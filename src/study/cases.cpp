#include "quintet/study/cases.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "quintet/core/error.hpp"
#include "quintet/data/dataset.hpp"
#include "quintet/io/token_data.hpp"

namespace quintet {

std::string run_dir(const Study& st, const Case& c) { return st.dir + "/runs/" + c.name; }

std::string done_marker(const Study& st, const Case& c) { return run_dir(st, c) + "/study_done"; }

std::string failed_marker(const Study& st, const Case& c) { return run_dir(st, c) + "/study_failed"; }

namespace {

// Fills in a case's dp where its deck leaves it 0 and, given a global batch (> 0), the
// microbatches that make it; returns why the trainer would refuse the case, or "".
std::string check_case(Deck& d, int dp, int mp, int w, int64_t global_batch) {
    if (d.parallel.dp == 0 && dp > 0) d.parallel.dp = dp;
    if (global_batch > 0 && dp > 0 && global_batch % (int64_t(dp) * d.data.micro_batch_size) == 0)
        d.parallel.microbatches = int(global_batch / (int64_t(dp) * d.data.micro_batch_size));
    try {
        if (dp == 0)
            throw ConfigError("tp x cp x pp = " + std::to_string(mp) + " does not divide the world size " + std::to_string(w));
        deck_validate(d, w, false);
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

// A [laws] study: every (budget, shape, seed) on the study's one world, layout and thread count,
// trained on D = C / (6 N) tokens with N counted as the study says.
std::vector<Case> make_laws_cases(const Study& st) {
    const LawsSpec& L = st.laws;
    const Deck base0 = deck_load(st.base, {});
    const DataInfo data = data_info(base0.data.path);
    if (base0.eval.batches < 1)
        throw ConfigError("study: a [laws] study fits each run's final validation loss: the base deck's eval.batches = " +
                          std::to_string(base0.eval.batches) + " evaluates nothing (set it to at least 1)");
    if (base0.data.val_path.empty() && !(base0.data.val_fraction > 0))
        throw ConfigError("study: a [laws] study fits each run's final validation loss: the base deck has no validation data "
                          "(data.val_fraction = 0 and no data.val_path)");
    const int w = st.worlds.at(0), t = st.threads.at(0);
    const auto& lay = st.layouts.at(0);
    const int64_t gb = st.global_batch > 0             ? st.global_batch
                       : base0.train.global_batch > 0 ? base0.train.global_batch
                                                      : int64_t(base0.data.micro_batch_size) * base0.parallel.microbatches;
    const double tokens_per_step = double(gb) * base0.data.seq_len;
    std::vector<Shape> shapes = L.shapes;
    for (int width : L.family.widths) shapes.push_back(family_shape(L.family, base0, width));
    std::vector<int64_t> seeds = st.seeds;
    if (seeds.empty()) seeds.push_back(base0.train.seed);
    std::vector<Case> cases;
    for (double C : L.budgets)
        for (const Shape& shape : shapes)
            for (int64_t seed : seeds) {
                Case c;
                c.world = w, c.threads = t;
                c.name = budget_tag(C) + "_" + shape.name + (seeds.size() > 1 ? "_s" + std::to_string(seed) : "");
                std::vector<std::string> ov;
                for (const auto& [k, v] : shape.keys) ov.push_back("--" + k + "=" + v);
                for (const auto& [k, v] : lay) ov.push_back("--parallel." + k + "=" + v);
                ov.push_back("--train.seed=" + std::to_string(seed));
                ov.push_back("--train.global_batch=" + std::to_string(gb));
                Deck d = deck_load(st.base, ov);
                d.model.vocab_size = data.vocab_size;
                LawsRun& r = c.laws;
                r.budget = C, r.shape = shape.text();
                r.counts = count_params(d.model);
                r.n = r.counts.of(L.params);
                // D = C / 6N tokens, in whole steps of the global batch: the run's schedule ends with it.
                r.steps = std::llround(C / (6.0 * r.n) / tokens_per_step);
                r.tokens = double(r.steps) * tokens_per_step;
                char why[300];
                if (r.steps < 1) {
                    std::snprintf(why, sizeof why, "budget %.3g gives N = %.4g parameters %.4g tokens, less than one step of %.4g",
                                  C, r.n, C / (6.0 * r.n), tokens_per_step);
                    c.skip = why;
                }
                if (L.warmup_fraction >= 0) {
                    d.train.warmup = int(std::floor(L.warmup_fraction * double(r.steps)));
                    ov.push_back("--train.warmup=" + std::to_string(d.train.warmup));
                } else if (c.skip.empty() && d.train.warmup >= r.steps) {
                    std::snprintf(why, sizeof why, "budget %.3g gives N = %.4g parameters %lld steps, not more than train.warmup = %d "
                                  "(raise the budget, or set [laws] warmup_fraction)", C, r.n, (long long)r.steps, d.train.warmup);
                    c.skip = why;
                }
                d.train.steps = r.steps;
                d.eval.every = int(std::max<int64_t>(1, r.steps));
                ov.push_back("--train.steps=" + std::to_string(r.steps));
                ov.push_back("--eval.every=" + std::to_string(d.eval.every));
                const auto& p = d.parallel;
                const int mp = p.tp * p.cp * p.pp;
                const int dp = p.dp > 0 ? p.dp : (w % mp == 0 ? w / mp : 0);
                if (c.skip.empty()) c.skip = check_case(d, dp, mp, w, gb);
                ov.push_back("--output.run_dir=" + run_dir(st, c));
                ov.push_back("--train.threads=" + std::to_string(t));
                c.overrides = ov;
                c.deck = d;
                cases.push_back(c);
            }
    return cases;
}

}  // namespace

// Every case of the study (and, with parity, the single-rank references).
std::vector<Case> make_cases(const Study& st, bool parity) {
    if (st.laws.present) return make_laws_cases(st);
    const Deck base0 = deck_load(st.base, {});
    const DataInfo data = data_info(base0.data.path);
    std::vector<std::vector<std::pair<std::string, std::string>>> grid{{}};
    for (const auto& [key, vals] : st.vary) {
        std::vector<std::vector<std::pair<std::string, std::string>>> next;
        for (const auto& g : grid)
            for (const auto& v : vals) {
                auto h = g;
                h.push_back({key, v});
                next.push_back(h);
            }
        grid = next;
    }
    std::set<std::string> multi;  // vary keys with more than one value name the runs
    for (const auto& [key, vals] : st.vary)
        if (vals.size() > 1) multi.insert(key);
    std::vector<int64_t> seeds = st.seeds;
    if (seeds.empty()) seeds.push_back(base0.train.seed);
    std::vector<Case> cases;
    std::map<std::string, size_t> refs;
    for (int w : st.worlds)
        for (const auto& lay : st.layouts)
            for (int t : st.threads)
                for (int64_t seed : seeds)
                    for (const auto& g : grid) {
                        Case c;
                        c.world = w, c.threads = t;
                        std::vector<std::string> ov;
                        for (const auto& [k, v] : g) ov.push_back("--" + k + "=" + v);
                        for (const auto& [k, v] : lay) ov.push_back("--parallel." + k + "=" + v);
                        ov.push_back("--train.seed=" + std::to_string(seed));
                        if (st.steps > 0) ov.push_back("--train.steps=" + std::to_string(st.steps));
                        Deck d = deck_load(st.base, ov);
                        d.model.vocab_size = data.vocab_size;
                        const auto& p = d.parallel;
                        const int mp = p.tp * p.cp * p.pp;
                        int dp = p.dp > 0 ? p.dp : (w % mp == 0 ? w / mp : 0);
                        if (st.scaling == "weak" && d.train.global_batch > 0) {
                            ov.push_back("--train.global_batch=0");  // each replica keeps its batch
                            d.train.global_batch = 0;
                        }
                        if (dp > 0 && st.scaling == "strong") {
                            // study.global_batch, else the base deck's train.global_batch, else its one-replica batch.
                            const int gb = st.global_batch > 0           ? st.global_batch
                                           : base0.train.global_batch > 0 ? int(base0.train.global_batch)
                                                                          : base0.data.micro_batch_size * base0.parallel.microbatches;
                            const int per = gb / dp;
                            if (lay.count("microbatches")) {
                                // The layout fixes the microbatches: the microbatch size gives way.
                                const int mb = d.parallel.microbatches;
                                if (gb % dp || per % mb) {
                                    c.skip = "strong scaling: global_batch " + std::to_string(gb) + " is not a multiple of dp " +
                                             std::to_string(dp) + " x parallel.microbatches " + std::to_string(mb);
                                } else {
                                    ov.push_back("--data.micro_batch_size=" + std::to_string(per / mb));
                                    d.data.micro_batch_size = per / mb;
                                }
                            } else if (gb % dp || per % d.data.micro_batch_size) {
                                c.skip = "strong scaling: global_batch " + std::to_string(gb) + " is not a multiple of dp " +
                                         std::to_string(dp) + " x data.micro_batch_size " + std::to_string(d.data.micro_batch_size);
                            } else {
                                ov.push_back("--parallel.microbatches=" + std::to_string(per / d.data.micro_batch_size));
                                d.parallel.microbatches = per / d.data.micro_batch_size;
                            }
                        }
                        std::string name = "w" + std::to_string(w);
                        for (const char* k : {"tp", "cp", "pp", "ep", "dp"}) {
                            auto it = lay.find(k);
                            if (it != lay.end()) name += std::string("_") + k + it->second;
                        }
                        for (const auto& [k, v] : lay)
                            if (std::string("tp cp pp ep dp").find(k) == std::string::npos) name += "_" + k + v;
                        name += "_t" + std::to_string(t) + "_s" + std::to_string(seed);
                        for (const auto& [k, v] : g)
                            if (multi.count(k)) name += "_" + k.substr(k.find('.') + 1) + v;
                        c.name = name;
                        if (c.skip.empty()) c.skip = check_case(d, dp, mp, w, 0);
                        ov.push_back("--output.run_dir=" + run_dir(st, c));
                        ov.push_back("--train.threads=" + std::to_string(t));
                        c.overrides = ov;
                        c.deck = d;
                        if (parity && c.skip.empty() && w > 1) {
                            // The single-rank run of the same global batch: dp x microbatches microbatches.
                            Case r;
                            r.is_reference = true;
                            r.world = 1, r.threads = t;
                            std::vector<std::string> rov;
                            for (const auto& [k, v] : g) rov.push_back("--" + k + "=" + v);
                            rov.push_back("--train.seed=" + std::to_string(seed));
                            if (st.steps > 0) rov.push_back("--train.steps=" + std::to_string(st.steps));
                            const int mb = d.parallel.dp * d.parallel.microbatches;
                            rov.push_back("--parallel.microbatches=" + std::to_string(mb));
                            r.name = "ref_mb" + std::to_string(mb) + "_t" + std::to_string(t) + "_s" + std::to_string(seed);
                            for (const auto& [k, v] : g)
                                if (multi.count(k)) r.name += "_" + k.substr(k.find('.') + 1) + v;
                            // The reference also carries the microbatch size strong scaling chose.
                            r.name += "_b" + std::to_string(d.data.micro_batch_size);
                            rov.push_back("--data.micro_batch_size=" + std::to_string(d.data.micro_batch_size));
                            c.reference = r.name;
                            if (!refs.count(r.name)) {
                                r.deck = deck_load(st.base, rov);
                                r.deck.model.vocab_size = data.vocab_size;
                                r.deck.parallel.dp = 1;
                                rov.push_back("--output.run_dir=" + run_dir(st, r));
                                rov.push_back("--train.threads=" + std::to_string(t));
                                r.overrides = rov;
                                refs[r.name] = cases.size();
                                cases.push_back(r);
                            }
                        }
                        cases.push_back(c);
                    }
    return cases;
}

}  // namespace quintet
