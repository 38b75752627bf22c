#include "quintet/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/core/trace.hpp"
#include "quintet/data/dataset.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/io/metrics.hpp"
#include "quintet/io/metrics_schema.hpp"
#include "quintet/train/lr_schedule.hpp"
#include "quintet/train/signals.hpp"

namespace quintet {

Trainer::Trainer(RankModel& model, const std::string& deck_text, const DataSet& data, WeightsSource source,
                 const RunLock* lock)
    : model_(model), deck_(model.deck()), grid_(model.grid()), be_(model.backend()),
      // Under ZeRO-2/3 a rank keeps no whole gradient arena (ZeroState: shard and windows).
      grads_(be_.alloc(model.zero() ? 1 : model.table().total)),
      sync_(std::make_unique<GradientSync>(model.table(), be_, model.comms(), model.tp(), deck_.parallel.bucket_mb,
                                           deck_.parallel.zero == 1, deck_.parallel.overlap_dp, model.zero())),
      opt_(std::make_unique<Optimizer>(model.table(), be_, *sync_, model.comms(), grid_.tp().size(), deck_.train,
                                       tensor_rules(model.table(), deck_.model, deck_.init, deck_.groups))),
      sampler_(data, deck_.data, uint64_t(deck_.train.seed)),
      faults_(grid_.rank()),
      telemetry_(model, deck_text),
      checkpoints_(model, *sync_, *opt_, deck_text, data.tokenizer.state(), std::move(source), faults_,
                   [this](const std::string& l) { telemetry_.log(l); }),
      skips_(deck_.train.max_skips),
      nonfinite_(deck_.train, deck_.output.run_dir, grid_.rank(), skips_,
                 [this](const std::string& l) { telemetry_.log(l); }),
      spikes_(deck_.train, deck_.output.run_dir, grid_.rank(), skips_, [this](const std::string& l) { telemetry_.log(l); }),
      timeline_(grid_, deck_, [this](const std::string& l) { telemetry_.log(l); }),
      lock_(lock) {
    if (deck_.eval.every > 0) {
        eval_.emplace(model, sampler_);
        for (const std::string& n : eval_->notes()) telemetry_.log("warning: " + n);
    }
    // This replica's samples of every step are read a step ahead (the samples [g0, g0 + m) of step()).
    {
        const int64_t mbs = deck_.data.micro_batch_size, m = deck_.parallel.microbatches;
        const int64_t g0 = int64_t(grid_.coord(kDP)) * m;
        sampler_.prefetch_range(g0 * mbs, (g0 + m) * mbs, global_batch());
    }
    // On a GPU the kernels run asynchronously: host-side scopes would time launches, not work.
    profile::enable(deck_.train.profile && model.host_arena());
    if (model.zero()) model.zero()->enable_gradients();
    telemetry_.set_training_bytes(model.zero() ? model.zero()->grad_bytes()
                                               : double(model.table().total) * 4 + double(opt_->shard_floats()) * 4,
                                  opt_->bytes());
    telemetry_.set_checkpoint_bytes(checkpoints_.staging_bytes());
    telemetry_.log(opt_->describe());
    if (model.moe())  // the MTP modules' MoE layers count as layers n_layers + k
        moe_ = MoeCounts(deck_.model.n_layers + deck_.model.mtp_depth, deck_.model.moe.experts, grid_.ep().size());
}

Trainer::~Trainer() {
    opt_.reset();
    sync_.reset();
    if (grads_) be_.release(grads_);
}

int64_t Trainer::global_batch() const {
    return int64_t(grid_.dp().size()) * deck_.parallel.microbatches * deck_.data.micro_batch_size;
}

StepStats Trainer::step(int64_t s, bool locate) {
    const StepFault fault = faults_.at_step_start(s);
    const bool poison = fault.nan;
    // An injected spike (tests): this rank's gradient scaled, so the step runs without the
    // overlapped reduction (as `locate` does), the whole local gradient present after the backward.
    const bool scaled = fault.grad_factor != 1.0f;
    StepStats st;
    const auto& p = deck_.parallel;
    const int mbs = deck_.data.micro_batch_size, T = deck_.data.seq_len;
    const int64_t gb = global_batch();
    float* params = model_.params();
    trace::set_step(int32_t(s + 1));
    trace::Span step_span(trace::Track::step, "step");
    const double t0 = now_s();
    // The step's waits (communication, data): the rest of it is this rank's compute.
    const int64_t waited0 = trace::waited_ns(), data0 = trace::waited_ns(trace::Track::data);
    auto close_times = [&](StepStats& out) {
        out.data_wait = double(trace::waited_ns(trace::Track::data) - data0) * 1e-9;
        out.comm_wait = double(trace::waited_ns() - waited0) * 1e-9 - out.data_wait;
    };
    TensorParallel& tp = model_.tp();
    ContextParallel* cp = model_.cp();
    ExpertParallel* ep = model_.ep();
    tp.counters.reset();
    if (cp) cp->counters.reset();
    if (ep) ep->dispatch_counters.reset(), ep->combine_counters.reset();
    ZeroState* zero = model_.zero();
    if (!zero) be_.zero(grads_, model_.table().total);
    const float nan = std::nanf("");
    if (poison && !zero)  // the first element of this rank's first trainable tensor; the backward keeps it NaN
        for (const auto& spec : model_.table().specs)
            if (spec.trainable()) {
                be_.from_host(grads_ + spec.offset, &nan, 1);
                break;
            }
    sync_->begin_step(grads_);
    if (poison && zero) be_.from_host(zero->grad_shard(), &nan, 1);  // this rank's first slice
    if (!moe_.empty()) model_.take_moe_counts(moe_);  // what evaluation counted is not this step's
    // 1. This replica's microbatches through the pipeline schedule: forward, backward.
    // Microbatch g of the global batch (docs/math.md §10): replica r runs [r*m, (r+1)*m).
    const int64_t g0 = int64_t(grid_.coord(kDP)) * p.microbatches;
    auto data = [&](int mb, int32_t* ids, int32_t* tgt) {
        for (int j = 0; j < mbs; ++j)
            sampler_.train_sample(s, (g0 + mb) * mbs + j, gb, ids + size_t(j) * T, tgt + size_t(j) * T);
    };
    const float grad_scale = float(1.0 / (double(gb) * T));
    std::optional<trace::Span> phase(std::in_place, trace::Track::step, "pipeline");
    // train.probe_rms: the layer outputs' squares over the step's forwards, summed over every rank.
    RmsProbe probe;
    if (deck_.train.probe_rms)
        for (auto& c : model_.chunks()) c->set_probe(&probe);
    PipelineExecutor::Result r =
        model_.executor().run(params, grads_, grad_scale, data, locate || scaled ? nullptr : sync_->hook());
    if (scaled && !zero) be_.scale(grads_, model_.table().total, fault.grad_factor);
    if (deck_.train.probe_rms) {
        for (auto& c : model_.chunks()) c->set_probe(nullptr);
        grid_.world().all_reduce_sum(probe.sumsq.data(), probe.sumsq.size());
        grid_.world().all_reduce_sum(probe.count.data(), probe.count.size());
        for (int k = 0; k < kNumProbeKinds; ++k) st.probe_rms[size_t(k)] = probe.rms(ProbeKind(k));
    }
    const double t1 = now_s();
    phase.reset();
    if (locate && !zero) st.origin = locate_nonfinite(model_.table(), be_, grads_, r.ce_sum + r.aux_sum, grid_.world());
    // 2. Gradients summed over their replica groups (tp/kv/tied partials, then dp x cp / edp).
    st.dp_early = sync_->buckets_overlapped();
    phase.emplace(trace::Track::step, "gradient sync");
    auto [t_sync, t_dp] = [&] {
        QUINTET_PROFILE("comm.dp");
        return sync_->finish_step(grads_, opt_->shards());
    }();
    if (scaled && zero) be_.scale(zero->grad_shard(), zero->layout().trainable, fault.grad_factor);  // its reduced slices
    if (locate && zero) st.origin = locate_nonfinite(zero_nonfinite(r.ce_sum + r.aux_sum), grid_.world());
    // 3. The step's loss: cross-entropy summed over every target token of the global batch
    //    (only the last stage has it), aux averaged over the microbatches.
    phase.emplace(trace::Track::step, "loss");
    double sums[3] = {r.ce_sum, r.aux_sum, r.mtp_sum};
    grid_.pp().all_reduce_sum(sums, 3);
    grid_.dp_cp().all_reduce_sum(sums, 3);
    const double t3 = now_s();
    // 4. Global-norm clipping and the optimizer (AdamW, or Muon and AdamW) -- unless the loss or the norm is not finite (the same
    //    decision on every rank: both are all-reduced), which leaves the state as it was.
    phase.emplace(trace::Track::step, "optimizer");
    std::optional<trace::Span> optimizer_span(std::in_place, trace::Track::compute, "optimizer");
    profile::Scope optimizer_scope("optimizer", /*traced=*/false);
    const double norm = opt_->grad_norm(grads_, grid_.world());
    // A step rejected before the update (non-finite, or a spike the policy acts on): the state
    // stays as it was; what it would have used and how long it took are reported.
    auto rejected = [&] {
        st.lr = lr_at(deck_.train, s);
        st.grad_norm = norm;
        st.step_time = now_s() - t0;
        close_times(st);
        moe_.clear();  // a skipped step routes nothing
        return st;
    };
    if (!std::isfinite(sums[0]) || !std::isfinite(sums[1]) || !std::isfinite(sums[2]) || !std::isfinite(norm)) {
        st.nonfinite = true;
        st.what = !std::isfinite(sums[0])   ? "the loss"
                  : !std::isfinite(sums[1]) ? "the MoE aux loss"
                  : !std::isfinite(sums[2]) ? "the MTP loss"
                                            : "the gradient norm";
        st.loss = sums[0] / (double(gb) * T) + sums[1];
        return rejected();
    }
    //    Then the spike policy (train/spikes): the loss and the norm against the window of
    //    accepted steps, world rank 0's values on every rank (an all-reduce may round
    //    differently on different ranks), so every rank takes the same decision; a spike it acts
    //    on leaves the state untouched, as a non-finite step does.
    const double ce = sums[0] / (double(gb) * T), aux = sums[1] / double(grid_.dp().size() * p.microbatches);
    // MTP (docs/math.md §11): each module's cross-entropy normalised like the main one, their mean.
    const double mtp = deck_.model.mtp_depth > 0 ? sums[2] / (double(gb) * T) / deck_.model.mtp_depth : 0.0;
    double judged[2] = {ce + aux + deck_.train.mtp_weight * mtp, norm};
    if (spikes_.acts()) grid_.world().broadcast(judged, sizeof judged, 0);
    spikes_.check(judged[0], judged[1], st);
    if (st.spike) {
        st.ce_loss = ce, st.aux_loss = aux, st.mtp_loss = mtp, st.loss = judged[0];
        return rejected();
    }
    opt_->clip(grads_, norm);
    const double lr = lr_at(deck_.train, s);
    opt_->update(params, grads_, s, lr);
    if (!moe_.empty()) {
        // The global batch's routing choices per (layer, expert), the same on every rank; the
        // aux-free biases move from them (docs/math.md §9), identically everywhere.
        moe_.clear();
        model_.take_moe_counts(moe_);
        grid_.world().all_reduce_sum(moe_.data(), moe_.size());
        model_.update_balance_bias(moe_);
    }
    model_.refresh_bf16_weights();
    optimizer_span.reset();  // (a stretched compute span spins here, inside the step)
    phase.reset();
    const double t4 = now_s();
    st.ce_loss = ce;
    st.aux_loss = aux;
    st.mtp_loss = mtp;
    st.loss = ce + aux + deck_.train.mtp_weight * mtp;
    st.lr = lr;
    st.grad_norm = norm;
    st.t_wait = r.t_wait;
    st.t_pipeline = t1 - t0;
    st.t_sync = t_sync;
    st.t_dp = t_dp;
    st.t_optim = t4 - t3;
    st.step_time = t4 - t0;
    close_times(st);
    st.tp = tp.counters;
    if (cp) st.cp = cp->counters;
    if (ep) {
        st.ep_dispatch = ep->dispatch_counters;
        st.ep_combine = ep->combine_counters;
        // Every rank's bytes against the theory from the routed counts (docs/math.md §9): each
        // row routed to another rank crosses four times (dispatch and combine, forward and
        // backward), six under full recomputation -- eight when a zero-bubble schedule's W
        // recomputes the forward once more -- C fp32 values each.
        st.ep_bytes_all = st.ep_dispatch.bytes + st.ep_combine.bytes;
        grid_.world().all_reduce_sum(&st.ep_bytes_all, 1);
        double foreign = 0;
        for (int l = 0; l < deck_.model.n_layers; ++l) foreign += moe_.sent_away(l);
        const double crossings =
            deck_.train.recompute == "full" ? (schedule_splits_backward(deck_.parallel.schedule) ? 8 : 6) : 4;
        st.ep_bytes_theory = foreign * crossings * double(deck_.model.d_model) * sizeof(float);
    }
    return st;
}

std::string Trainer::zero_nonfinite(double local_loss) const {
    // ZeRO-2/3: the gradients exist only as each rank's reduced slices; the first tensor whose
    // slice on this rank is not finite.
    if (!std::isfinite(local_loss)) return "loss";
    const ZeroState& z = *model_.zero();
    for (const auto& spec : model_.table().specs) {
        if (!spec.trainable()) continue;
        for (const ZeroPiece& p : z.layout().pieces) {
            if (p.unit != spec.unit || p.region != int(spec.replicas)) continue;
            const size_t a = std::max(p.owned.lo, spec.offset), b = std::min(p.owned.hi, spec.offset + spec.numel());
            if (a < b && !std::isfinite(be_.sumsq(z.grad_shard() + p.at + (a - p.owned.lo), b - a)))
                return "gradient of " + spec.name + " (this rank's reduced slice)";
        }
    }
    return "";
}

int Trainer::run() {
    // A deadline that passes (exit status 4, docs/reliability.md) is recorded for job scripts
    // first: by the watchdog thread for blocking collectives and checkpoint writes, here for the
    // waits that poll their deadline themselves.
    arm_watchdog(grid_, deck_.output.run_dir, &steps_done_);
    try {
        const int status = run_steps();
        timeline_.finish();
        return status;
    } catch (const DeadlineError& e) {
        write_fault_file(deck_.output.run_dir, "transient", steps_done_.load() + 1, grid_.rank(), e.what());
        timeline_.finish();  // what this rank did up to the fault: often the question
        throw;
    } catch (...) {
        timeline_.finish();
        throw;
    }
}

RunState Trainer::run_state() const {
    RunState r;
    r.spike_window = spikes_.window();
    r.skips_in_row = skips_.in_row();
    return r;
}

void Trainer::set_up_blend() {
    const WeightsSource& src = checkpoints_.source();
    const std::vector<Source>& sources = sampler_.train_sources();
    const std::vector<double> now = sampler_.deck_weights();
    const int64_t G = global_batch(), n0 = start_step_ * G, T = deck_.data.seq_len;
    std::vector<BlendSegment> segs{{0, now}};
    std::string change;
    if (src.resume && sources.size() > 1) {
        std::vector<BlendSegment> before = blend_segments_parse(src.blend);
        if (before.empty()) {  // a checkpoint older than stored blends: its deck's weights from sample 0
            before = {{0, now}};
            const Deck theirs = deck_parse_text(src.deck);
            if (theirs.data.path != deck_.data.path) {
                const auto list = parse_source_list("data.path", theirs.data.path);
                if (list.size() == sources.size() && list[0].first >= 0) {
                    double sum = 0;
                    for (const auto& [w, spec] : list) sum += w;
                    before[0].weights.clear();
                    for (const auto& [w, spec] : list) before[0].weights.push_back(w / sum);
                }
            }
        }
        if (before.back().weights.size() != now.size()) {
            change = "the training sources changed (" + std::to_string(before.back().weights.size()) + " then, " +
                     std::to_string(now.size()) + " now): the blend starts again from each source's first sample";
        } else {
            segs = before;
            double diff = 0;
            for (size_t i = 0; i < now.size(); ++i) diff = std::max(diff, std::abs(now[i] - before.back().weights[i]));
            if (diff > 1e-12 && n0 > before.back().start) {
                Blend replay(before);
                for (int64_t n = 0; n < n0; ++n) replay.next();
                const std::vector<int64_t> at = replay.counts();
                segs.push_back({n0, now});
                char buf[160];
                change = "the blend's weights change at step " + std::to_string(start_step_) + " (sample " +
                         std::to_string(n0) + "):";
                for (size_t i = 0; i < now.size(); ++i) {
                    std::snprintf(buf, sizeof buf, "%s %s %.3f -> %.3f", i ? "," : "", sources[i].name.c_str(),
                                  before.back().weights[i], now[i]);
                    change += buf;
                }
                change += "; each source continues from the sample it had reached (";
                for (size_t i = 0; i < now.size(); ++i)
                    change += (i ? ", " : "") + sources[i].name + " " + std::to_string(at[i]);
                change += "): no sample is repeated or skipped within an epoch";
            }
        }
    }
    sampler_.set_blend(segs);
    checkpoints_.set_blend(blend_segments_text(segs));
    if (!change.empty()) telemetry_.log("data: " + change);
    if (MetricsFile* m = telemetry_.metrics()) m->set_attr(metrics_schema::kRuns, "blend", blend_segments_text(segs));
    // What each source gives over the whole run (train.steps), from the rule itself.
    const int64_t total = std::max<int64_t>(deck_.train.steps, 0) * G;
    std::vector<int64_t> samples(sources.size(), 0);
    if (sources.size() == 1) {
        samples[0] = total;
    } else if (total <= (int64_t(1) << 28)) {
        Blend b(segs);
        for (int64_t n = 0; n < total; ++n) b.next();
        samples = b.counts();
    } else {  // a very long run: the shares, to within a sample each
        for (size_t i = 0; i < sources.size(); ++i) samples[i] = int64_t(double(total) * now[i]);
    }
    std::string line = "data: " + std::to_string(sources.size()) + " source(s), " + std::to_string(deck_.train.steps) +
                       " steps x " + std::to_string(G) + " samples of " + std::to_string(T) + " tokens (" +
                       deck_.data.order + "):";
    char buf[200];
    for (size_t i = 0; i < sources.size(); ++i) {
        const int64_t whole = std::max<int64_t>(1, (sources[i].len - 1) / T);
        std::snprintf(buf, sizeof buf, "%s %s weight %.3f, %lld tokens, %lld samples, %.2f epochs", i ? ";" : "",
                      sources[i].name.c_str(), now[i], (long long)sources[i].len, (long long)samples[i],
                      double(samples[i]) / double(whole));
        line += buf;
    }
    telemetry_.log(line);
}

int Trainer::run_steps() {
    const auto& t = deck_.train;
    const int64_t tokens_per_step = global_batch() * deck_.data.seq_len;
    if (!deck_.given.count("train.warmup") && t.steps > 0 && t.warmup > t.steps)
        telemetry_.log("warning: train.warmup = " + std::to_string(t.warmup) + " (the default) exceeds train.steps = " +
                       std::to_string(t.steps) + ": the learning rate never reaches train.lr; set train.warmup");
    RunState resumed;
    start_step_ = checkpoints_.start(&tokens_seen_, &resumed);
    skips_.restore(resumed.skips_in_row);
    spikes_.restore(resumed.spike_window);
    if (checkpoints_.source().resume && start_step_ > 0 && spikes_.acts() && resumed.spike_window.empty())
        telemetry_.log("note: " + checkpoints_.source().path + " keeps no spike window (written before it was "
                       "checkpointed): train.on_spike judges steps again after " + std::to_string(t.spike_window) +
                       " accepted steps");
    if (grid_.rank() == 0) remove_stop_file(deck_.output.run_dir);  // it speaks of an earlier start
    if (checkpoints_.source().resume && t.steps > 0 && start_step_ >= t.steps) {
        // A finished run: nothing to do, and nothing is written (its metrics stay as they are).
        telemetry_.log("the run is complete: " + checkpoints_.source().path + " is step " + std::to_string(start_step_) +
                       " and train.steps = " + std::to_string(t.steps) + "; to continue it, raise train.steps (e.g. "
                       "--train.steps=" + std::to_string(start_step_ + std::max<int64_t>(t.steps, 1)) + ")");
        return 0;
    }
    telemetry_.begin(start_step_, checkpoints_.source().resume ? checkpoints_.source().path : "");
    set_up_blend();
    timeline_.begin(start_step_);
    if (t.steps == 0 || start_step_ >= t.steps) {
        if (start_step_ == 0) checkpoints_.save(0, tokens_seen_, run_state(), telemetry_.metrics(), true);
        return 0;
    }
    int64_t s = start_step_;
    steps_done_.store(s);
    while (s < t.steps) {
        timeline_.before_step(s);
        StepStats st = step(s);
        bool skipped = false, spike = st.over_limit;
        // A rejected step: re-run, skipped or the end of the run, by its policy; a rerun may be
        // rejected for the other reason (a non-finite rerun of a spike), hence the loop.
        for (int round = 0; !skipped && (st.nonfinite || st.spike); ++round) {
            QUINTET_CHECK(round < 4, "step " + std::to_string(s + 1) + " rejected again and again");
            // The policy may end the run (naming the last good checkpoint): a save in flight first.
            checkpoints_.complete(telemetry_.metrics(), "handling step " + std::to_string(s + 1));
            if (st.nonfinite)
                st = nonfinite_.handle(s, st, [&](bool locate) { return step(s, locate); }, checkpoints_.last(), &skipped);
            else
                st = spikes_.handle(s, st, [&] { return step(s); }, checkpoints_.last(), &skipped);
            spike = spike || st.over_limit;
        }
        if (!skipped) {
            skips_.accepted();
            spikes_.accept(st);
        }
        if (lock_) lock_->touch();
        ++s;
        steps_done_.store(s);
        tokens_seen_ += tokens_per_step;
        telemetry_.record_step(s, st, skipped, spike, moe_);
        telemetry_.record_data(s, sampler_.source_samples(s * global_batch()), sampler_.train_sources(),
                               sampler_.take_wait_seconds());
        if (eval_ && (s % deck_.eval.every == 0 || s == t.steps)) {
            trace::Span eval_span(trace::Track::step, "evaluation");
            std::vector<double> per_source;
            const double loss = eval_->evaluate(nullptr, &per_source);
            telemetry_.record_eval(s, loss, per_source, sampler_.val_sources());
        }
        telemetry_.end_step(s);
        // Stop signals are agreed on by all ranks, so everyone checkpoints the same step; a
        // background checkpoint written everywhere is completed here.
        bool stop = checkpoints_.step_end(telemetry_.metrics());
        const bool exit_now = t.exit_after > 0 && s - start_step_ >= t.exit_after;
        const bool periodic = deck_.checkpoint.every > 0 && s % deck_.checkpoint.every == 0;
        if (periodic || s == t.steps || stop || exit_now) {
            // The last checkpoint of this run is complete before it ends: no copy, no thread.
            {
                trace::Span write(trace::Track::checkpoint, "checkpoint");
                checkpoints_.save(s, tokens_seen_, run_state(), telemetry_.metrics(), s == t.steps || stop || exit_now);
            }
            // A signal that arrived during the write stops at the checkpoint just written.
            if (!stop) stop = stop_agreed(grid_.world());
        }
        timeline_.after_step(s);
        if ((stop || exit_now) && s < t.steps) {
            if (stop && grid_.rank() == 0) write_stop_file(deck_.output.run_dir, s, checkpoints_.last());
            telemetry_.log(std::string(stop ? "stop signal received" : "train.exit_after reached") +
                           ": checkpointed step " + std::to_string(s) + "; resume with checkpoint.resume=auto");
            break;
        }
        if (s == t.steps) telemetry_.report_finished();
    }
    checkpoints_.complete(telemetry_.metrics(), "the end of the run");
    if (profile::enabled()) telemetry_.report_profile();
    return 0;
}

}  // namespace quintet
