#include "quintet/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/metrics.hpp"
#include "quintet/train/schedule_math.hpp"
#ifdef QUINTET_WITH_CUDA
#include "quintet/comm/nccl_communicator.hpp"
#endif

namespace quintet {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

constexpr int kTagFwd = 0, kTagBwd = 1;

}  // namespace

namespace {

// collective over the grid. Sub-groups of replicated tensors are split from the MPI grid; on
// the CUDA backend every device communicator is an NCCL one over the same ranks.
DeviceComms make_device_comms(const ProcessGrid& grid, Backend& be, const ModelDims& d) {
    DeviceComms c;
    const int pp = grid.pp().size(), stage = grid.coord(kPP);
    std::unique_ptr<MpiCommunicator> kv, tied;
    if (d.tp > d.NKV) kv = grid.split(kTP, grid.coord(kTP) / d.kv_group());
    if (d.tied && pp > 1) tied = grid.split(kPP, stage == 0 || stage == pp - 1 ? 0 : -1);
    if (be.device() == Device::cpu) {
        c.tp = &grid.tp();
        c.pp = &grid.pp();
        c.dp = &grid.dp();
        c.kv_group = std::move(kv);
        c.tied = std::move(tied);
        return c;
    }
#ifdef QUINTET_WITH_CUDA
    auto& cuda = static_cast<CudaBackend&>(be);
    for (Axis a : {kTP, kPP, kDP}) c.owned.push_back(std::make_unique<NcclCommunicator>(grid.comm(a).handle(), cuda));
    c.tp = c.owned[0].get();
    c.pp = c.owned[1].get();
    c.dp = c.owned[2].get();
    if (kv) c.kv_group = std::make_unique<NcclCommunicator>(kv->handle(), cuda);
    if (tied) c.tied = std::make_unique<NcclCommunicator>(tied->handle(), cuda);
    // The MPI sub-communicators are needed only for NCCL's bootstrap.
    return c;
#else
    rank_fail("a device backend without a CUDA build");
#endif
}

}  // namespace

void install_stop_signals() {
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR1, on_stop_signal);
}

Trainer::Trainer(const Deck& deck, const std::string& deck_text, const ProcessGrid& grid,
                 Backend& be, const std::vector<uint32_t>& tokens)
    : deck_(deck), deck_text_(deck_text), grid_(grid), be_(be),
      comms_(make_device_comms(grid, be, model_dims(deck.model, grid.tp().size(), grid.coord(kTP)))),
      tp_(*comms_.tp, deck.parallel.sequence_parallel),
      plans_(stage_chunks(deck.model.n_layers, grid.pp().size(), deck.parallel.virtual_stages,
                          grid.coord(kPP), deck.parallel.pp_layers)),
      table_(make_param_table(deck.model, grid.tp().size(), grid.coord(kTP), plans_,
                              deck.parallel.sequence_parallel, grid.pp().size())),
      dims_(model_dims(deck.model, grid.tp().size(), grid.coord(kTP))),
      sampler_(tokens, deck.data.val_fraction, deck.data.seq_len, deck.data.order == "random",
               uint64_t(deck.train.seed)) {
    const auto& dc = deck.data;
    if (sampler_.train_len() < size_t(dc.seq_len) + 1)
        config_fail("data.seq_len", std::to_string(dc.seq_len),
                    "the train split of '" + dc.path + "' has only " +
                        std::to_string(sampler_.train_len()) + " tokens; need at least seq_len + 1");
    if (deck.eval.every > 0 && sampler_.val_len() < size_t(dc.seq_len) + 1)
        config_fail("data.val_fraction", std::to_string(dc.val_fraction),
                    "eval.every > 0 but the validation split has only " +
                        std::to_string(sampler_.val_len()) + " tokens; need at least seq_len + 1");
    if (const char* e = std::getenv("QUINTET_P2P_TIMEOUT_S")) p2p_timeout_s_ = std::atof(e);
    const int pp = grid.pp().size(), stage = grid.coord(kPP);
    host_arena_ = be.device() == Device::cpu;
    dp_ = std::make_unique<DataParallel>(*comms_.dp, table_.total, deck.parallel.bucket_mb,
                                         deck.parallel.zero == 1);
    const size_t padded = dp_->padded();
    params_ = be_.alloc(padded);
    grads_ = be_.alloc(padded);
    Range own = dp_->owned();
    opt_size_ = dp_->zero() ? dp_->shard_size() : table_.total;
    opt_base_ = dp_->zero() ? own.lo : 0;
    overlap_ = deck.parallel.overlap_dp && !dp_->zero() && grid.dp().size() > 1;
    overlap_hook_.t = this;
    synced_.assign(table_.specs.size(), 0);
    for (size_t i = 0; i < table_.specs.size(); ++i) spec_at_offset_[table_.specs[i].offset] = i;
    m_ = be_.alloc(opt_size_);
    v_ = be_.alloc(opt_size_);
    if (dp_->zero()) gshard_ = be_.alloc(dp_->shard_size());
    const Precision prec = deck.train.precision == "bf16" ? Precision::bf16 : Precision::fp32;
    if (prec == Precision::bf16) params_bf16_ = be_.alloc_bf16(padded);
    for (const auto& plan : plans_) {
        chunks_.push_back(std::make_unique<ModelChunk>(be_, deck.model, deck.rope, table_, plan, tp_,
                                                       dc.micro_batch_size, dc.seq_len, prec));
        if (params_bf16_) chunks_.back()->set_bf16_weights(params_, params_bf16_);
    }
    actions_ = make_schedule(deck.parallel.schedule, pp, stage, deck.parallel.microbatches,
                             deck.parallel.virtual_stages);
    recv_stage_ = be_.alloc(chunks_[0]->boundary_floats());
    const int nc = int(chunks_.size()), m = deck.parallel.microbatches;
    free_slots_.assign(nc, {});
    slot_of_mb_.assign(nc, std::vector<int>(m, -1));
    pending_.assign(nc, {});
    in_flight_.assign(nc, 0);
    peak_in_flight_.assign(nc, 0);
    backwards_left_.assign(nc, 0);
    ids_.resize(size_t(dc.micro_batch_size) * dc.seq_len);
    tgt_.resize(ids_.size());
    // Layout-invariant init: each element is a function of (seed, name, logical index) only.
    std::vector<float> host(table_.total);
    init_params(host.data(), table_, deck.model, deck.init, uint64_t(deck.train.seed), 0, table_.total);
    be_.from_host(params_, host.data(), table_.total);
    refresh_bf16_weights();
    flops_per_token_ = model_flops_per_token(table_, dims_, dc.seq_len);
    if (deck.train.peak_tflops > 0 || !host_arena_) {  // deck_validate requires it on a GPU
        peak_flops_ = deck.train.peak_tflops * 1e12 * grid.world().size();
    } else {
        // Measured sgemm rate of every rank at once (so shared cores are not counted twice);
        // 1024^3, best of 5: short runs read 30% low on a busy machine and inflate MFU.
        double g = cpu_measure_sgemm_gflops(be_, 1024, 5);
        grid.world().all_reduce_sum(&g, 1);
        peak_flops_ = g * 1e9;
    }
}

Trainer::~Trainer() {
    for (float* p : {params_, grads_, m_, v_, gshard_, recv_stage_})
        if (p) be_.release(p);
    if (params_bf16_) be_.release_bf16(params_bf16_);
}

void Trainer::refresh_bf16_weights() {
    if (params_bf16_) be_.to_bf16(params_bf16_, params_, dp_->padded());
}

void Trainer::log(const std::string& line) const {
    if (grid_.rank() == 0) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
    }
}

int Trainer::acquire_slot(int c) {
    // A free slot whose sends have completed; waiting for one that has not could deadlock (its
    // receiver may post the matching recv only later in its schedule), so then take a new slot.
    auto sends_done = [&](int slot) {
        auto& hs = pending_[c][slot];
        hs.erase(std::remove_if(hs.begin(), hs.end(), [&](int h) { return comms_.pp->test(h); }), hs.end());
        return hs.empty();
    };
    int slot = -1;
    for (size_t i = 0; i < free_slots_[c].size(); ++i)
        if (sends_done(free_slots_[c][i])) {
            slot = free_slots_[c][i];
            free_slots_[c].erase(free_slots_[c].begin() + long(i));
            break;
        }
    if (slot < 0) {
        slot = chunks_[c]->add_slot();  // only until the schedule's steady state is reached
        pending_[c].emplace_back();
    }
    peak_in_flight_[c] = std::max(peak_in_flight_[c], ++in_flight_[c]);
    return slot;
}

// The pipeline executor: runs this stage's action list for step s.
void Trainer::run_schedule(int64_t s, StepStats& st, double& loss_sum) {
    const auto& p = deck_.parallel;
    const int mbs = deck_.data.micro_batch_size, T = deck_.data.seq_len;
    const int pp = grid_.pp().size(), stage = grid_.coord(kPP), v = p.virtual_stages;
    const int64_t gb = int64_t(grid_.dp().size()) * p.microbatches * mbs;
    const float grad_scale = float(1.0 / (double(gb) * T));
    const Communicator& comm = *comms_.pp;
    for (auto& slots : slot_of_mb_) std::fill(slots.begin(), slots.end(), -1);
    std::fill(backwards_left_.begin(), backwards_left_.end(), p.microbatches);
    char what[96];
    // Receives are posted one ahead into a staging buffer: the next message can land while this
    // stage computes, and no activation slot is taken before the schedule needs it.
    auto is_recv = [](Op op) { return op == Op::recv_fwd || op == Op::recv_bwd; };
    int posted = -1;
    auto post_next = [&](size_t from) {
        for (size_t k = from; k < actions_.size(); ++k) {
            const Action& a = actions_[k];
            if (!is_recv(a.op)) continue;
            posted = comm.irecv(recv_stage_, chunks_[a.chunk]->boundary_floats(),
                                schedule_peer(pp, v, stage, a).stage,
                                a.op == Op::recv_fwd ? kTagFwd : kTagBwd);
            return;
        }
    };
    post_next(0);
    for (size_t k = 0; k < actions_.size(); ++k) {
        const Action& a = actions_[k];
        ModelChunk& chunk = *chunks_[a.chunk];
        int& slot = slot_of_mb_[a.chunk][a.microbatch];
        const size_t n = chunk.boundary_floats();
        const int vs = virtual_stage(pp, stage, a.chunk);
        switch (a.op) {
        case Op::recv_fwd:
        case Op::recv_bwd: {
            const bool fwd = a.op == Op::recv_fwd;
            if (fwd) slot = acquire_slot(a.chunk);
            std::snprintf(what, sizeof what, "stage %d: %s mb %d (virtual stage %d)", stage,
                          fwd ? "recv_fwd" : "recv_bwd", a.microbatch, vs);
            double t0 = now_s();
            comm.wait_recv(posted, p2p_timeout_s_, what);
            st.t_wait += now_s() - t0;
            be_.copy(fwd ? chunk.input(slot) : chunk.grad_output(slot), recv_stage_, n);
            post_next(k + 1);
            break;
        }
        case Op::forward: {
            if (slot < 0) slot = acquire_slot(a.chunk);
            // Microbatch g of the global batch (DESIGN §3): replica r runs [r*m, (r+1)*m).
            const int64_t g = int64_t(grid_.coord(kDP)) * p.microbatches + a.microbatch;
            if (chunk.plan().first || chunk.plan().last)
                for (int j = 0; j < mbs; ++j)
                    sampler_.train_sample(s, g * mbs + j, gb, ids_.data() + size_t(j) * T,
                                          tgt_.data() + size_t(j) * T);
            loss_sum += chunk.forward(slot, params_, ids_.data(), tgt_.data(), grad_scale, true);
            break;
        }
        case Op::send_fwd:
            pending_[a.chunk][slot].push_back(
                comm.isend(chunk.output(slot), n, schedule_peer(pp, v, stage, a).stage, kTagFwd));
            break;
        case Op::backward:
            // The chunk's last backward of the step finalises its gradients: with overlap, the
            // DP reduction of each bucket starts as soon as the bucket is complete.
            chunk.backward(slot, params_, grads_,
                           overlap_ && --backwards_left_[a.chunk] == 0 ? &overlap_hook_ : nullptr);
            free_slots_[a.chunk].push_back(slot);  // reused only after its sends complete
            --in_flight_[a.chunk];
            break;
        case Op::send_bwd:
            pending_[a.chunk][slot].push_back(
                comm.isend(chunk.grad_input(slot), n, schedule_peer(pp, v, stage, a).stage, kTagBwd));
            break;
        }
    }
    for (auto& per_chunk : pending_)
        for (auto& handles : per_chunk) {
            for (int h : handles) comm.wait(h);
            handles.clear();
        }
}

void Trainer::OverlapHook::ready(float* g, size_t n) {
    // [g, g+n) may span several specs (fused q|k|v, gate|up), each with its own sync rule; the
    // table's specs lie in arena order, back to back.
    const size_t lo = size_t(g - t->grads_), hi = lo + n;
    for (size_t i = t->spec_at_offset_.at(lo); i < t->table_.specs.size(); ++i) {
        const ParamSpec& s = t->table_.specs[i];
        if (s.offset >= hi) break;
        float* gs = t->grads_ + s.offset;
        switch (s.sync) {
        case GradSync::none: break;
        case GradSync::tp: t->tp_.all_reduce_sum(gs, s.numel()); break;  // tp ranks are here too
        case GradSync::kv_group: t->comms_.kv_group->all_reduce_sum(gs, s.numel()); break;
        case GradSync::tied: continue;  // completed after the schedule; its bucket waits
        }
        t->synced_[i] = 1;
        t->dp_->ready(s.offset, s.offset + s.numel());
    }
}

// Gradients of tensors replicated beyond dp are completed before the dp reduction (those the
// overlap hook has not completed already).
void Trainer::sync_replicated_grads() {
    for (size_t i = 0; i < table_.specs.size(); ++i) {
        const ParamSpec& s = table_.specs[i];
        if (synced_[i]) continue;
        float* g = grads_ + s.offset;
        switch (s.sync) {
        case GradSync::none: break;
        case GradSync::tp: tp_.all_reduce_sum(g, s.numel()); break;
        case GradSync::kv_group: comms_.kv_group->all_reduce_sum(g, s.numel()); break;
        case GradSync::tied: comms_.tied->all_reduce_sum(g, s.numel()); break;
        }
    }
}

// Global L2 norm over all parameters, each counted once: only the writer copy of a replicated
// tensor contributes, then the partial sums are added over tp and pp (and dp for ZeRO shards).
double Trainer::grad_norm() {
    const bool zero = dp_->zero();
    const float* g = zero ? gshard_ : grads_;
    Range own = zero ? dp_->owned() : Range{0, table_.total};
    double ss = 0.0;
    for (const auto& spec : table_.specs) {
        if (!spec.writer) continue;
        size_t a = std::max(own.lo, spec.offset), b = std::min(own.hi, spec.offset + spec.numel());
        if (a < b) ss += be_.sumsq(g + (a - opt_base_), b - a);
    }
    double parts[1] = {ss};
    grid_.tp().all_reduce_sum(parts, 1);
    grid_.pp().all_reduce_sum(parts, 1);
    if (zero) grid_.dp().all_reduce_sum(parts, 1);
    return std::sqrt(parts[0]);
}

// Fault injection for the failure tests (docs/parallelism.md): QUINTET_INJECT_FAULT =
// "rank=R,step=S[,mode=fail|hang]" makes world rank R throw (fail) or stop responding (hang)
// at the start of step S, to prove that the job then ends with a message instead of hanging.
static void maybe_inject_fault(int rank, int64_t step) {
    const char* spec = std::getenv("QUINTET_INJECT_FAULT");
    if (!spec) return;
    int r = -1;
    long long s = -1;
    char mode[16] = "fail";
    if (std::sscanf(spec, "rank=%d,step=%lld,mode=%15s", &r, &s, mode) < 2) return;
    if (r != rank || s != step) return;
    if (std::string(mode) == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    rank_fail("injected fault (QUINTET_INJECT_FAULT) at step " + std::to_string(step));
}

StepStats Trainer::step(int64_t s) {
    maybe_inject_fault(grid_.rank(), s);
    StepStats st;
    const auto& p = deck_.parallel;
    const int mbs = deck_.data.micro_batch_size, T = deck_.data.seq_len;
    const int64_t gb = int64_t(grid_.dp().size()) * p.microbatches * mbs;
    tp_.reset_stats();
    double t0 = now_s();
    be_.zero(grads_, dp_->padded());
    std::fill(synced_.begin(), synced_.end(), 0);
    if (overlap_) dp_->begin_overlap(grads_);
    double loss_sum = 0.0;
    run_schedule(s, st, loss_sum);
    double t1 = now_s();
    sync_replicated_grads();
    double t2 = now_s();
    if (overlap_) {
        st.dp_early = double(dp_->buckets_started_early());
        dp_->finish_overlap();
    } else {
        dp_->reduce_grads(grads_, gshard_);
    }
    grid_.pp().all_reduce_sum(&loss_sum, 1);  // only the last stage has the loss
    loss_sum = dp_->sum(loss_sum);
    double t3 = now_s();
    double norm = grad_norm();
    const auto& t = deck_.train;
    float* g = dp_->zero() ? gshard_ : grads_;
    if (t.grad_clip > 0 && norm > t.grad_clip) be_.scale(g, opt_size_, float(t.grad_clip / (norm + 1e-6)));
    double lr = lr_at(t, s);
    const double bc1 = 1.0 - std::pow(t.beta1, double(s + 1));
    const double bc2 = 1.0 - std::pow(t.beta2, double(s + 1));
    Range own = dp_->zero() ? dp_->owned() : Range{0, table_.total};
    for (const auto& spec : table_.specs) {
        size_t a = std::max(own.lo, spec.offset), b = std::min(own.hi, spec.offset + spec.numel());
        if (a >= b) continue;
        size_t o = a - opt_base_;
        be_.adamw(params_ + a, g + o, m_ + o, v_ + o, b - a, float(lr), float(t.beta1), float(t.beta2),
                  float(t.eps), spec.decay() ? float(t.weight_decay) : 0.0f, float(bc1), float(bc2));
    }
    if (dp_->zero()) dp_->gather_params(params_);
    refresh_bf16_weights();
    double t4 = now_s();
    st.loss = loss_sum / (double(gb) * T);
    st.lr = lr;
    st.grad_norm = norm;
    st.t_pipeline = t1 - t0;
    st.t_sync = t2 - t1;
    st.t_dp = t3 - t2;
    st.t_optim = t4 - t3;
    st.step_time = t4 - t0;
    st.t_tp = tp_.seconds;
    st.tp_bytes = tp_.bytes;
    return st;
}

// Forward only, through the pipeline virtual stage by virtual stage; batch i runs on replica i % dp.
double Trainer::evaluate() {
    const int mbs = deck_.data.micro_batch_size, T = deck_.data.seq_len;
    const int dp = grid_.dp().size(), r = grid_.coord(kDP);
    const int pp = grid_.pp().size(), stage = grid_.coord(kPP), v = deck_.parallel.virtual_stages;
    double sum = 0.0;
    for (int i = r; i < deck_.eval.batches; i += dp) {
        for (int j = 0; j < mbs; ++j)
            sampler_.val_sample(i, j, mbs, ids_.data() + size_t(j) * T, tgt_.data() + size_t(j) * T);
        for (int vs = 0; vs < pp * v; ++vs) {
            if (vs % pp != stage) continue;
            const int c = vs / pp;
            ModelChunk& chunk = *chunks_[c];
            if (chunk.slots() == 0) chunk.add_slot();
            if (vs > 0)
                comms_.pp->recv(chunk.input(0), chunk.boundary_floats(), (stage - 1 + pp) % pp, kTagFwd,
                                p2p_timeout_s_, "evaluation: recv_fwd");
            sum += chunk.forward(0, params_, ids_.data(), tgt_.data(), 1.0f, false);
            if (vs < pp * v - 1)
                comms_.pp->send(chunk.output(0), chunk.boundary_floats(), (stage + 1) % pp, kTagFwd);
        }
    }
    grid_.pp().all_reduce_sum(&sum, 1);
    sum = dp_->sum(sum);
    return sum / (double(deck_.eval.batches) * mbs * T);
}

void Trainer::save_checkpoint(int64_t step) {
    CheckpointMeta meta;
    meta.step = step;
    meta.tokens_seen = tokens_seen_;
    meta.deck = deck_text_;
    meta.layout = grid_.layout().describe() + " zero=" + std::to_string(deck_.parallel.zero);
    // On the CPU backend the arenas are host memory; a device backend stages them through host.
    const float *p = params_, *m = m_, *v = v_;
    std::vector<float> hp, hm, hv;
    if (!host_arena_) {
        hp.resize(table_.total);
        hm.resize(opt_size_);
        hv.resize(opt_size_);
        be_.to_host(hp.data(), params_, table_.total);
        be_.to_host(hm.data(), m_, opt_size_);
        be_.to_host(hv.data(), v_, opt_size_);
        p = hp.data(), m = hm.data(), v = hv.data();
    }
    std::string path = checkpoint_save(grid_.world().handle(), deck_.output.run_dir, meta, table_,
                                       p, m, v, opt_base_, dp_->owned(), deck_.checkpoint.keep);
    log("checkpoint " + path);
}

void Trainer::resume_if_asked() {
    const std::string& mode = deck_.checkpoint.resume;
    std::string path;
    if (mode == "none") {
        if (!checkpoint_latest(deck_.output.run_dir).empty())
            config_fail("checkpoint.resume", "none",
                        "output.run_dir '" + deck_.output.run_dir +
                            "' already holds checkpoints that a fresh run would overwrite; use "
                            "checkpoint.resume=auto to continue, or another output.run_dir");
        return;
    }
    path = mode == "auto" ? checkpoint_latest(deck_.output.run_dir) : mode;
    if (path.empty()) return;
    CheckpointMeta meta = checkpoint_inspect(path, table_);
    Range own = dp_->zero() ? dp_->owned() : Range{0, table_.total};
    if (host_arena_) {
        checkpoint_load(path, table_, params_, m_, v_, own);
    } else {
        std::vector<float> hp(table_.total), hm(opt_size_), hv(opt_size_);
        checkpoint_load(path, table_, hp.data(), hm.data(), hv.data(), own);
        be_.from_host(params_, hp.data(), table_.total);
        be_.from_host(m_, hm.data(), own.size());
        be_.from_host(v_, hv.data(), own.size());
    }
    refresh_bf16_weights();
    start_step_ = meta.step;
    tokens_seen_ = meta.tokens_seen;
    log("resumed from " + path + " at step " + std::to_string(meta.step) + " (written with " +
        meta.layout + ")");
}

size_t Trainer::activation_bytes() const {
    size_t b = 0;
    for (size_t c = 0; c < chunks_.size(); ++c) b += size_t(peak_in_flight_[c]) * chunks_[c]->slot_bytes();
    return b;
}

int Trainer::run() {
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
                      "tokens | %s | peak %.1f GFLOP/s",
                      [&] { size_t n = 0; for (auto& l : table_.logical) n += l.numel(); return n; }() / 1e6,
                      table_.matmul_params / 1e6, dims_.V, dims_.L, dims_.C, dims_.NH, dims_.NKV,
                      dims_.F, grid_.layout().describe().c_str(), tp_.sp() ? " +sp" : "",
                      deck_.parallel.schedule.c_str(), (long long)gb, deck_.data.seq_len,
                      deck_.train.precision.c_str(), peak_flops_ / 1e9);
        log(buf);
    }
    std::unique_ptr<MetricsFile> metrics;
    if (grid_.rank() == 0) metrics = std::make_unique<MetricsFile>(deck_.output.run_dir, deck_text_, start_step_);
    if (t.steps == 0 || start_step_ >= t.steps) {
        if (start_step_ == 0) save_checkpoint(0);
        return 0;
    }
    const double t_start = now_s();
    int64_t s = start_step_;
    std::vector<double> idle(pp), act_mib(pp);
    while (s < t.steps) {
        StepStats st = step(s);
        ++s;
        tokens_seen_ += tokens_per_step;
        // Every stage's bubble (time blocked in pipeline receives / time of the schedule) and
        // activation memory, gathered for rank 0.
        std::fill(idle.begin(), idle.end(), 0.0);
        std::fill(act_mib.begin(), act_mib.end(), 0.0);
        idle[stage] = st.t_pipeline > 0 ? st.t_wait / st.t_pipeline : 0.0;
        act_mib[stage] = activation_bytes() / 1048576.0;
        if (pp > 1) {
            grid_.pp().all_reduce_sum(idle.data(), idle.size());
            grid_.pp().all_reduce_sum(act_mib.data(), act_mib.size());
        }
        double tps = tokens_per_step / st.step_time;
        double mfu = tps * flops_per_token_ / peak_flops_;
        if (metrics) {
            metrics->append("/train", {{"step", double(s)}, {"loss", st.loss}, {"ce_loss", st.loss},
                                       {"aux_loss", 0.0}, {"lr", st.lr}, {"grad_norm", st.grad_norm},
                                       {"tokens_per_s", tps}, {"mfu", mfu}, {"step_time_s", st.step_time}});
            metrics->append("/timing", {{"pipeline", st.t_pipeline}, {"pipeline_wait", st.t_wait},
                                        {"replica_sync", st.t_sync}, {"dp_reduce", st.t_dp},
                                        {"optimizer", st.t_optim}, {"tp_comm", st.t_tp},
                                        {"tp_bytes", st.tp_bytes}, {"dp_buckets_overlapped", st.dp_early}});
            std::vector<std::pair<std::string, double>> row;
            for (int i = 0; i < pp; ++i) {
                row.emplace_back("stage" + std::to_string(i) + "_idle_fraction", idle[i]);
                row.emplace_back("stage" + std::to_string(i) + "_activation_mib", act_mib[i]);
            }
            metrics->append("/pipeline", row);
        }
        if (s % deck_.output.log_every == 0 || s == t.steps) {
            double el = now_s() - t_start;
            double eta = el / double(s - start_step_) * double(t.steps - s);
            char buf[256];
            std::snprintf(buf, sizeof buf,
                          "step %6lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %s tok/s | MFU %.1f%% | "
                          "%s elapsed | ETA %s",
                          (long long)s, (long long)t.steps, st.loss, st.lr, st.grad_norm,
                          human_rate(tps).c_str(), 100.0 * mfu, human_time(el).c_str(),
                          human_time(eta).c_str());
            log(buf);
        }
        if (deck_.eval.every > 0 && (s % deck_.eval.every == 0 || s == t.steps)) {
            double vl = evaluate();
            if (metrics) metrics->append("/eval", {{"step", double(s)}, {"loss", vl}});
            char buf[96];
            std::snprintf(buf, sizeof buf, "eval step %lld | val loss %.4f", (long long)s, vl);
            log(buf);
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
        if (periodic || s == t.steps || stop > 0 || exit_now) save_checkpoint(s);
        if ((stop > 0 || exit_now) && s < t.steps) {
            log(std::string(stop > 0 ? "stop signal received" : "train.exit_after reached") +
                ": checkpointed step " + std::to_string(s) + "; resume with checkpoint.resume=auto");
            break;
        }
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
    return 0;
}

}  // namespace quintet
