#include "quintet/train/checkpointing.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"

namespace quintet {

namespace {
const std::string kCheckpointComm = "world (checkpoint I/O)";
}  // namespace

WeightsSource resolve_weights_source(Deck& deck, const MpiCommunicator& comm) {
    WeightsSource src;
    const auto& ck = deck.checkpoint;
    if (ck.resume == "auto") {
        // The newest checkpoint that verifies; each corrupt or truncated one is named and passed over.
        std::vector<std::string> bad;
        src.path = checkpoint_newest_valid(deck.output.run_dir, comm, &bad);
        for (const auto& b : bad)
            src.warnings.push_back("checkpoint " + b + " -- not loaded; " +
                                   (src.path.empty() ? "no older one verifies either: starting from scratch" : "falling back to " + src.path));
    } else if (ck.resume != "none") {
        src.path = ck.resume;
    }
    src.resume = !src.path.empty();
    if (!src.resume && !ck.init_from.empty()) src.path = ck.init_from;
    if (!src.path.empty() && ck.resume != "auto") {
        const std::string why = checkpoint_verify(src.path, comm);
        if (!why.empty())
            config_fail(src.resume ? "checkpoint.resume" : "checkpoint.init_from", src.path,
                        "the checkpoint is unusable: " + why);
    }
    auto& rope = deck.rope;
    const int T = deck.data.seq_len;
    if (src.path.empty()) {
        if (rope.scaling == "yarn" && rope.original_max_position == 0) rope.original_max_position = T;
        return src;
    }
    const CheckpointMeta meta = checkpoint_read_meta(src.path);
    src.deck = meta.deck;
    src.blend = meta.blend;
    const Deck theirs = deck_parse_text(meta.deck);
    src.trained_context = meta.trained_context > 0 ? meta.trained_context : theirs.data.seq_len;
    if (rope.scaling == "yarn" && rope.original_max_position == 0)
        rope.original_max_position = int(src.trained_context);
    auto S = [](double v) { std::ostringstream o; o << v; return o.str(); };
    if (rope.scaling == "none" && T > src.trained_context)
        src.warnings.push_back("data.seq_len = " + std::to_string(T) + " is past the context the weights of '" +
                               src.path + "' were trained at (" + std::to_string(src.trained_context) +
                               ") and rope.scaling = none: positions beyond it were never trained "
                               "(rope.scaling = yarn extends the context); proceeding");
    const auto& r2 = theirs.rope;
    if (r2.theta != rope.theta || r2.scaling != rope.scaling ||
        (rope.scaling == "yarn" && (r2.factor != rope.factor || r2.original_max_position != rope.original_max_position)))
        src.warnings.push_back("[rope] differs from the checkpoint's (theirs: theta " + S(r2.theta) + ", scaling " +
                               r2.scaling + ", factor " + S(r2.factor) + ", original_max_position " +
                               std::to_string(r2.original_max_position) + "; this run: theta " + S(rope.theta) +
                               ", scaling " + rope.scaling + ", factor " + S(rope.factor) +
                               ", original_max_position " + std::to_string(rope.original_max_position) +
                               "); the deck's settings are used");
    return src;
}

namespace {

// Why a changed key may or may not change between the source checkpoint and this run.
// Empty: refused (the key shapes the model's tensors).
std::string verdict(const DeckChange& c, bool resume) {
    const std::string& k = c.key;
    auto in = [&](const char* section) { return k.rfind(std::string(section) + ".", 0) == 0; };
    if (k == "moe.balance")  // the aux-free bias is a tensor of its own
        return (c.before == "aux_free") == (c.after == "aux_free") ? "allowed: the balancing from now on" : "";
    if (k == "moe.top_k" || k == "moe.aux_coef" || k == "moe.bias_rate" || k == "moe.bias_update" || k == "moe.norm_topk" ||
        k == "moe.capacity_factor" || k == "moe.dead_after")
        return "allowed: the routing from now on";
    // The tokenizer check (weights_tokenizer_check) has already refused any vocabulary change but
    // a growth under checkpoint.allow_tokenizer_change for init_from.
    if (k == "model.vocab_size" && !resume) return "allowed: vocabulary extension, the new rows start as the mean of the trained ones";
    if (in("model") || in("moe")) return "";
    if (in("parallel")) return "allowed: a checkpoint loads into any layout";
    // init.scheme and the base shape also set the parameter groups' learning rates and (mup) the
    // forward's multipliers, which report_changes checks on their own.
    if (in("init")) return "the weights come from the checkpoint; the parameter groups as this run says";
    if (in("groups")) return resume ? "allowed: takes effect from the resumed step" : "allowed";
    if (in("rope")) return "allowed: the positions are encoded as this run says";
    if (k == "data.path" && resume)
        return "allowed: the new sources' weights from the resumed step, each source continuing from the sample it "
               "had reached";
    if (in("train") || in("eval") || in("data"))
        return resume ? "allowed: takes effect from the resumed step" : "allowed";
    return "";  // checkpoint.*, output.*: not reported (see below)
}

}  // namespace

std::vector<std::string> report_changes(const WeightsSource& source, const Deck& deck) {
    std::vector<std::string> lines, refused;
    if (source.path.empty() || source.deck.empty()) return lines;
    Deck theirs = deck_parse_text(source.deck);
    // Checkpoints written before the vocabulary was resolved into the deck say 0 there ("from the
    // data"): not another model. The tensors' shapes, checked when they load, decide.
    if (theirs.model.vocab_size == 0) theirs.model.vocab_size = deck.model.vocab_size;
    // Another optimizer on resume: its state is not in the checkpoint (docs/reliability.md).
    const std::string& was = theirs.train.optimizer;
    const std::string& now = deck.train.optimizer;
    if (source.resume && was != now && !deck.checkpoint.allow_optimizer_change)
        throw ConfigError("train.optimizer = " + now + ": checkpoint.resume '" + source.path + "' was trained with " +
                          "train.optimizer = " + was + ", whose state (" +
                          (was == "muon" ? "Muon's momentum of the hidden and expert matrices"
                                         : "AdamW's moments of every tensor") +
                          ") is not " + now + "'s; keep train.optimizer = " + was +
                          ", or set checkpoint.allow_optimizer_change = true to start " + now +
                          "'s state at zero from the resumed step");
    for (const DeckChange& c : deck_diff(theirs, deck)) {
        if (c.key == "train.optimizer") {
            lines.push_back(c.key + ": " + c.before + " -> " + c.after + " (" +
                            (source.resume ? "allowed by checkpoint.allow_optimizer_change: " +
                                                 std::string(now == "muon" ? "Muon's momentum of the hidden and expert "
                                                                             "matrices starts at zero, the other tensors "
                                                                             "keep their AdamW moments"
                                                                           : "AdamW's moments of the matrices Muon had "
                                                                             "start at zero, the other tensors keep theirs")
                                           : "allowed: init_from starts a fresh optimizer") +
                            ")");
            continue;
        }
        if (c.key.rfind("checkpoint.", 0) == 0 || c.key.rfind("output.", 0) == 0 || c.key == "train.threads" ||
            c.key == "train.profile" || c.key == "train.collective_timeout_s" || c.key == "train.trace_steps" ||
            c.key == "train.straggler_ratio")
            continue;  // how this run is kept and watched, not what it computes
        const std::string why = verdict(c, source.resume);
        const std::string line = c.key + ": " + (c.before.empty() ? "(empty)" : c.before) + " -> " +
                                 (c.after.empty() ? "(empty)" : c.after);
        if (why.empty()) refused.push_back(line);
        else lines.push_back(line + " (" + why + ")");
    }
    // µP's forward multipliers (the logits', the attention scale's) are part of the model the
    // weights were trained as: another base shape is another model.
    if (theirs.model.logit_mult != deck.model.logit_mult || theirs.model.attn_mult != deck.model.attn_mult) {
        std::ostringstream o;
        o << "the µP forward multipliers (init.scheme, init.base_width, init.base_head_dim): logits x"
          << theirs.model.logit_mult << ", attention scale x" << theirs.model.attn_mult << " -> logits x"
          << deck.model.logit_mult << ", attention scale x" << deck.model.attn_mult;
        refused.push_back(o.str());
    }
    const std::string before = groups_text(summarise_groups(theirs.model, theirs.init, theirs.groups));
    const std::string after = groups_text(summarise_groups(deck.model, deck.init, deck.groups));
    if (before != after && refused.empty())
        lines.push_back("parameter groups (" + std::string(source.resume ? "from the resumed step" : "from step 0") +
                        "), before:\n" + before + "now:\n" + after.substr(0, after.size() - 1));
    if (!refused.empty()) {
        std::string list;
        for (const auto& r : refused) list += "\n  " + r;
        throw ConfigError(std::string(source.resume ? "checkpoint.resume" : "checkpoint.init_from") + " '" +
                          source.path + "': the checkpoint holds another model than this deck describes:" + list +
                          "\nthe checkpoint's tensors have the shapes of its deck; keep these keys as they were (or "
                          "start a new run in another output.run_dir)");
    }
    return lines;
}

Checkpointing::Checkpointing(RankModel& model, const GradientSync& sync, Optimizer& opt, std::string deck_text,
                             TokenizerState tokenizer, WeightsSource source, const FaultInjection& faults,
                             std::function<void(const std::string&)> log)
    : model_(model), sync_(sync), opt_(opt), deck_text_(std::move(deck_text)), tokenizer_(std::move(tokenizer)),
      source_(std::move(source)),
      faults_(faults), log_(std::move(log)) {
    const ProcessGrid& grid = model.grid();
    io_comm_ = grid.world().split(0, grid.rank(), kCheckpointComm);
    io_comm_->set_deadline(0);
}

Checkpointing::~Checkpointing() = default;

std::vector<ArenaRange> Checkpointing::writes() const {
    std::vector<ArenaRange> w = opt_.param_write_ranges();
    if (model_.grid().dp_cp().rank() != 0) return w;
    // Buffers (no moments): the region, or under ZeRO-2/3 each unit's buffer part.
    if (const ZeroState* z = model_.zero()) {
        for (const ZeroPiece& p : z->layout().pieces)
            if (Replicas(p.region) == Replicas::none) w.push_back({p.part, 0});
        return w;
    }
    const Range buf = model_.table().region[int(Replicas::none)];
    if (buf.size() > 0) w.push_back({buf, 0});
    return w;
}

std::vector<float> Checkpointing::whole_from_shard() const {
    // ZeRO-3: this rank's slices (and buffers) at their arena offsets -- all it writes.
    const ZeroState& z = *model_.zero();
    std::vector<float> whole(model_.table().total, 0.0f);
    for (const ZeroPiece& p : z.layout().pieces)
        model_.backend().to_host(whole.data() + p.owned.lo, z.param_shard() + p.at, p.owned.size());
    return whole;
}

void Checkpointing::save(int64_t step, int64_t tokens_seen, MetricsFile* metrics) {
    const Deck& deck = model_.deck();
    const ProcessGrid& grid = model_.grid();
    Backend& be = model_.backend();
    const ParamTable& table = model_.table();
    // Never checkpoint non-finite weights over good ones (every rank checks its arena, or its
    // ZeRO-3 slices).
    const ZeroState* z = model_.zero();
    const bool sharded_params = z && !model_.params();
    const double ss = sharded_params ? be.sumsq(z->param_shard(), z->layout().trainable + z->layout().buffers)
                                     : be.sumsq(model_.params(), table.total);
    double bad = std::isfinite(ss) ? 0.0 : 1.0;
    grid.world().all_reduce_max(&bad, 1);
    if (bad > 0) {
        const std::string msg = "the weights are not finite at step " + std::to_string(step) +
                                "; the checkpoint is not written";
        if (grid.rank() == 0) write_fault_file(deck.output.run_dir, "diverged", step, -1, msg);
        throw DivergedError(msg + " (the last good one is " + (last_.empty() ? "none" : last_) + ")");
    }
    CheckpointMeta meta;
    meta.step = step;
    meta.tokens_seen = tokens_seen;
    meta.deck = deck_text_;
    meta.layout = grid.layout().describe() + " zero=" + std::to_string(deck.parallel.zero);
    meta.trained_context = std::max<int64_t>(source_.trained_context, deck.data.seq_len);
    meta.tokenizer = tokenizer_;
    meta.param_groups = groups_text(summarise_groups(deck.model, deck.init, deck.groups));
    meta.blend = blend_;
    // On the CPU backend the arenas are host memory; a device backend stages them through host.
    const float* p = model_.params();
    OptimizerStateIo st = opt_.state(/*for_save=*/true);
    std::vector<float> hp, hm, hv;
    std::vector<std::vector<float>> hmom;
    if (sharded_params) {  // staged through host memory: a whole arena holding this rank's slices
        hp = whole_from_shard();
        p = hp.data();
    }
    if (!model_.host_arena()) {
        const size_t ns = std::max<size_t>(opt_.moment_floats(), 1);
        if (!sharded_params) {
            hp.resize(table.total);
            be.to_host(hp.data(), model_.params(), table.total);
        }
        hm.resize(ns);
        hv.resize(ns);
        be.to_host(hm.data(), opt_.exp_avg(), ns);
        be.to_host(hv.data(), opt_.exp_avg_sq(), ns);
        p = hp.data(), st.exp_avg = hm.data(), st.exp_avg_sq = hv.data();
        for (auto& w : st.momentum) {
            hmom.emplace_back(table.logical[w.logical].numel());
            be.to_host(hmom.back().data(), w.data, hmom.back().size());
            w.data = hmom.back().data();
        }
    }
    const double t0 = now_s();
    // The metrics history up to this step beside the checkpoint, complete before it is: a resume
    // rebuilds an unreadable metrics.h5 from it.
    if (metrics) metrics->snapshot_to(checkpoint_metrics_path(checkpoint_path(deck.output.run_dir, step)));
    // The whole write (its barriers and collective I/O) under the collective deadline.
    Watchdog* w = grid.watchdog();
    if (w) w->begin("checkpoint write", &kCheckpointComm, grid.rank(), grid.world().size(), uint64_t(step),
                    deck.train.collective_timeout_s, &grid.world().world_ranks());
    faults_.in_checkpoint(step);
    std::string path = checkpoint_save(*io_comm_, deck.output.run_dir, meta, table, p, writes(), st, deck.checkpoint.keep);
    if (w) w->end();
    char secs[32];
    std::snprintf(secs, sizeof secs, " (%.2f s)", now_s() - t0);
    log_("checkpoint " + path + secs);
    last_ = path;
}

int64_t Checkpointing::start(int64_t* tokens_seen) {
    const Deck& deck = model_.deck();
    const std::string& mode = deck.checkpoint.resume;
    *tokens_seen = 0;
    if (mode == "none" && !checkpoint_latest(deck.output.run_dir).empty())
        config_fail("checkpoint.resume", "none",
                    "output.run_dir '" + deck.output.run_dir +
                        "' already holds checkpoints that a fresh run would overwrite; use "
                        "checkpoint.resume=auto to continue, or another output.run_dir");
    for (const auto& w : source_.warnings) log_("warning: " + w);
    for (const auto& c : source_.changes) log_(std::string(source_.resume ? "resume" : "init_from") + ": " + c);
    if (source_.path.empty()) return 0;
    if (!source_.resume) {  // checkpoint.init_from: weights only, a fresh run from step 0
        CheckpointMeta meta = checkpoint_read_meta(source_.path);
        model_.load_weights(source_.path);
        log_("initialised the weights from " + source_.path + " (step " + std::to_string(meta.step) +
             ", written with " + meta.layout + ", trained at context " +
             std::to_string(source_.trained_context) + "); step 0, fresh optimizer and schedule");
        return 0;
    }
    const std::string& path = source_.path;
    const ParamTable& table = model_.table();
    Backend& be = model_.backend();
    CheckpointMeta meta = checkpoint_inspect(path, table);
    // Another optimizer (allowed by report_changes under checkpoint.allow_optimizer_change): the
    // state the file lacks for this run's optimizer starts at zero.
    const bool changed = meta.optimizer != deck.train.optimizer;
    OptimizerStateIo st = opt_.state(/*for_save=*/false);
    if (model_.host_arena() && model_.params()) {
        checkpoint_load(path, table, model_.params(), &st, changed);
    } else {  // a device arena, or ZeRO-3's slices: through host memory
        const size_t ns = std::max<size_t>(opt_.moment_floats(), 1);
        std::vector<float> hp(table.total), hm(ns, 0.0f), hv(ns, 0.0f);
        std::vector<std::vector<float>> hmom;
        OptimizerStateIo host = st;
        host.exp_avg = hm.data(), host.exp_avg_sq = hv.data();
        for (auto& w : host.momentum) {
            hmom.emplace_back(table.logical[w.logical].numel(), 0.0f);
            w.data = hmom.back().data();
        }
        checkpoint_load(path, table, hp.data(), &host, changed);
        if (model_.params()) be.from_host(model_.params(), hp.data(), table.total);
        else model_.load_shard(hp.data());
        be.from_host(opt_.exp_avg(), hm.data(), ns);
        be.from_host(opt_.exp_avg_sq(), hv.data(), ns);
        for (size_t i = 0; i < st.momentum.size(); ++i) be.from_host(st.momentum[i].data, hmom[i].data(), hmom[i].size());
    }
    model_.refresh_bf16_weights();
    *tokens_seen = meta.tokens_seen;
    last_ = path;
    log_("resumed from " + path + " at step " + std::to_string(meta.step) + " (written with " + meta.layout + ")");
    return meta.step;
}

}  // namespace quintet
