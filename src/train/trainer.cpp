#include "quintet/core/profile.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/metrics.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/perf/host_peak.hpp"
#include "quintet/perf/planner.hpp"
#include "quintet/train/lr_schedule.hpp"

namespace quintet {

namespace {

const std::string kCheckpointComm = "world (checkpoint I/O)";
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }


std::string human_time(double s) {
    char buf[32];
    if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
    else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
    else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
    return buf;
}

std::string human_rate(double x) {
    char buf[32];
    if (x >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
    else if (x >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", x / 1e3);
    else std::snprintf(buf, sizeof buf, "%.0f", x);
    return buf;
}

// What this rank holds of the model, and the padding of each arena region to its replica
// group's size (so ZeRO-1 shards are even).
ShardPlan shard_plan(const Deck& deck, const ProcessGrid& grid) {
    ShardPlan p;
    p.tp = grid.tp().size();
    p.tp_rank = grid.coord(kTP);
    p.sequence_parallel = deck.parallel.sequence_parallel;
    p.pp = grid.pp().size();
    p.chunks = stage_chunks(deck.model.n_layers, p.pp, deck.parallel.virtual_stages, grid.coord(kPP),
                            deck.parallel.pp_layers);
    p.ep = grid.ep().size();
    p.ep_rank = grid.layout().group_rank(Group::ep, grid.rank());
    p.pad[int(Replicas::dense)] = grid.dp_cp().size();
    p.pad[int(Replicas::expert)] = grid.edp().size();
    return p;
}

}  // namespace

void install_stop_signals() {
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR1, on_stop_signal);
    std::signal(SIGINT, on_stop_signal);
}

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

Trainer::Trainer(const Deck& deck, const std::string& deck_text, const ProcessGrid& grid,
                 Backend& be, const std::vector<uint32_t>& tokens, TrainerMode mode,
                 WeightsSource source)
    : deck_(deck), deck_text_(deck_text), grid_(grid), be_(be), mode_(mode), source_(std::move(source)),
      dims_(model_dims(deck.model, grid.tp().size(), grid.coord(kTP))),
      comms_(grid, be, dims_.kv_group(), dims_.tied),
      tp_(comms_.group(Group::tp), deck.parallel.sequence_parallel),
      plans_(stage_chunks(deck.model.n_layers, grid.pp().size(), deck.parallel.virtual_stages,
                          grid.coord(kPP), deck.parallel.pp_layers)),
      table_(make_param_table(deck.model, shard_plan(deck, grid))),
      sampler_(tokens, deck.data.val_fraction, deck.data.seq_len, deck.data.order == "random",
               uint64_t(deck.train.seed)) {
    const auto& dc = deck.data;
    if (sampler_.train_len() < size_t(dc.seq_len) + 1)
        config_fail("data.seq_len", std::to_string(dc.seq_len),
                    "the train split of '" + dc.path + "' has only " +
                        std::to_string(sampler_.train_len()) + " tokens; need at least seq_len + 1");
    if ((deck.eval.every > 0 || mode == TrainerMode::eval) && sampler_.val_len() < size_t(dc.seq_len) + 1)
        config_fail("data.val_fraction", std::to_string(dc.val_fraction),
                    "eval.every > 0 but the validation split has only " +
                        std::to_string(sampler_.val_len()) + " tokens; need at least seq_len + 1");
    host_arena_ = be.device() == Device::cpu;
    // Checkpoint I/O on a communicator of its own, without a deadline per operation: the whole
    // write is timed as one (save_checkpoint), and its barriers must not replace that entry.
    io_comm_ = grid.world().split(0, grid.rank(), kCheckpointComm);
    io_comm_->set_deadline(0);
    start_rss_ = process_rss_bytes();
    // On a GPU the kernels run asynchronously: host-side scopes would time launches, not work.
    profile::enable(deck.train.profile && mode == TrainerMode::train && host_arena_);
    params_ = be_.alloc(table_.total);
    if (mode_ == TrainerMode::train) {
        grads_ = be_.alloc(table_.total);
        sync_ = std::make_unique<GradientSync>(table_, be_, comms_, tp_, deck.parallel.bucket_mb,
                                               deck.parallel.zero == 1, deck.parallel.overlap_dp);
        opt_ = std::make_unique<AdamW>(table_, be_, *sync_, deck.train);
    }
    if (grid.cp().size() > 1) {
        cp_ = std::make_unique<ContextParallel>(comms_.group(Group::cp), be_, dc.micro_batch_size, dc.seq_len);
        cp_->mla_kv = deck.parallel.cp_mla_kv == "latent" ? MlaKv::latent : MlaKv::ring;
    }
    if (grid.ep().size() > 1)
        ep_ = std::make_unique<ExpertParallel>(comms_.group(Group::ep), be_, deck.model.moe.experts);
    ChunkOptions opt;
    opt.ep = ep_.get();
    opt.precision = deck.train.precision == "bf16" ? Precision::bf16 : Precision::fp32;
    opt.cp = cp_.get();
    opt.document_mask = dc.document_mask;
    opt.document_positions = deck.rope.document_positions;
    opt.eos_id = dc.eos_id;
    opt.recompute = deck.train.recompute == "full"        ? Recompute::full
                    : deck.train.recompute == "selective" ? Recompute::selective
                                                          : Recompute::none;
    if (opt.precision == Precision::bf16) params_bf16_ = be_.alloc_bf16(table_.total);
    for (const auto& plan : plans_) {
        chunks_.push_back(std::make_unique<ModelChunk>(be_, deck.model, deck.rope, table_, plan, tp_,
                                                       dc.micro_batch_size, dc.seq_len, opt));
        if (params_bf16_) chunks_.back()->set_bf16_weights(params_, params_bf16_);
        // docs/math.md §10: the aux loss is averaged over the step's microbatches of all replicas.
        chunks_.back()->set_aux_scale(1.0 / double(grid.dp().size() * deck.parallel.microbatches));
    }
    if (deck.model.moe.experts > 0) {
        moe_width_ = moe_counts_width(deck.model.moe.experts, grid.ep().size());
        moe_counts_.assign(size_t(deck.model.n_layers) * moe_width_, 0.0);
        moe_idle_.assign(size_t(deck.model.n_layers) * deck.model.moe.experts, 0);
    }
    const int pp = grid.pp().size(), stage = grid.coord(kPP);
    std::vector<PipelineStage*> stages;
    for (auto& c : chunks_) stages.push_back(c.get());
    exec_ = std::make_unique<PipelineExecutor>(
        std::move(stages), be_, comms_.group(Group::pp), stage, deck.parallel.virtual_stages,
        make_schedule(deck.parallel.schedule, pp, stage, deck.parallel.microbatches,
                      deck.parallel.virtual_stages),
        deck.parallel.microbatches, dc.micro_batch_size, dc.seq_len);
    // Layout-invariant init: each element is a function of (seed, name, logical index) only.
    std::vector<float> host(table_.total);
    init_params(host.data(), table_, deck.model, deck.init, uint64_t(deck.train.seed), 0, table_.total);
    be_.from_host(params_, host.data(), table_.total);
    refresh_bf16_weights();
    flops_per_token_ = model_flops_per_token(table_, dims_, dc.seq_len);
    if (mode_ == TrainerMode::eval) {
        peak_flops_ = matmul_flops_ = 1;
    } else if (deck.train.peak_tflops > 0 || !host_arena_) {  // deck_validate requires it on a GPU
        peak_flops_ = matmul_flops_ = deck.train.peak_tflops * 1e12 * grid.world().size();
        peak_what_ = "train.peak_tflops";
    } else {
        // MFU's denominator: the FMA peak of the cores the job runs on (cached per host).
        HostPeak hp;
        peak_flops_ = job_fma_peak_flops(grid.world(), be_.threads(), &hp);
        peak_what_ = "FMA peak, " + hp.isa + ", " + hp.source;
        // The achieved share of the measured matmul rate, the second column: every rank's sgemm
        // at once (so shared cores are not counted twice); 1024^3, best of 5, and per node the
        // best seen on this host (job_sgemm_flops): short runs read 30% low on a busy machine.
        const double g = cpu_measure_sgemm_gflops(be_, 1024, 5);
        matmul_flops_ = job_sgemm_flops(grid.world(), g, be_.threads(), &sgemm_measured_);
    }
}

MemoryBytes Trainer::memory_account() const {
    MemoryBytes m;
    const double total = double(table_.total);
    m.params = total * 4 + (params_bf16_ ? total * 2 : 0);
    if (opt_) {
        m.grads = total * 4 + double(opt_->shard_floats()) * 4;
        m.optimizer = 2.0 * double(std::max<size_t>(opt_->state_floats(), 1)) * 4;
    }
    m.activations = double(exec_->activation_bytes());
    for (const auto& c : chunks_) m.activations += double(c->scratch_bytes());
    m.buffers = double(exec_->buffer_bytes()) + (cp_ ? double(cp_->buffer_bytes()) : 0) +
                (ep_ ? double(ep_->buffer_bytes()) : 0);
    m.total = process_peak_rss_bytes();
    m.runtime = m.total - (m.params + m.grads + m.optimizer + m.activations + m.buffers);
    return m;
}

void Trainer::report_profile() const {
    const bool steady = profile_steady_.steps > 0;
    const ProfileTotals& pt = steady ? profile_steady_ : profile_all_;
    if (grid_.rank() != 0 || pt.steps == 0) return;
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

void Trainer::report_prediction() const {
    if (grid_.rank() != 0 || memory_all_.empty() || mode_ != TrainerMode::train) return;
    const int world = grid_.world().size();
    MachineModel mm;
    mm.cores = host_cores();
    mm.threads_per_rank = be_.threads();
    mm.matmul_gflops_per_core = matmul_flops_ / 1e9 / std::max(1, std::min(mm.cores, world * be_.threads()));
    LinkFigures link;
    if (read_link_cache(&link)) mm.link_gbs = link.gbs, mm.link_latency_s = link.latency_s;
    mm.runtime_base_bytes = start_rss_;  // after MPI_Init and the token file, before the model
    mm.data_bytes = 0;
    Deck d = deck_;
    d.parallel.dp = grid_.dp().size();
    const PlanRow pr = plan_layout(d, world, mm);
    if (!pr.valid || !host_arena_) return;
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
        std::nth_element(h.begin(), h.begin() + h.size() / 2, h.end());
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

Trainer::~Trainer() {
    exec_.reset();
    chunks_.clear();
    opt_.reset();
    sync_.reset();
    for (float* p : {params_, grads_})
        if (p) be_.release(p);
    if (params_bf16_) be_.release_bf16(params_bf16_);
}

void Trainer::refresh_bf16_weights() {
    if (params_bf16_) be_.to_bf16(params_bf16_, params_, table_.total);
}

void Trainer::log(const std::string& line) const {
    if (grid_.rank() == 0) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
    }
}

// Fault injection for the failure tests (docs/reliability.md): QUINTET_INJECT_FAULT =
// "rank=R,step=S[,mode=fail|hang|stop|kill|stop_checkpoint|nan|nan_once[,until=E]]" makes world
// rank R, at the start of step S (0-based: the step logged as S+1; with until, each step S..E),
// throw (fail), stop responding (hang: its main thread sleeps), stop with SIGSTOP (stop), die
// with SIGKILL (kill), SIGSTOP inside that step's checkpoint write (stop_checkpoint), or poison
// one element of its gradient with NaN each time the step runs (nan) or only the first time
// (nan_once: the rerun is finite). Returns true to poison.
namespace {
// QUINTET_INJECT_FAULT parsed once per call site; rank = -1 when unset or malformed.
struct InjectedFault {
    int rank = -1;
    long long step = -1, until = -1;
    std::string mode = "fail";
    bool hits(int r, int64_t s) const { return r == rank && s >= step && s <= std::max(step, until); }
};
InjectedFault injected_fault() {
    InjectedFault f;
    const char* spec = std::getenv("QUINTET_INJECT_FAULT");
    char mode[24] = "fail";
    if (!spec || std::sscanf(spec, "rank=%d,step=%lld,mode=%23[a-z_],until=%lld", &f.rank, &f.step, mode, &f.until) < 2)
        return InjectedFault{};
    f.mode = mode;
    return f;
}
}  // namespace

static bool maybe_inject_fault(int rank, int64_t step, bool& fired_once) {
    const InjectedFault f = injected_fault();
    if (!f.hits(rank, step)) return false;
    const std::string& m = f.mode;
    if (m == "nan") return true;
    if (m == "nan_once") {
        if (fired_once) return false;
        fired_once = true;
        return true;
    }
    if (m == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    if (m == "stop") std::raise(SIGSTOP);  // the whole process, watchdog thread included
    if (m == "kill") std::raise(SIGKILL);  // a dying rank
    if (m == "stop_checkpoint") return false;  // at the checkpoint of that step (maybe_stop_in_checkpoint)
    rank_fail("injected fault (QUINTET_INJECT_FAULT) at step " + std::to_string(step));
}

// mode=stop_checkpoint: SIGSTOP inside the checkpoint write of step S+1 (the others wait for
// this rank in its barrier).
static void maybe_stop_in_checkpoint(int rank, int64_t step) {
    const InjectedFault f = injected_fault();
    if (f.mode == "stop_checkpoint" && f.hits(rank, step - 1)) std::raise(SIGSTOP);
}

// run_dir/fault: "kind=K step=S rank=R" and the message (any rank may write it: a unique tmp,
// then a rename, so a reader never sees half a file).
void write_fault_file(const std::string& run_dir, const std::string& kind, int64_t step, int rank,
                      const std::string& what) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    const fs::path path = fs::path(run_dir) / "fault", tmp = path.string() + ".tmp" + std::to_string(getpid());
    {
        std::ofstream f(tmp);
        f << "kind=" << kind << " step=" << step << " rank=" << rank << "\n" << what << "\n";
    }
    fs::rename(tmp, path, ec);
}

void Trainer::record_fault(const std::string& kind, int64_t step, int rank, const std::string& what) const {
    if (grid_.rank() == 0) write_fault_file(deck_.output.run_dir, kind, step, rank, what);
}

std::string Trainer::locate_nonfinite(double local_loss) const {
    // This rank's first non-finite tensor (in arena order) of its gradients before any reduction.
    std::string name;
    if (!std::isfinite(local_loss)) name = "loss";
    for (const auto& spec : table_.specs) {
        if (!name.empty()) break;
        if (!spec.trainable()) continue;
        if (!std::isfinite(be_.sumsq(grads_ + spec.offset, spec.numel()))) name = "gradient of " + spec.name;
    }
    const int world = grid_.world().size();
    double first = name.empty() ? -double(world) : -double(grid_.rank());
    grid_.world().all_reduce_max(&first, 1);
    const int r = int(-first);
    if (r >= world) return "";
    char buf[256] = {0};
    if (grid_.rank() == r) std::snprintf(buf, sizeof buf, "%s", name.c_str());
    grid_.world().broadcast(buf, sizeof buf, r);
    return "rank " + std::to_string(r) + ", " + buf;
}

StepStats Trainer::step(int64_t s, bool locate) {
    const bool poison = maybe_inject_fault(grid_.rank(), s, poisoned_once_);
    StepStats st;
    const auto& p = deck_.parallel;
    const int mbs = deck_.data.micro_batch_size, T = deck_.data.seq_len;
    const int64_t gb = int64_t(grid_.dp().size()) * p.microbatches * mbs;
    const double t0 = now_s();
    tp_.reset_stats();
    if (cp_) cp_->reset_stats();
    if (ep_) ep_->reset_stats();
    be_.zero(grads_, table_.total);
    if (poison)  // the first element of this rank's first trainable tensor; the backward keeps it NaN
        for (const auto& spec : table_.specs)
            if (spec.trainable()) {
                const float nan = std::nanf("");
                be_.from_host(grads_ + spec.offset, &nan, 1);
                break;
            }
    sync_->begin_step(grads_);
    if (!moe_counts_.empty())  // what was counted since the last step (evaluation) is not this step's
        for (auto& c : chunks_) c->take_moe_counts(moe_counts_, moe_width_);
    // 1. This replica's microbatches through the pipeline schedule: forward, backward.
    // Microbatch g of the global batch (docs/math.md §10): replica r runs [r*m, (r+1)*m).
    const int64_t g0 = int64_t(grid_.coord(kDP)) * p.microbatches;
    auto data = [&](int mb, int32_t* ids, int32_t* tgt) {
        for (int j = 0; j < mbs; ++j)
            sampler_.train_sample(s, (g0 + mb) * mbs + j, gb, ids + size_t(j) * T, tgt + size_t(j) * T);
    };
    const float grad_scale = float(1.0 / (double(gb) * T));
    PipelineExecutor::Result r = exec_->run(params_, grads_, grad_scale, data, locate ? nullptr : sync_->hook());
    const double t1 = now_s();
    if (locate) st.origin = locate_nonfinite(r.ce_sum + r.aux_sum);
    // 2. Gradients summed over their replica groups (tp/kv/tied partials, then dp x cp / edp).
    st.dp_early = sync_->buckets_overlapped();
    auto [t_sync, t_dp] = [&] {
        QUINTET_PROFILE("comm.dp");
        return sync_->finish_step(grads_, opt_->shards());
    }();
    // 3. The step's loss: cross-entropy summed over every target token of the global batch
    //    (only the last stage has it), aux averaged over the microbatches.
    double sums[2] = {r.ce_sum, r.aux_sum};
    grid_.pp().all_reduce_sum(sums, 2);
    grid_.dp_cp().all_reduce_sum(sums, 2);
    const double t3 = now_s();
    // 4. Global-norm clipping and AdamW -- unless the loss or the norm is not finite (the same
    //    decision on every rank: both are all-reduced), which leaves the state as it was.
    profile::Scope optimizer_scope("optimizer");
    const double norm = opt_->grad_norm(grads_, grid_.world());
    if (!std::isfinite(sums[0]) || !std::isfinite(sums[1]) || !std::isfinite(norm)) {
        st.nonfinite = true;
        st.what = !std::isfinite(sums[0]) ? "the loss" : !std::isfinite(sums[1]) ? "the MoE aux loss" : "the gradient norm";
        st.loss = sums[0] / (double(gb) * T) + sums[1];
        st.grad_norm = norm;
        st.step_time = now_s() - t0;
        std::fill(moe_counts_.begin(), moe_counts_.end(), 0.0);  // a skipped step routes nothing
        return st;
    }
    opt_->clip(grads_, norm);
    const double lr = lr_at(deck_.train, s);
    opt_->update(params_, grads_, s, lr);
    if (!moe_counts_.empty()) {
        // The global batch's routing choices per (layer, expert), the same on every rank; the
        // aux-free biases move from them (docs/math.md §9), identically everywhere.
        std::fill(moe_counts_.begin(), moe_counts_.end(), 0.0);
        for (auto& c : chunks_) c->take_moe_counts(moe_counts_, moe_width_);
        grid_.world().all_reduce_sum(moe_counts_.data(), moe_counts_.size());
        for (auto& c : chunks_) c->update_balance_bias(params_, moe_counts_, moe_width_);
    }
    refresh_bf16_weights();
    const double t4 = now_s();
    st.ce_loss = sums[0] / (double(gb) * T);
    st.aux_loss = sums[1] / double(grid_.dp().size() * p.microbatches);
    st.loss = st.ce_loss + st.aux_loss;
    st.lr = lr;
    st.grad_norm = norm;
    st.t_wait = r.t_wait;
    st.t_pipeline = t1 - t0;
    st.t_sync = t_sync;
    st.t_dp = t_dp;
    st.t_optim = t4 - t3;
    st.step_time = t4 - t0;
    st.t_tp = tp_.seconds;
    st.tp_bytes = tp_.bytes;
    if (cp_) {
        st.t_cp = cp_->comm_s;
        st.t_cp_exposed = cp_->exposed_s;
        st.cp_bytes = cp_->bytes;
    }
    if (ep_) {
        st.t_ep_dispatch = ep_->dispatch_s;
        st.t_ep_combine = ep_->combine_s;
        st.ep_bytes = ep_->bytes;
        // Every rank's bytes against the theory from the routed counts (docs/math.md §9): each
        // row routed to another rank crosses four times (dispatch and combine, forward and
        // backward), six under full recomputation, C fp32 values each.
        st.ep_bytes_all = ep_->bytes;
        grid_.world().all_reduce_sum(&st.ep_bytes_all, 1);
        double foreign = 0;
        for (int l = 0; l < deck_.model.n_layers; ++l) foreign += moe_counts_[size_t(l) * moe_width_ + deck_.model.moe.experts + 3];
        const double crossings = deck_.train.recompute == "full" ? 6 : 4;
        st.ep_bytes_theory = foreign * crossings * double(deck_.model.d_model) * sizeof(float);
    }
    return st;
}

// The per-layer MoE figures of the step just taken, from the counts every rank has (dense layers
// of moe.layers read 0), and the dead-expert counters advanced.
Trainer::MoeFigures Trainer::moe_figures() {
    MoeFigures f;
    if (moe_counts_.empty()) return f;
    const int L = deck_.model.n_layers, E = deck_.model.moe.experts, ep = grid_.ep().size();
    f.load.assign(size_t(L) * E, 0.0);
    f.imbalance.assign(size_t(L), 0.0), f.dead.assign(size_t(L), 0.0), f.dropped.assign(size_t(L), 0.0);
    f.aux.assign(size_t(L), 0.0), f.ep_tokens.assign(size_t(L) * ep, 0.0);
    for (int l = 0; l < L; ++l) {
        if (!moe_layer(deck_.model, l)) continue;
        const double* c = moe_counts_.data() + size_t(l) * moe_width_;
        double sum = 0, max = 0;
        for (int e = 0; e < E; ++e) {
            f.load[size_t(l) * E + e] = c[e];
            sum += c[e], max = std::max(max, c[e]);
            int64_t& idle = moe_idle_[size_t(l) * E + e];
            idle = c[e] > 0 ? 0 : idle + 1;
            if (idle >= deck_.model.moe.dead_after) f.dead[size_t(l)] += 1;
        }
        f.imbalance[size_t(l)] = sum > 0 ? max / (sum / E) : 0.0;
        f.worst_imbalance = std::max(f.worst_imbalance, f.imbalance[size_t(l)]);
        f.dropped[size_t(l)] = c[E];
        f.aux[size_t(l)] = c[E + 2] > 0 ? c[E + 1] / c[E + 2] : 0.0;
        for (int g = 0; g < ep; ++g) f.ep_tokens[size_t(l) * ep + g] = c[E + 4 + g];
    }
    return f;
}

// Forward only, through the pipeline virtual stage by virtual stage; batch i runs on replica i % dp.
double Trainer::evaluate(std::vector<double>* by_position) {
    const int mbs = deck_.data.micro_batch_size, T = deck_.data.seq_len;
    const int dp = grid_.dp().size(), r = grid_.coord(kDP);
    std::vector<int32_t> ids(size_t(mbs) * T), tgt(ids.size());
    std::vector<double> pos_sum(by_position ? size_t(T) : 0, 0.0);
    const ModelChunk& last = *chunks_.back();
    double sum = 0.0;
    // Under expert parallelism the replicas of an ep group exchange tokens in every forward, so
    // each runs as many forwards as the busiest one (a replica without a batch of its own
    // repeats batch 0 and counts nothing).
    const int nb = deck_.eval.batches, rounds = (nb + dp - 1) / dp;
    for (int round = 0; round < rounds; ++round) {
        // A stop signal ends a long evaluation too (agreed on by every rank each round).
        double stop = g_stop_signal ? 1.0 : 0.0;
        grid_.world().all_reduce_max(&stop, 1);
        if (stop > 0) return std::nan("");
        const int i = round * dp + r;
        const bool counted = i < nb;
        if (!counted && !ep_) continue;
        for (int j = 0; j < mbs; ++j)
            sampler_.val_sample(counted ? i : 0, j, mbs, ids.data() + size_t(j) * T, tgt.data() + size_t(j) * T);
        const double loss = exec_->forward_only(params_, ids.data(), tgt.data());
        if (!counted) continue;
        sum += loss;
        if (by_position && last.plan().last) {
            const auto& l = last.token_losses();
            for (size_t n = 0; n < l.size(); ++n) pos_sum[size_t(last.position_of_row(int(n)))] += l[n];
        }
    }
    grid_.pp().all_reduce_sum(&sum, 1);
    grid_.dp_cp().all_reduce_sum(&sum, 1);  // cp ranks hold disjoint tokens of each sample
    if (by_position) {
        grid_.pp().all_reduce_sum(pos_sum.data(), pos_sum.size());
        grid_.dp_cp().all_reduce_sum(pos_sum.data(), pos_sum.size());
        const double samples = double(deck_.eval.batches) * mbs;
        by_position->resize(size_t(T));
        for (int t = 0; t < T; ++t) (*by_position)[size_t(t)] = pos_sum[size_t(t)] / samples;
    }
    return sum / (double(deck_.eval.batches) * mbs * T);
}

void Trainer::load_weights(const std::string& path) {
    checkpoint_inspect(path, table_, false);
    std::vector<float> hp;
    float* dst = params_;
    if (!host_arena_) {
        hp.resize(table_.total);
        dst = hp.data();
    }
    checkpoint_load(path, table_, dst, nullptr, nullptr, {});
    if (!host_arena_) be_.from_host(params_, hp.data(), table_.total);
    refresh_bf16_weights();
}

// The arena ranges this rank writes: its dp-owned slice of each trainable region, and the
// buffers (identical on every replica) from the first rank of its dp x cp group.
std::vector<ArenaRange> Trainer::checkpoint_writes() const {
    std::vector<ArenaRange> w;
    for (int r = 0; r < kNumRegions; ++r)
        if (sync_->region(r)) w.push_back(opt_->write_range(r));
    const Range buf = table_.region[int(Replicas::none)];
    if (buf.size() > 0 && grid_.dp_cp().rank() == 0) w.push_back({buf, 0});
    return w;
}

std::vector<ArenaRange> Trainer::checkpoint_state() const {
    std::vector<ArenaRange> w;
    for (int r = 0; r < kNumRegions; ++r)
        if (sync_->region(r)) w.push_back(opt_->state_range(r));
    return w;
}


void Trainer::save_checkpoint(int64_t step) {
    // Never checkpoint non-finite weights over good ones (every rank checks its arena).
    double bad = std::isfinite(be_.sumsq(params_, table_.total)) ? 0.0 : 1.0;
    grid_.world().all_reduce_max(&bad, 1);
    if (bad > 0) {
        const std::string msg = "the weights are not finite at step " + std::to_string(step) +
                                "; the checkpoint is not written";
        record_fault("diverged", step, -1, msg);
        throw DivergedError(msg + " (the last good one is " + (last_checkpoint_.empty() ? "none" : last_checkpoint_) + ")");
    }
    CheckpointMeta meta;
    meta.step = step;
    meta.tokens_seen = tokens_seen_;
    meta.deck = deck_text_;
    meta.layout = grid_.layout().describe() + " zero=" + std::to_string(deck_.parallel.zero);
    meta.trained_context = std::max<int64_t>(source_.trained_context, deck_.data.seq_len);
    // On the CPU backend the arenas are host memory; a device backend stages them through host.
    const float *p = params_, *m = opt_->exp_avg(), *v = opt_->exp_avg_sq();
    std::vector<float> hp, hm, hv;
    if (!host_arena_) {
        const size_t ns = opt_->state_floats();
        hp.resize(table_.total);
        hm.resize(ns);
        hv.resize(ns);
        be_.to_host(hp.data(), params_, table_.total);
        be_.to_host(hm.data(), opt_->exp_avg(), ns);
        be_.to_host(hv.data(), opt_->exp_avg_sq(), ns);
        p = hp.data(), m = hm.data(), v = hv.data();
    }
    const double t0 = now_s();
    // The metrics history up to this step beside the checkpoint, complete before it is: a resume
    // rebuilds an unreadable metrics.h5 from it.
    if (metrics_) metrics_->snapshot_to(checkpoint_metrics_path(checkpoint_path(deck_.output.run_dir, step)));
    // The whole write (its barriers and collective I/O) under the collective deadline.
    Watchdog* w = grid_.watchdog();
    if (w) w->begin("checkpoint write", &kCheckpointComm, grid_.rank(), grid_.world().size(), uint64_t(step),
                    deck_.train.collective_timeout_s, &grid_.world().world_ranks());
    maybe_stop_in_checkpoint(grid_.rank(), step);
    std::string path = checkpoint_save(*io_comm_, deck_.output.run_dir, meta, table_,
                                       p, m, v, checkpoint_writes(), deck_.checkpoint.keep);
    if (w) w->end();
    char secs[32];
    std::snprintf(secs, sizeof secs, " (%.2f s)", now_s() - t0);
    log("checkpoint " + path + secs);
    last_checkpoint_ = path;
}

void Trainer::resume_if_asked() {
    const std::string& mode = deck_.checkpoint.resume;
    if (mode == "none" && !checkpoint_latest(deck_.output.run_dir).empty())
        config_fail("checkpoint.resume", "none",
                    "output.run_dir '" + deck_.output.run_dir +
                        "' already holds checkpoints that a fresh run would overwrite; use "
                        "checkpoint.resume=auto to continue, or another output.run_dir");
    for (const auto& w : source_.warnings) log("warning: " + w);
    if (source_.path.empty()) return;
    if (!source_.resume) {  // checkpoint.init_from: weights only, a fresh run from step 0
        CheckpointMeta meta = checkpoint_read_meta(source_.path);
        load_weights(source_.path);
        log("initialised the weights from " + source_.path + " (step " + std::to_string(meta.step) +
            ", written with " + meta.layout + ", trained at context " +
            std::to_string(source_.trained_context) + "); step 0, fresh optimizer and schedule");
        return;
    }
    const std::string& path = source_.path;
    CheckpointMeta meta = checkpoint_inspect(path, table_);
    if (host_arena_) {
        checkpoint_load(path, table_, params_, opt_->exp_avg(), opt_->exp_avg_sq(), checkpoint_state());
    } else {
        const size_t ns = opt_->state_floats();
        std::vector<float> hp(table_.total), hm(ns), hv(ns);
        checkpoint_load(path, table_, hp.data(), hm.data(), hv.data(), checkpoint_state());
        be_.from_host(params_, hp.data(), table_.total);
        be_.from_host(opt_->exp_avg(), hm.data(), ns);
        be_.from_host(opt_->exp_avg_sq(), hv.data(), ns);
    }
    refresh_bf16_weights();
    start_step_ = meta.step;
    tokens_seen_ = meta.tokens_seen;
    last_checkpoint_ = path;
    log("resumed from " + path + " at step " + std::to_string(meta.step) + " (written with " +
        meta.layout + ")");
}

int Trainer::run() {
    // A deadline that passes (exit status 4, docs/reliability.md) is recorded for job scripts first: by
    // the watchdog thread for blocking collectives and checkpoint writes, here for the waits that
    // poll their deadline themselves.
    if (Watchdog* w = grid_.watchdog()) {
        const std::string dir = deck_.output.run_dir;
        w->set_status_dir((std::filesystem::path(dir) / ".ranks").string());
        const int rank = grid_.rank();
        const std::atomic<int64_t>* step = &current_step_;
        w->on_expiry([dir, rank, step](const std::string& report) {
            write_fault_file(dir, "transient", step->load() + 1, rank, report);
            std::fprintf(stderr, "%s\n", report.c_str());
            std::fflush(stderr);
            _exit(4);
        });
    }
    try {
        return run_steps();
    } catch (const DeadlineError& e) {
        write_fault_file(deck_.output.run_dir, "transient", current_step_.load() + 1, grid_.rank(), e.what());
        throw;
    }
}

int Trainer::run_steps() {
    const auto& t = deck_.train;
    const int pp = grid_.pp().size(), stage = grid_.coord(kPP);
    const int64_t gb = int64_t(grid_.dp().size()) * deck_.parallel.microbatches * deck_.data.micro_batch_size;
    const int64_t tokens_per_step = gb * deck_.data.seq_len;
    resume_if_asked();
    if (grid_.rank() == 0) {
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "model: %.2fM params (%.2fM in matmuls), vocab %d, %d layers, d_model %d, "
                      "heads %d/%d, ffn %d | layout %s%s | schedule %s | global batch %lld x %d "
                      "tokens | %s | peak %.1f GFLOP/s (%s), sgemm %.1f GFLOP/s",
                      [&] { size_t n = 0; for (auto& l : table_.logical) n += l.numel(); return n; }() / 1e6,
                      table_.matmul_params / 1e6, dims_.V, dims_.L, dims_.C, dims_.NH, dims_.NKV,
                      dims_.F, grid_.layout().describe().c_str(), tp_.sp() ? " +sp" : "",
                      deck_.parallel.schedule.c_str(), (long long)gb, deck_.data.seq_len,
                      deck_.train.precision.c_str(), peak_flops_ / 1e9, peak_what_.c_str(),
                      matmul_flops_ / 1e9);
        std::string line = buf;
        if (sgemm_measured_ > 0 && sgemm_measured_ < matmul_flops_) {
            std::snprintf(buf, sizeof buf, " (the best measured on this host; this run measured %.1f)", sgemm_measured_ / 1e9);
            line += buf;
        }
        log(line);
    }
    if (grid_.rank() == 0) {
        metrics_ = std::make_unique<MetricsFile>(deck_.output.run_dir, deck_text_, start_step_,
                                                 source_.resume ? checkpoint_metrics_path(source_.path) : "");
        for (const auto& w : metrics_->warnings) log("warning: " + w);
    }
    MetricsFile* metrics = metrics_.get();
    if (metrics && !moe_idle_.empty() && start_step_ > 0) {
        // The dead-expert counters continue from the history up to the resumed step.
        const std::vector<double> h = metrics->read_all("/moe/expert_load");
        for (size_t row = 0; row + moe_idle_.size() <= h.size(); row += moe_idle_.size())
            for (size_t i = 0; i < moe_idle_.size(); ++i) moe_idle_[i] = h[row + i] > 0 ? 0 : moe_idle_[i] + 1;
    }
    if (t.steps == 0 || start_step_ >= t.steps) {
        if (start_step_ == 0) save_checkpoint(0);
        return 0;
    }
    const double t_start = now_s();
    int64_t s = start_step_;
    std::vector<double> idle(pp), act_mib(pp);
    current_step_.store(s);
    while (s < t.steps) {
        StepStats st = step(s);
        bool skipped = false;
        if (st.nonfinite) {
            // Re-run once from the same state (docs/reliability.md): finite now = a transient fault. (The
            // rerun is the same computation, so it continues the unbroken curve bit for bit.)
            StepStats again = step(s);
            if (again.nonfinite) again = step(s, true);  // reproduced: once more, to find where it starts
            if (!again.nonfinite) {
                log("warning: step " + std::to_string(s + 1) + ": " + st.what +
                    " was not finite, and is finite when the step is re-run from the same state: a "
                    "transient fault (suspect this job's hardware); continuing");
                record_fault("transient_nonfinite", s + 1, -1, st.what + " not finite once; the rerun was finite");
                st = again;
            } else {
                const std::string msg = "step " + std::to_string(s + 1) + ": " + again.what +
                                        " is not finite, also when the step is re-run from the same state; "
                                        "it first appears on " + (again.origin.empty() ? "no rank's local values (in a reduction)" : again.origin);
                int origin_rank = -1;
                std::sscanf(again.origin.c_str(), "rank %d", &origin_rank);
                if (t.on_nonfinite == "stop" || skips_in_row_ + 1 >= t.max_skips) {
                    record_fault("diverged", s + 1, origin_rank, msg);
                    throw DivergedError(msg + (t.on_nonfinite == "skip" ? "; " + std::to_string(t.max_skips) +
                                                   " steps in a row skipped (train.max_skips)" : "") +
                                        ". No update was applied and no checkpoint written; the last good one is " +
                                        (last_checkpoint_.empty() ? "none" : last_checkpoint_) +
                                        " (train.on_nonfinite = " + t.on_nonfinite + ")");
                }
                ++skips_in_row_;
                log("warning: " + msg + "; the update is skipped (train.on_nonfinite = skip, " +
                    std::to_string(skips_in_row_) + " in a row of at most " + std::to_string(t.max_skips) + ")");
                st = again;
                skipped = true;
            }
        }
        if (!skipped) skips_in_row_ = 0;
        if (lock_) lock_->touch();
        ++s;
        current_step_.store(s);
        tokens_seen_ += tokens_per_step;
        // Every stage's bubble (time blocked in pipeline receives / time of the schedule) and
        // activation memory, gathered for rank 0.
        std::fill(idle.begin(), idle.end(), 0.0);
        std::fill(act_mib.begin(), act_mib.end(), 0.0);
        idle[stage] = st.t_pipeline > 0 ? st.t_wait / st.t_pipeline : 0.0;
        act_mib[stage] = exec_->activation_bytes() / 1048576.0;
        if (pp > 1) {
            grid_.pp().all_reduce_sum(idle.data(), idle.size());
            grid_.pp().all_reduce_sum(act_mib.data(), act_mib.size());
        }
        double tps = tokens_per_step / st.step_time;
        const double mfu = tps * flops_per_token_ / peak_flops_;
        const double mfu_matmul = tps * flops_per_token_ / matmul_flops_;  // share of the sgemm rate
        const MoeFigures moe = moe_figures();
        // Every rank's memory by category, for /memory/* (and the prediction check at the end).
        {
            const MemoryBytes mb = memory_account();
            const double mine[kMemoryColumns] = {mb.params, mb.grads, mb.optimizer, mb.activations,
                                                 mb.buffers, mb.runtime, mb.total};
            memory_all_.resize(size_t(kMemoryColumns) * grid_.world().size());
            grid_.world().gather(mine, memory_all_.data(), kMemoryColumns, 0);
        }
        // The steady state: past the first two steps of this run (page faults, warm-up). The
        // tokens/s median and the profile's table read these steps only.
        const bool steady = s - start_step_ > 2;
        if (steady) tps_history_.push_back(tps);
        if (profile::enabled()) {
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
            if (metrics) metrics->append("/timing/op", ops);
        }
        if (metrics) {
            static const char* names[kMemoryColumns] = {"params", "grads", "optimizer", "activations",
                                                        "buffers", "runtime", "peak_rss"};
            for (int c = 0; c < kMemoryColumns; ++c) {
                std::vector<double> col(size_t(grid_.world().size()));
                for (size_t r = 0; r < col.size(); ++r) col[r] = memory_all_[r * kMemoryColumns + size_t(c)];
                metrics->append_vector(std::string("/memory/") + names[c] + "_bytes", col);
            }
            metrics->append("/train", {{"step", double(s)}, {"loss", st.loss}, {"ce_loss", st.ce_loss},
                                       {"aux_loss", st.aux_loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm},
                                       {"tokens_per_s", tps}, {"mfu", mfu}, {"mfu_matmul", mfu_matmul},
                                       {"step_time_s", st.step_time},
                                       {"skipped", skipped ? 1.0 : 0.0}});
            metrics->append("/timing", {{"pipeline", st.t_pipeline}, {"pipeline_wait", st.t_wait},
                                        {"replica_sync", st.t_sync}, {"dp_reduce", st.t_dp},
                                        {"optimizer", st.t_optim}, {"tp_comm", st.t_tp},
                                        {"tp_bytes", st.tp_bytes}, {"dp_buckets_overlapped", st.dp_early},
                                        {"cp_comm", st.t_cp}, {"cp_exposed", st.t_cp_exposed},
                                        {"cp_bytes", st.cp_bytes}, {"ep_dispatch", st.t_ep_dispatch},
                                        {"ep_combine", st.t_ep_combine}, {"ep_bytes", st.ep_bytes},
                                        {"ep_bytes_all", st.ep_bytes_all}, {"ep_bytes_theory", st.ep_bytes_theory}});
            std::vector<std::pair<std::string, double>> row;
            for (int i = 0; i < pp; ++i) {
                row.emplace_back("stage" + std::to_string(i) + "_idle_fraction", idle[i]);
                row.emplace_back("stage" + std::to_string(i) + "_activation_mib", act_mib[i]);
            }
            metrics->append("/pipeline", row);
            if (!moe_counts_.empty()) {  // the step's counts (step() filled them)
                const int L = deck_.model.n_layers;
                metrics->append_matrix("/moe/expert_load", moe.load, L, deck_.model.moe.experts);
                metrics->append_matrix("/moe/imbalance", moe.imbalance, L, 1);
                metrics->append_matrix("/moe/dead_experts", moe.dead, L, 1);
                metrics->append_matrix("/moe/dropped_tokens", moe.dropped, L, 1);
                metrics->append_matrix("/moe/aux", moe.aux, L, 1);
                metrics->append_matrix("/moe/ep_tokens", moe.ep_tokens, L, grid_.ep().size());
            }
        }
        if (s % deck_.output.log_every == 0 || s == t.steps) {
            double el = now_s() - t_start;
            double eta = el / double(s - start_step_) * double(t.steps - s);
            char buf[256], imb[48] = "";
            if (!moe_counts_.empty())  // the worst MoE layer's max/mean expert load
                std::snprintf(imb, sizeof imb, " | imbalance %.2f", moe.worst_imbalance);
            std::snprintf(buf, sizeof buf,
                          "step %6lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %s tok/s | MFU %.1f%% | "
                          "%.0f%% of sgemm%s | "
                          "%s elapsed | ETA %s",
                          (long long)s, (long long)t.steps, st.loss, st.lr, st.grad_norm,
                          human_rate(tps).c_str(), 100.0 * mfu, 100.0 * mfu_matmul, imb, human_time(el).c_str(),
                          human_time(eta).c_str());
            log(buf);
        }
        if (deck_.eval.every > 0 && (s % deck_.eval.every == 0 || s == t.steps)) {
            double vl = evaluate();
            if (std::isnan(vl)) {
                log("evaluation of step " + std::to_string(s) + " interrupted by a stop signal");
            } else {
                if (metrics) metrics->append("/eval", {{"step", double(s)}, {"loss", vl}});
                char buf[96];
                std::snprintf(buf, sizeof buf, "eval step %lld | val loss %.4f", (long long)s, vl);
                log(buf);
            }
        }
        if (metrics) metrics->flush();
        if (s == start_step_ + 1) {
            double total = 0;
            for (double a : act_mib) total += a;
            char buf[160];
            std::snprintf(buf, sizeof buf,
                          "activations: %.1f MiB per rank (peak of all microbatches in flight; %.1f MiB over all %d stage(s))%s",
                          act_mib[0], total, pp, tp_.sp() ? ", sequence parallel" : "");
            log(buf);
        }
        // Stop signals are agreed on by all ranks, so everyone checkpoints the same step.
        double stop = g_stop_signal ? 1.0 : 0.0;
        grid_.world().all_reduce_max(&stop, 1);
        bool exit_now = t.exit_after > 0 && s - start_step_ >= t.exit_after;
        bool periodic = deck_.checkpoint.every > 0 && s % deck_.checkpoint.every == 0;
        if (periodic || s == t.steps || stop > 0 || exit_now) {
            save_checkpoint(s);
            if (stop == 0) {  // a signal that arrived during the write stops at the checkpoint just written
                stop = g_stop_signal ? 1.0 : 0.0;
                grid_.world().all_reduce_max(&stop, 1);
            }
        }
        if ((stop > 0 || exit_now) && s < t.steps) {
            log(std::string(stop > 0 ? "stop signal received" : "train.exit_after reached") +
                ": checkpointed step " + std::to_string(s) + "; resume with checkpoint.resume=auto");
            break;
        }
        if (s == t.steps) report_prediction();
        if (s == t.steps && pp > 1) {
            const int m = deck_.parallel.microbatches, v = deck_.parallel.virtual_stages;
            char buf[160];
            std::snprintf(buf, sizeof buf, "pipeline (%s, pp=%d, m=%d, v=%d): bubble theory %.3f",
                          deck_.parallel.schedule.c_str(), pp, m, v,
                          bubble_theory(deck_.parallel.schedule, pp, m, v));
            log(buf);
            for (int i = 0; i < pp; ++i) {
                std::snprintf(buf, sizeof buf, "  stage %d: measured idle %.3f (last step) | peak activations %.1f MiB",
                              i, idle[i], act_mib[i]);
                log(buf);
            }
        }
    }
    if (profile::enabled()) report_profile();
    return 0;
}

}  // namespace quintet
