#include "quintet/train/telemetry.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "quintet/core/clock.hpp"
#include "quintet/core/process.hpp"
#include "quintet/core/profile.hpp"
#include "quintet/core/text.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/metrics_schema.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"
#include "quintet/perf/host_peak.hpp"

namespace quintet {

namespace ms = metrics_schema;

namespace {

constexpr int kMemoryColumns = int(ms::kMemoryCategories.size());

}  // namespace

Telemetry::Telemetry(RankModel& model, std::string deck_text)
    : model_(model), deck_(model.deck()), deck_text_(std::move(deck_text)) {
    const ProcessGrid& grid = model.grid();
    Backend& be = model.backend();
    if (deck_.train.peak_tflops > 0 || !model.host_arena()) {  // deck_validate requires it on a GPU
        peak_flops_ = matmul_flops_ = deck_.train.peak_tflops * 1e12 * grid.world().size();
        peak_what_ = "train.peak_tflops";
    } else {
        // MFU's denominator: the FMA peak of the cores the job runs on (cached per host).
        HostPeak hp;
        peak_flops_ = job_fma_peak_flops(grid.world(), be.threads(), &hp);
        peak_what_ = "FMA peak, " + hp.isa + ", " + hp.describe();
        host_cores_used_ = hp.gflops_per_core > 0 ? peak_flops_ / (hp.gflops_per_core * 1e9) : 0;
        // The achieved share of the measured matmul rate, the second column: every rank's sgemm
        // at once (so shared cores are not counted twice); 1024^3, best of 5, and per node the
        // best seen on this host (job_sgemm_flops): short runs read 30% low on a busy machine.
        const double g = cpu_measure_sgemm_gflops(be, 1024, 5);
        matmul_flops_ = job_sgemm_flops(grid.world(), g, be.threads(), &sgemm_measured_);
    }
    // The straggler report's names: every rank's host (one gather) and grid coordinates.
    const std::vector<std::string> hosts = grid.world().gather_text(host_name(), 0);
    if (grid.rank() == 0) {
        std::vector<StragglerRank> ranks(hosts.size());
        for (size_t r = 0; r < ranks.size(); ++r) {
            ranks[r].host = hosts[r];
            ranks[r].where = rank_place(grid.layout(), int(r));
            ranks[r].group = grid.layout().coords_of(int(r))[kPP];
        }
        stragglers_ = std::make_unique<StragglerReport>(std::move(ranks), deck_.train.straggler_ratio);
    }
    const int pp = grid.pp().size();
    idle_.assign(size_t(pp), 0.0);
    act_mib_.assign(size_t(pp), 0.0);
    if (model.moe()) {
        moe_idle_.assign(size_t(deck_.model.n_layers) * deck_.model.moe.experts, 0);
        moe_collapsed_.assign(size_t(deck_.model.n_layers), 0);
        moe_warned_.assign(size_t(deck_.model.n_layers), 0);
    }
}

Telemetry::~Telemetry() = default;

void Telemetry::log(const std::string& line) const {
    if (model_.grid().rank() == 0) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
    }
}

void Telemetry::begin(int64_t start_step, const std::string& resumed_from) {
    const ProcessGrid& grid = model_.grid();
    start_step_ = start_step;
    if (grid.rank() == 0) {
        const ModelDims& d = model_.dims();
        const ParamTable& table = model_.table();
        size_t n = 0;
        for (const auto& l : table.logical) n += l.numel();
        const int64_t gb = int64_t(grid.dp().size()) * deck_.parallel.microbatches * deck_.data.micro_batch_size;
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "model: %.2fM params (%.2fM in matmuls), vocab %d, %d layers, d_model %d, "
                      "heads %d/%d, ffn %d | layout %s%s | schedule %s | global batch %lld x %d "
                      "tokens | %s | peak %.1f GFLOP/s (%s), sgemm %.1f GFLOP/s",
                      n / 1e6, table.matmul_params / 1e6, d.V, d.L, d.C, d.NH, d.NKV, d.F,
                      grid.layout().describe().c_str(), model_.tp().sp() ? " +sp" : "",
                      deck_.parallel.schedule.c_str(), (long long)gb, deck_.data.seq_len,
                      deck_.train.precision.c_str(), peak_flops_ / 1e9, peak_what_.c_str(), matmul_flops_ / 1e9);
        std::string line = buf;
        if (sgemm_measured_ > 0 && sgemm_measured_ < matmul_flops_) {
            std::snprintf(buf, sizeof buf, " (the best measured on this host; this run measured %.1f)", sgemm_measured_ / 1e9);
            line += buf;
        }
        log(line);
        // The parameter groups: what init.scheme (and [groups]) make of each tensor's learning rate,
        // decay and init.
        const MupShape mup = mup_shape(deck_.model, deck_.init);
        std::snprintf(buf, sizeof buf, "parameter groups (init.scheme = %s", deck_.init.scheme.c_str());
        std::string groups = buf;
        if (deck_.init.scheme == "mup") {
            std::snprintf(buf, sizeof buf, ", width x%.4g, ffn x%.4g, logits x%.4g, attention scale x%.4g", mup.width,
                          mup.ffn, deck_.model.logit_mult, deck_.model.attn_mult);
            groups += buf;
        }
        std::string table_text = groups_text(summarise_groups(deck_.model, deck_.init, deck_.groups));
        if (!table_text.empty() && table_text.back() == '\n') table_text.pop_back();
        log(groups + "):\n" + table_text);
        metrics_ = std::make_unique<MetricsFile>(deck_.output.run_dir, deck_text_, start_step,
                                                 resumed_from.empty() ? "" : checkpoint_metrics_path(resumed_from));
        for (const auto& w : metrics_->warnings) log("warning: " + w);
        const Layout& lay = grid.layout();
        metrics_->append(ms::kRuns, {{ms::kRunStartStep, double(start_step)}, {"world", double(lay.world())},
                                     {"tp", double(lay.size[kTP])}, {"cp", double(lay.size[kCP])},
                                     {"dp", double(lay.size[kDP])}, {"pp", double(lay.size[kPP])},
                                     {"ep", double(grid.ep().size())}});
        if (!moe_idle_.empty() && start_step > 0) {
            // The dead-expert counters continue from the history up to the resumed step.
            const std::vector<double> h = metrics_->read_all(ms::kExpertLoad);
            for (size_t row = 0; row + moe_idle_.size() <= h.size(); row += moe_idle_.size())
                for (size_t i = 0; i < moe_idle_.size(); ++i) moe_idle_[i] = h[row + i] > 0 ? 0 : moe_idle_[i] + 1;
        }
    }
    t_start_ = now_s();
}

MemoryBytes Telemetry::memory_account() const {
    MemoryBytes m;
    m.params = model_.param_bytes();
    m.grads = grads_bytes_;
    m.optimizer = optimizer_bytes_;
    m.activations = model_.activation_bytes();
    m.buffers = model_.buffer_bytes() + checkpoint_bytes_;
    m.total = process_peak_rss_bytes();
    m.runtime = m.total - (m.params + m.grads + m.optimizer + m.activations + m.buffers);
    return m;
}

// The per-layer MoE figures of the step just taken, from the counts every rank has (dense layers
// of moe.layers read 0), and the dead-expert counters advanced.
Telemetry::MoeFigures Telemetry::moe_figures(const MoeCounts& c) {
    MoeFigures f;
    if (c.empty()) return f;
    const int L = deck_.model.n_layers, E = deck_.model.moe.experts, ep = c.ep();
    f.load.assign(size_t(L) * E, 0.0);
    f.imbalance.assign(size_t(L), 0.0), f.dead.assign(size_t(L), 0.0), f.dropped.assign(size_t(L), 0.0);
    f.aux.assign(size_t(L), 0.0), f.ep_tokens.assign(size_t(L) * ep, 0.0);
    for (int l = 0; l < L; ++l) {
        if (!moe_layer(deck_.model, l)) continue;
        double sum = 0, max = 0;
        for (int e = 0; e < E; ++e) {
            const double load = c.routed(l, e);
            f.load[size_t(l) * E + e] = load;
            sum += load, max = std::max(max, load);
            int64_t& idle = moe_idle_[size_t(l) * E + e];
            idle = load > 0 ? 0 : idle + 1;
            if (idle >= deck_.model.moe.dead_after) f.dead[size_t(l)] += 1;
        }
        f.imbalance[size_t(l)] = sum > 0 ? max / (sum / E) : 0.0;
        // A collapsing router: one expert chosen by more than half of the layer's tokens (and at
        // least twice its balanced share) for moe.dead_after steps in a row -- said once per layer.
        const double tokens = sum / deck_.model.moe.top_k;
        const double threshold = std::max(0.5 * tokens, std::min(tokens, 2.0 * sum / E));
        int64_t& run = moe_collapsed_[size_t(l)];
        run = tokens > 0 && max >= threshold && max > 0.5 * tokens ? run + 1 : 0;
        if (run >= deck_.model.moe.dead_after && !moe_warned_[size_t(l)]) {
            moe_warned_[size_t(l)] = 1;
            int busiest = 0;
            for (int e = 1; e < E; ++e) busiest = c.routed(l, e) > c.routed(l, busiest) ? e : busiest;
            char b[400];
            std::snprintf(b, sizeof b,
                          "warning: MoE layer %d: expert %d was chosen by %.0f%% of the layer's tokens for %lld steps "
                          "in a row (the router is collapsing onto it); %s balances it",
                          l, busiest, 100.0 * max / tokens, (long long)run,
                          deck_.model.moe.balance == "aux_free" ? "a larger moe.bias_rate (or moe.bias_update = proportional)"
                          : deck_.model.moe.balance == "aux_loss" ? "a larger moe.aux_coef"
                                                                  : "moe.balance = aux_free or aux_loss");
            log(b);
        }
        f.worst_imbalance = std::max(f.worst_imbalance, f.imbalance[size_t(l)]);
        f.dropped[size_t(l)] = c.dropped(l);
        f.aux[size_t(l)] = c.aux_count(l) > 0 ? c.aux_sum(l) / c.aux_count(l) : 0.0;
        for (int g = 0; g < ep; ++g) f.ep_tokens[size_t(l) * ep + g] = c.received(l, g);
    }
    return f;
}

void Telemetry::take_profile(const StepStats& st, bool steady) {
    // This rank's per-operation seconds of the step (rank 0's go to the metrics).
    std::vector<profile::Entry> entries = profile::take();
    double sum = 0;
    for (const auto& e : entries) {
        sum += e.seconds;
        if (std::find(profile_order_.begin(), profile_order_.end(), e.name) == profile_order_.end())
            profile_order_.push_back(e.name);
    }
    entries.push_back({"other", std::max(0.0, st.step_time - sum), 0});
    for (ProfileTotals* pt : {&profile_all_, &profile_steady_}) {
        if (pt == &profile_steady_ && !steady) continue;
        for (const auto& e : entries) {
            auto& t = pt->ops[e.name];
            t.first += e.seconds;
            t.second += e.calls;
        }
        pt->time += st.step_time;
        ++pt->steps;
    }
    std::vector<std::pair<std::string, double>> ops;
    for (const auto& e : entries) ops.emplace_back(e.name, e.seconds);
    if (metrics_) metrics_->append(ms::kTimingOp, ops);
}

void Telemetry::record_step(int64_t s, const StepStats& st, bool skipped, bool spike, const MoeCounts& moe) {
    const ProcessGrid& grid = model_.grid();
    const int pp = grid.pp().size(), stage = grid.coord(kPP), world = grid.world().size();
    const int64_t gb = int64_t(grid.dp().size()) * deck_.parallel.microbatches * deck_.data.micro_batch_size;
    const double tokens_per_step = double(gb) * deck_.data.seq_len;
    // Every stage's bubble (time blocked in pipeline receives / time of the schedule) and
    // activation memory, gathered for rank 0.
    std::fill(idle_.begin(), idle_.end(), 0.0);
    std::fill(act_mib_.begin(), act_mib_.end(), 0.0);
    idle_[size_t(stage)] = st.t_pipeline > 0 ? st.t_wait / st.t_pipeline : 0.0;
    act_mib_[size_t(stage)] = model_.executor().activation_bytes() / 1048576.0;
    if (pp > 1) {
        grid.pp().all_reduce_sum(idle_.data(), idle_.size());
        grid.pp().all_reduce_sum(act_mib_.data(), act_mib_.size());
    }
    const double tps = tokens_per_step / st.step_time;
    // A step faster than a denominator says the denominator was measured low (a busy machine at
    // the start): the larger figure is taken, once said, so no share reads above 100%.
    const double achieved = tps * model_.flops_per_token();
    auto gflops = [](double x) {
        char b[32];
        std::snprintf(b, sizeof b, "%.4g", x / 1e9);
        return std::string(b);
    };
    // The cached figures of this host are then marked, so the next run (or plan) measures them
    // again (rank 0; the caches are per host).
    const bool host = host_cores_used_ > 0 && grid.rank() == 0;
    if (achieved > matmul_flops_) {
        if (!raised_matmul_) {
            log("note: step " + std::to_string(s) + " reached " + gflops(achieved) +
                " GFLOP/s, above the sgemm rate measured at the start (" + gflops(matmul_flops_) +
                "): that measurement was low (a busy machine); \"of sgemm\" reads against the fastest step from now on");
            if (host) sgemm_note_achieved(achieved / 1e9 / host_cores_used_);
        }
        raised_matmul_ = true;
        matmul_flops_ = achieved;
    }
    if (achieved > peak_flops_) {
        if (!raised_peak_) {
            log("note: step " + std::to_string(s) + " reached " + gflops(achieved) + " GFLOP/s, above the peak MFU " +
                "is measured against (" + gflops(peak_flops_) + ", " + peak_what_ +
                "): that figure is too low; MFU reads against the fastest step from now on" +
                (host ? "; the cached peak is raised and will be measured again by the next run" : ""));
            if (host) host_peak_note_achieved(achieved / peak_flops_);
        }
        raised_peak_ = true;
        peak_flops_ = achieved;
    }
    const double mfu = achieved / peak_flops_;
    const double mfu_matmul = achieved / matmul_flops_;  // share of the sgemm rate
    const MoeFigures mf = moe_figures(moe);
    // Every rank's memory by category, for /memory/* (and the prediction check at the end), and
    // its step time, compute and communication wait (/ranks/*, the straggler report): one gather.
    {
        const MemoryBytes mb = memory_account();
        const double compute = std::max(0.0, st.step_time - st.comm_wait - st.data_wait);
        constexpr int kColumns = kMemoryColumns + 3;
        const double mine[kColumns] = {mb.params,  mb.grads,      mb.optimizer, mb.activations, mb.buffers,
                                       mb.runtime, mb.total,      st.step_time, compute,        st.comm_wait};
        gathered_.resize(size_t(kColumns) * world);
        grid.world().gather(mine, gathered_.data(), kColumns, 0);
        memory_all_.resize(size_t(kMemoryColumns) * world);
        for (int k = 0; k < 3; ++k) rank_col_[k].resize(size_t(world));
        for (size_t r = 0; r < size_t(world); ++r) {
            const double* row = &gathered_[r * kColumns];
            std::copy(row, row + kMemoryColumns, &memory_all_[r * kMemoryColumns]);
            for (int k = 0; k < 3; ++k) rank_col_[k][r] = row[kMemoryColumns + k];
        }
    }
    // The steady state: past the first two steps of this run (page faults, warm-up). The
    // tokens/s median and the profile's table read these steps only.
    const bool steady = s - start_step_ > 2;
    if (steady) tps_history_.push_back(tps);
    if (profile::enabled()) take_profile(st, steady);
    if (metrics_) {
        for (int c = 0; c < kMemoryColumns; ++c) {
            std::vector<double> col(static_cast<size_t>(world));
            for (size_t r = 0; r < col.size(); ++r) col[r] = memory_all_[r * kMemoryColumns + size_t(c)];
            metrics_->append_vector(ms::memory_path(ms::kMemoryCategories[size_t(c)]), col);
        }
        metrics_->append_vector(ms::kRankStepTime, rank_col_[0]);
        metrics_->append_vector(ms::kRankCompute, rank_col_[1]);
        metrics_->append_vector(ms::kRankCommWait, rank_col_[2]);
        auto train_row = std::vector<std::pair<std::string, double>>{
            {ms::kStep, double(s)}, {ms::kLoss, st.loss}, {ms::kCeLoss, st.ce_loss},
            {ms::kAuxLoss, st.aux_loss}, {ms::kLr, st.lr}, {ms::kGradNorm, st.grad_norm},
            {ms::kTokensPerS, tps}, {ms::kMfu, mfu}, {ms::kMfuMatmul, mfu_matmul},
            {ms::kStepTime, st.step_time}, {ms::kSkipped, skipped ? 1.0 : 0.0},
            {ms::kSpike, spike ? 1.0 : 0.0}, {ms::kSpikeLossLimit, st.spike_loss_limit},
            {ms::kSpikeGradNormLimit, st.spike_grad_norm_limit}};
        if (deck_.model.mtp_depth > 0) train_row.push_back({ms::kMtpLoss, st.mtp_loss});
        metrics_->append(ms::kTrain, train_row);
        metrics_->append(ms::kTiming, {{ms::kTimePipeline, st.t_pipeline}, {ms::kTimePipelineWait, st.t_wait},
                                       {ms::kTimeReplicaSync, st.t_sync}, {ms::kTimeDpReduce, st.t_dp},
                                       {ms::kTimeOptimizer, st.t_optim}, {ms::kTpComm, st.tp.seconds},
                                       {ms::kTpBytes, st.tp.bytes}, {ms::kDpBucketsOverlapped, st.dp_early},
                                       {ms::kCpComm, st.cp.seconds}, {ms::kCpExposed, st.cp.exposed_s},
                                       {ms::kCpBytes, st.cp.bytes}, {ms::kEpDispatch, st.ep_dispatch.seconds},
                                       {ms::kEpCombine, st.ep_combine.seconds},
                                       {ms::kEpBytes, st.ep_dispatch.bytes + st.ep_combine.bytes},
                                       {ms::kEpBytesAll, st.ep_bytes_all}, {ms::kEpBytesTheory, st.ep_bytes_theory}});
        if (deck_.train.probe_rms) {
            std::vector<std::pair<std::string, double>> probe;
            for (int k = 0; k < kNumProbeKinds; ++k) probe.emplace_back(kProbeNames[size_t(k)], st.probe_rms[size_t(k)]);
            metrics_->append(ms::kProbe, probe);
        }
        std::vector<std::pair<std::string, double>> row;
        for (int i = 0; i < pp; ++i) {
            row.emplace_back("stage" + std::to_string(i) + "_idle_fraction", idle_[size_t(i)]);
            row.emplace_back("stage" + std::to_string(i) + "_activation_mib", act_mib_[size_t(i)]);
        }
        metrics_->append(ms::kPipeline, row);
        if (!moe.empty()) {
            const int L = deck_.model.n_layers;
            metrics_->append_matrix(ms::kExpertLoad, mf.load, L, deck_.model.moe.experts);
            metrics_->append_matrix(ms::kImbalance, mf.imbalance, L, 1);
            metrics_->append_matrix(ms::kDeadExperts, mf.dead, L, 1);
            metrics_->append_matrix(ms::kDroppedTokens, mf.dropped, L, 1);
            metrics_->append_matrix(ms::kMoeAux, mf.aux, L, 1);
            metrics_->append_matrix(ms::kEpTokens, mf.ep_tokens, L, moe.ep());
        }
    }
    const int64_t steps = deck_.train.steps;
    // The steady steps only: the first ones (page faults, first-touch allocations) differ by rank.
    if (stragglers_ && steady)
        for (const std::string& line : stragglers_->observe(s, rank_col_[1].data(), rank_col_[2].data(),
                                                            s % deck_.output.log_every == 0))
            log(line);
    if (s % deck_.output.log_every == 0 || s == steps) {
        const double el = now_s() - t_start_;
        const double eta = el / double(s - start_step_) * double(steps - s);
        char buf[256], imb[48] = "";
        if (!moe.empty())  // the worst MoE layer's max/mean expert load
            std::snprintf(imb, sizeof imb, " | imbalance %.2f", mf.worst_imbalance);
        std::snprintf(buf, sizeof buf,
                      "step %6lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %s tok/s | MFU %.1f%% | "
                      "%.0f%% of sgemm%s | %s elapsed | ETA %s",
                      (long long)s, (long long)steps, st.loss, st.lr, st.grad_norm, human_count(tps).c_str(),
                      100.0 * mfu, 100.0 * mfu_matmul, imb, human_seconds(el).c_str(), human_seconds(eta).c_str());
        log(buf);
    }
}

void Telemetry::record_eval(int64_t s, double loss, const std::vector<double>& per_source,
                            const std::vector<Source>& sources) {
    if (std::isnan(loss)) {
        log("evaluation of step " + std::to_string(s) + " interrupted by a stop signal");
        return;
    }
    if (metrics_) metrics_->append(ms::kEval, {{ms::kStep, double(s)}, {ms::kLoss, loss}});
    char buf[96];
    std::snprintf(buf, sizeof buf, "eval step %lld | val loss %.4f", (long long)s, loss);
    std::string line = buf;
    // Each source's own loss when there are several (one source's is /eval/loss itself).
    if (per_source.size() == sources.size() && sources.size() > 1)
        for (size_t v = 0; v < sources.size(); ++v) {
            if (metrics_) metrics_->append(std::string(ms::kEval) + "/" + sources[v].name, {{ms::kLoss, per_source[v]}});
            std::snprintf(buf, sizeof buf, " | %s %.4f", sources[v].name.c_str(), per_source[v]);
            line += buf;
        }
    log(line);
}

void Telemetry::record_data(int64_t s, const std::vector<int64_t>& counts, const std::vector<Source>& sources,
                            double wait_s) {
    (void)s;
    if (!metrics_) return;
    metrics_->append(ms::kTiming, {{ms::kTimeDataWait, wait_s}});
    std::vector<double> row(counts.begin(), counts.end());
    metrics_->append_vector(ms::kSourceSamples, row);
    if (!sources_named_) {
        std::string names;
        for (const auto& src : sources) names += (names.empty() ? "" : ",") + src.name;
        metrics_->set_attr(ms::kSourceSamples, ms::kSourcesAttr, names);
        sources_named_ = true;
    }
}

void Telemetry::end_step(int64_t s) {
    if (metrics_) metrics_->flush();
    if (s != start_step_ + 1) return;
    double total = 0;
    for (double a : act_mib_) total += a;
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "activations: %.1f MiB per rank (peak of all microbatches in flight; %.1f MiB over all %d stage(s))%s",
                  act_mib_[0], total, int(act_mib_.size()), model_.tp().sp() ? ", sequence parallel" : "");
    log(buf);
}

void Telemetry::report_finished() const {
    const ProcessGrid& grid = model_.grid();
    if (grid.rank() != 0) return;
    // Rank 0, at the end of a run: the planner's prediction for this deck and layout against the
    // measured memory of the largest rank and the median tokens/s.
    const int world = grid.world().size();
    Backend& be = model_.backend();
    if (!memory_all_.empty()) {
        MachineModel mm;
        mm.cores = host_cores();
        mm.threads_per_rank = be.threads();
        mm.matmul_gflops_per_core = matmul_flops_ / 1e9 / std::max(1, std::min(mm.cores, world * be.threads()));
        LinkFigures link;
        if (read_link_cache(&link)) mm.link_gbs = link.gbs, mm.link_latency_s = link.latency_s;
        mm.runtime_base_bytes = model_.rss_before_bytes();  // after MPI_Init and the token file, before the model
        mm.data_bytes = 0;
        Deck d = deck_;
        d.parallel.dp = grid.dp().size();
        const PlanRow pr = plan_layout(d, world, mm);
        if (pr.valid && model_.host_arena()) {
            // The measured rank with the largest peak RSS.
            int big = 0;
            for (int r = 1; r < world; ++r)
                if (memory_all_[size_t(r) * kMemoryColumns + 6] > memory_all_[size_t(big) * kMemoryColumns + 6]) big = r;
            const double* m = &memory_all_[size_t(big) * kMemoryColumns];
            const double pred[kMemoryColumns] = {pr.memory.params, pr.memory.grads, pr.memory.optimizer,
                                                 pr.memory.activations, pr.memory.buffers, pr.memory.runtime,
                                                 pr.memory.total};
            static const char* names[kMemoryColumns] = {"params", "grads", "optimizer", "activations", "buffers",
                                                        "runtime", "peak RSS"};
            std::string line = "predicted (quintet plan) / measured, MiB, largest rank (" + std::to_string(big) + "):";
            for (int c = 0; c < kMemoryColumns; ++c) {
                char b[96];
                std::snprintf(b, sizeof b, "%s %s %.1f/%.1f", c ? " |" : "", names[c], pred[c] / 1048576, m[c] / 1048576);
                line += b;
            }
            log(line);
            std::vector<double> h = tps_history_;
            if (!h.empty()) {
                std::nth_element(h.begin(), h.begin() + long(h.size() / 2), h.end());
                const double med = h[h.size() / 2];
                char b[200];
                std::snprintf(b, sizeof b,
                              "predicted / measured tokens/s: %.0f / %.0f (%+.0f%%; median of %zu steps), step %.3f s "
                              "predicted (compute %.3f, bubble %.3f, comm %.3f)",
                              pr.tokens_per_s, med, 100 * (pr.tokens_per_s / med - 1), h.size(), pr.step_time_s,
                              pr.compute_s, pr.bubble_s, pr.comm_s.sum());
                log(b);
            }
        }
    }
    if (stragglers_ && grid.world().size() > 1)
        for (const std::string& line : stragglers_->summary()) log(line);
    const int pp = grid.pp().size();
    if (pp > 1) {
        const int m = deck_.parallel.microbatches, v = deck_.parallel.virtual_stages;
        char buf[160];
        std::snprintf(buf, sizeof buf, "pipeline (%s, pp=%d, m=%d, v=%d): bubble theory %.3f",
                      deck_.parallel.schedule.c_str(), pp, m, v, bubble_theory(deck_.parallel.schedule, pp, m, v));
        log(buf);
        for (int i = 0; i < pp; ++i) {
            std::snprintf(buf, sizeof buf, "  stage %d: measured idle %.3f (last step) | peak activations %.1f MiB",
                          i, idle_[size_t(i)], act_mib_[size_t(i)]);
            log(buf);
        }
    }
}

void Telemetry::report_profile() const {
    const bool steady = profile_steady_.steps > 0;
    const ProfileTotals& pt = steady ? profile_steady_ : profile_all_;
    if (model_.grid().rank() != 0 || pt.steps == 0) return;
    std::vector<std::string> names = profile_order_;
    names.push_back("other");
    auto seconds = [&](const std::string& n) {
        const auto it = pt.ops.find(n);
        return it == pt.ops.end() ? std::pair<double, int64_t>{0.0, 0} : it->second;
    };
    std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
        return seconds(a).first > seconds(b).first;
    });
    char b[240];
    std::snprintf(b, sizeof b, "profile of rank 0 over %lld %sstep(s), %.3f s per step (train.profile = true%s):",
                  (long long)pt.steps, steady ? "steady-state " : "", pt.time / pt.steps,
                  steady ? "; the first 2 steps left out, as for the tokens/s median" : "");
    log(b);
    log("  operation                        s/step   share   calls/step");
    for (const auto& n : names) {
        const auto t = seconds(n);
        std::snprintf(b, sizeof b, "  %-30s %8.4f  %5.1f%%  %8.1f", n.c_str(), t.first / pt.steps,
                      100 * t.first / pt.time, double(t.second) / pt.steps);
        log(b);
    }
}

}  // namespace quintet
