#include "quintet/train/checkpointing.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/metrics_schema.hpp"
#include "quintet/perf/host_peak.hpp"
#include "quintet/perf/planner.hpp"
#include "quintet/train/signals.hpp"

namespace quintet {

namespace {
const std::string kCheckpointComm = "world (checkpoint I/O)";

std::string mib(double bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / 1048576.0);
    return b;
}
std::string secs(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f s", s);
    return b;
}

// The state of a background write, as every rank reports it in step_end's all-reduce (the
// largest value wins): nothing to do, still writing, failed, past its deadline.
enum WriteState : int { kIdleOrDone = 0, kWriting = 1, kFailed = 2, kOverdue = 3 };

// Whether all n floats are finite (an exponent not all ones); one read pass.
bool all_finite(const float* v, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, v + i, 4);
        bad |= uint32_t((~b & 0x7f800000u) == 0);
    }
    return bad == 0;
}

// dst = src (host memory), and whether all n floats are finite: the staging copy and the
// finiteness check in one pass.
bool copy_all_finite(float* dst, const float* src, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, src + i, 4);
        std::memcpy(dst + i, &b, 4);
        bad |= uint32_t((~b & 0x7f800000u) == 0);
    }
    return bad == 0;
}

// One phase of a checkpoint on the training thread, timed by the watchdog as one operation.
struct TimedPhase {
    Watchdog* w;
    TimedPhase(const ProcessGrid& grid, const char* what, int64_t step, double deadline) : w(grid.watchdog()) {
        if (w) w->begin(what, &kCheckpointComm, grid.rank(), grid.world().size(), uint64_t(step), deadline,
                        &grid.world().world_ranks());
    }
    ~TimedPhase() { end(); }
    void end() {
        if (w) w->end();
        w = nullptr;
    }
};
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

// A save whose values are staged and whose bytes are being written by `thread` (phase 2 of
// io/checkpoint_writer.hpp); phases 1 and 3 run on the training thread, which owns HDF5 and MPI.
struct Checkpointing::InFlight {
    int64_t step = 0;
    std::unique_ptr<CheckpointWriter> writer;
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;  // under mu, as error and write_s
    std::string error;
    double write_s = 0;
    std::atomic<bool> cancel{false};
    double started = 0, blocked_s = 0, staging_s = 0;
    // This rank's WriteState (mu held).
    int state(double deadline) const {
        if (!finished) return deadline > 0 && now_s() - started > deadline ? kOverdue : kWriting;
        return error.empty() ? kIdleOrDone : kFailed;
    }
};

Checkpointing::Checkpointing(RankModel& model, const GradientSync& sync, Optimizer& opt, std::string deck_text,
                             TokenizerState tokenizer, WeightsSource source, const FaultInjection& faults,
                             std::function<void(const std::string&)> log)
    : model_(model), sync_(sync), opt_(opt), deck_text_(std::move(deck_text)), tokenizer_(std::move(tokenizer)),
      source_(std::move(source)),
      faults_(faults), log_(std::move(log)) {
    const ProcessGrid& grid = model.grid();
    io_comm_ = grid.world().split(0, grid.rank(), kCheckpointComm);
    io_comm_->set_deadline(0);
    if (model.deck().checkpoint.async) {
        const size_t n = staged_floats();
        check_staging_fits(double(n) * sizeof(float));
        // Allocated and touched now: resident from the start (the memory table and the check
        // above count it), and no page faults in the first checkpoint's copy.
        staging_.assign(std::max<size_t>(n, 1), 0.0f);
    }
}

Checkpointing::~Checkpointing() {
    if (!flight_) return;
    // An error path (the run is ending with an exception): the write is abandoned. A writer that
    // does not stop within 5 s (a hung file system) is left running, detached, with
    // what it reads: the process is about to end.
    InFlight& f = *flight_;
    f.cancel.store(true);
    bool done = false;
    {
        std::unique_lock<std::mutex> lock(f.mu);
        done = f.cv.wait_for(lock, std::chrono::seconds(5), [&] { return f.finished; });
    }
    if (done) {
        f.thread.join();
        flight_.reset();  // the writer removes its partial file (rank 0)
    } else {
        // Left with what it may still read: its writer and the staging copy.
        f.thread.detach();
        (void)flight_.release();
        (void)new std::vector<float>(std::move(staging_));
    }
}

Checkpointing::Sources Checkpointing::sources() const {
    Sources out;
    const bool first_of_group = model_.grid().dp_cp().rank() == 0;
    // The parameters.
    if (const ZeroState* z = model_.zero()) {
        // ZeRO-2/3: each trainable slice (where the shard keeps it), the buffers whole.
        for (const ZeroPiece& p : z->layout().pieces) {
            const bool trainable = Replicas(p.region) != Replicas::none;
            if (!trainable && !first_of_group) continue;
            const Range r = trainable ? p.owned : p.part;
            if (r.size() > 0) out.ranges.push_back({r, z->param_at(p, r.lo)});
        }
    } else {
        const float* params = model_.params();
        for (const ArenaRange& w : opt_.param_write_ranges())
            if (w.arena.size() > 0) out.ranges.push_back({w.arena, params + w.arena.lo});
        const Range buf = model_.table().region[int(Replicas::none)];
        if (first_of_group && buf.size() > 0) out.ranges.push_back({buf, params + buf.lo});
    }
    // The optimizer state of the same parts: AdamW's moments of its tensors, and Muon's momentum
    // of the whole matrices this rank orthogonalises.
    const OptimizerStateIo st = opt_.state(/*for_save=*/true);
    for (const ArenaRange& r : st.ranges)
        if (r.arena.size() > 0)
            out.ranges.push_back({r.arena, nullptr, st.exp_avg + r.state_index, st.exp_avg_sq + r.state_index});
    for (const auto& w : st.momentum) out.momentum.push_back({w.logical, w.data});
    return out;
}

size_t Checkpointing::staged_floats() const {
    size_t n = 0;
    const Sources src = sources();
    for (const CheckpointSource& s : src.ranges) n += s.arena.size() * ((s.params ? 1 : 0) + (s.exp_avg ? 2 : 0));
    for (const CheckpointWhole& w : src.momentum) n += model_.table().logical[w.logical].numel();
    return n;
}

Checkpointing::Sources Checkpointing::stage(float* to, bool* finite) const {
    Backend& be = model_.backend();
    const bool host = model_.host_arena();
    Sources out;
    size_t at = 0;
    auto copy = [&](const float* from, size_t n, bool check) {
        float* dst = to + at;
        at += n;
        if (host && check) {
            *finite = copy_all_finite(dst, from, n) && *finite;
        } else {
            be.to_host(dst, from, n);
            if (check) *finite = all_finite(dst, n) && *finite;
        }
        return dst;
    };
    *finite = true;
    const Sources src = sources();
    for (const CheckpointSource& s : src.ranges) {
        const size_t n = s.arena.size();
        CheckpointSource h{s.arena};
        if (s.params) h.params = copy(s.params, n, true);
        if (s.exp_avg) h.exp_avg = copy(s.exp_avg, n, false), h.exp_avg_sq = copy(s.exp_avg_sq, n, false);
        out.ranges.push_back(h);
    }
    for (const CheckpointWhole& w : src.momentum)
        out.momentum.push_back({w.logical, copy(w.data, model_.table().logical[w.logical].numel(), false)});
    return out;
}

void Checkpointing::check_staging_fits(double bytes) const {
    const ProcessGrid& grid = model_.grid();
    const MpiCommunicator& world = grid.world();
    // The activations still to be allocated in host memory (the executor allocates a step's
    // slots on demand): the planner's figure for the largest rank, less what this rank holds
    // already. (On a device backend they are the device's.)
    double later = 0;
    if (model_.host_arena()) {
        Deck d = model_.deck();
        d.parallel.dp = grid.dp().size();
        MachineModel mm;
        mm.matmul_gflops_per_core = 1;
        try {
            const PlanRow plan = plan_layout(d, world.size(), mm);
            if (plan.valid) later = std::max(0.0, plan.memory.activations - model_.activation_bytes());
        } catch (const std::exception&) {
            // no figure: the copy alone is checked
        }
    }
    double need[2] = {bytes, bytes + later};
    const std::unique_ptr<MpiCommunicator> node = world.split_node();
    node->all_reduce_sum(need, 2);
    char why[768] = {0};
    if (node->rank() == 0) {
        const double avail = host_available_memory_bytes();
        char host[128] = {0};
        gethostname(host, sizeof host - 1);
        if (avail >= 0 && need[1] > avail)
            std::snprintf(why, sizeof why,
                          "checkpoint.async = true: the staging copy that background checkpoints write from "
                          "needs %s on node %s (its %d rank(s)' share of the weights and the optimizer state), and "
                          "with the %s of activations the first steps will still allocate, the node would "
                          "need %s, but it has %s available (MemAvailable, or the memory cgroup's limit less "
                          "its usage); set checkpoint.async = false (a blocking checkpoint needs no copy), or "
                          "spread the model over more ranks or nodes (the copy is each rank's share)",
                          mib(need[0]).c_str(), host, node->size(), mib(need[1] - need[0]).c_str(),
                          mib(need[1]).c_str(), mib(avail).c_str());
    }
    int first = why[0] ? world.rank() : world.size();
    world.all_reduce_min(&first, 1);
    if (first == world.size()) return;
    world.broadcast(why, sizeof why, first);
    throw ConfigError(why);
}

void Checkpointing::record(MetricsFile* metrics, int64_t step, const std::string& path, double blocked,
                           double staging, double write_s, bool background) {
    namespace ms = metrics_schema;
    // The slowest rank's figures: the step waits for it at its next collective.
    double v[3] = {blocked, staging, write_s};
    model_.grid().world().all_reduce_max(v, 3);
    if (metrics)
        metrics->append(ms::kCheckpoint, {{ms::kStep, double(step)}, {ms::kBlocked, v[0]}, {ms::kStaging, v[1]},
                                          {ms::kWriteTime, v[2]}});
    log_("checkpoint " + path +
         (background ? " (the step blocked " + secs(v[0]) + ", of which the copy " + secs(v[1]) + "; written in " +
                           secs(v[2]) + " in the background)"
                     : " (" + secs(v[0]) + ")"));
    last_ = path;
}

void Checkpointing::save(int64_t step, int64_t tokens_seen, const RunState& state, MetricsFile* metrics,
                         bool complete_now) {
    complete(metrics, "the checkpoint of step " + std::to_string(step));
    const double t0 = now_s();
    const Deck& deck = model_.deck();
    const ProcessGrid& grid = model_.grid();
    const ParamTable& table = model_.table();
    // The values: staged (a background write reads the copy while training changes the
    // arenas), or through host memory on a device backend, or read in place -- checked finite on
    // the way: never checkpoint non-finite weights over good ones (each rank checks the
    // parameters it writes; together, every parameter of the checkpoint).
    const bool background = !staging_.empty() && !complete_now;
    std::vector<float> host;
    Sources src;
    bool finite = true;
    const double t_copy = now_s();
    if (background) {
        src = stage(staging_.data(), &finite);
    } else if (!model_.host_arena()) {
        host.resize(staged_floats());
        src = stage(host.data(), &finite);
    } else {
        src = sources();
        for (const CheckpointSource& c : src.ranges)
            if (c.params) finite = all_finite(c.params, c.arena.size()) && finite;
    }
    const double staging = background || !model_.host_arena() ? now_s() - t_copy : 0.0;
    double bad = finite ? 0.0 : 1.0;
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
    meta.spike_window = state.spike_window;
    meta.skips_in_row = state.skips_in_row;
    meta.param_groups = groups_text(summarise_groups(deck.model, deck.init, deck.groups));
    meta.blend = blend_;
    meta.optimizer = deck.train.optimizer;
    // The metrics history up to this step beside the checkpoint, complete before it is: a resume
    // rebuilds an unreadable metrics.h5 from it. Copied now; made durable by the writer.
    std::string metrics_tmp;
    if (metrics) metrics_tmp = metrics->snapshot_to(checkpoint_metrics_path(checkpoint_path(deck.output.run_dir, step)), false);
    // Each phase on this thread (its barriers and collective I/O) under the collective deadline.
    std::unique_ptr<CheckpointWriter> writer;
    {
        TimedPhase timed(grid, "checkpoint write", step, deck.train.collective_timeout_s);
        writer = std::make_unique<CheckpointWriter>(*io_comm_, deck.output.run_dir, meta, table, std::move(src.ranges),
                                                    std::move(src.momentum),
                                                    deck.checkpoint.keep, metrics_tmp);
        if (!background) {
            faults_.in_checkpoint(step);
            const double t1 = now_s();
            const std::string error = writer->write();
            const double write_s = now_s() - t1;
            const std::string path = writer->commit(error);
            timed.end();
            record(metrics, step, path, now_s() - t0, staging, write_s, false);
            return;
        }
    }
    flight_ = std::make_unique<InFlight>();
    InFlight& f = *flight_;
    f.step = step;
    f.writer = std::move(writer);
    f.started = now_s();
    f.thread = std::thread([this, &f] {
        faults_.in_checkpoint(f.step);  // SIGSTOP inside the write (tests)
        const double t1 = now_s();
        std::string error = f.writer->write(&f.cancel);
        std::lock_guard<std::mutex> lock(f.mu);
        f.error = std::move(error);
        f.write_s = now_s() - t1;
        f.finished = true;
        f.cv.notify_all();
    });
    f.blocked_s = now_s() - t0;
    f.staging_s = staging;
}

bool Checkpointing::step_end(MetricsFile* metrics) {
    int state = kIdleOrDone;
    if (flight_) {
        InFlight& f = *flight_;
        std::lock_guard<std::mutex> lock(f.mu);
        state = f.state(model_.deck().train.collective_timeout_s);
    }
    // Stop signals and the write's state in one all-reduce: every rank checkpoints the same step
    // and commits (or fails) the same save.
    double v[2] = {stop_requested() ? 1.0 : 0.0, double(state)};
    model_.grid().world().all_reduce_max(v, 2);
    if (flight_ && int(v[1]) != kWriting) finish(metrics, int(v[1]));
    return v[0] > 0;
}

void Checkpointing::complete(MetricsFile* metrics, const std::string& before) {
    if (!flight_) return;
    InFlight& f = *flight_;
    const double deadline = model_.deck().train.collective_timeout_s, t0 = now_s();
    int state;
    {
        std::unique_lock<std::mutex> lock(f.mu);
        if (!f.finished)
            log_("waiting for the background write of the checkpoint of step " + std::to_string(f.step) + " before " +
                 before);
        // Asleep, checking the deadline (counted from the write's start) every 100 ms.
        while (!f.finished && !(deadline > 0 && now_s() - f.started > deadline))
            f.cv.wait_for(lock, std::chrono::milliseconds(100));
        state = f.state(deadline);
    }
    f.blocked_s += now_s() - t0;
    double v = double(state);
    model_.grid().world().all_reduce_max(&v, 1);
    finish(metrics, int(v));
}

void Checkpointing::finish(MetricsFile* metrics, int agreed) {
    InFlight& f = *flight_;
    const Deck& deck = model_.deck();
    const ProcessGrid& grid = model_.grid();
    const double t0 = now_s();
    if (agreed == kOverdue) {
        // Some rank's write ran past the deadline: abandoned on every rank (a write stuck in the
        // file system cannot be waited for), the run ends as after any missed deadline.
        bool mine;
        {
            std::lock_guard<std::mutex> lock(f.mu);
            mine = !f.finished;
        }
        throw DeadlineError("the background write of checkpoint " + f.writer->path() + " (step " +
                            std::to_string(f.step) + ") did not complete within " +
                            std::to_string(int(deck.train.collective_timeout_s)) +
                            " s (train.collective_timeout_s)" + (mine ? " on this rank" : " on another rank") +
                            ": its file system stopped answering or a rank stopped; it is abandoned, the earlier "
                            "checkpoints are intact (latest: " + checkpoint_latest(deck.output.run_dir) + ")");
    }
    if (agreed == kFailed) {
        // Another rank failed: this rank's write stops at its next piece (a write stuck in the
        // file system past the deadline is abandoned: the run ends as after any missed one).
        f.cancel.store(true);
        std::unique_lock<std::mutex> lock(f.mu);
        const double deadline = deck.train.collective_timeout_s;
        while (!f.finished && !(deadline > 0 && now_s() - f.started > deadline))
            f.cv.wait_for(lock, std::chrono::milliseconds(100));
        if (!f.finished)
            throw DeadlineError("the background write of checkpoint " + f.writer->path() +
                                " did not stop within train.collective_timeout_s after another rank's write failed");
    }
    f.thread.join();
    std::string path;
    {
        TimedPhase timed(grid, "checkpoint commit", f.step, deck.train.collective_timeout_s);
        try {
            path = f.writer->commit(f.error);
        } catch (...) {
            flight_.reset();
            throw;
        }
    }
    const int64_t step = f.step;
    const double blocked = f.blocked_s + (now_s() - t0), staging = f.staging_s, write_s = f.write_s;
    flight_.reset();
    record(metrics, step, path, blocked, staging, write_s, true);
}

int64_t Checkpointing::start(int64_t* tokens_seen, RunState* state) {
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
    state->spike_window = meta.spike_window;
    state->skips_in_row = meta.skips_in_row;
    last_ = path;
    log_("resumed from " + path + " at step " + std::to_string(meta.step) + " (written with " + meta.layout + ")");
    return meta.step;
}

}  // namespace quintet
