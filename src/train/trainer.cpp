#include "quintet/train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/metrics.hpp"
#include "quintet/train/schedule_math.hpp"

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

}  // namespace

void install_stop_signals() {
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR1, on_stop_signal);
}

Trainer::Trainer(const Deck& deck, const std::string& deck_text, const ProcessGrid& grid,
                 Backend& be, const std::vector<uint32_t>& tokens)
    : deck_(deck), deck_text_(deck_text), grid_(grid), be_(be), table_(make_param_table(deck.model)),
      dims_(model_dims(deck.model)),
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
    dp_ = std::make_unique<DataParallel>(grid.dp(), table_.total, deck.parallel.bucket_mb,
                                         deck.parallel.zero == 1);
    const size_t padded = dp_->padded();
    params_ = be_.alloc(padded);
    grads_ = be_.alloc(padded);
    Range own = dp_->owned();
    opt_size_ = dp_->zero() ? dp_->shard_size() : table_.total;
    opt_base_ = dp_->zero() ? own.lo : 0;
    m_ = be_.alloc(opt_size_);
    v_ = be_.alloc(opt_size_);
    if (dp_->zero()) gshard_ = be_.alloc(dp_->shard_size());
    model_ = std::make_unique<Transformer>(be_, deck.model, deck.rope, table_, dc.micro_batch_size,
                                           dc.seq_len);
    ids_.resize(size_t(dc.micro_batch_size) * dc.seq_len);
    tgt_.resize(ids_.size());
    // Layout-invariant init: each element is a function of (seed, name, index) only.
    std::vector<float> host(table_.total);
    init_params(host.data(), table_, deck.model, deck.init, uint64_t(deck.train.seed), 0, table_.total);
    be_.from_host(params_, host.data(), table_.total);
    flops_per_token_ = model_flops_per_token(table_, dims_, dc.seq_len);
    if (deck.train.peak_tflops > 0) {
        peak_flops_ = deck.train.peak_tflops * 1e12 * grid.world().size();
    } else {
        // Measured sgemm rate of every rank at once (so shared cores are not counted twice).
        double g = cpu_measure_sgemm_gflops(be_, 512, 3);
        grid.world().all_reduce_sum(&g, 1);
        peak_flops_ = g * 1e9;
    }
}

Trainer::~Trainer() {
    for (float* p : {params_, grads_, m_, v_, gshard_})
        if (p) be_.release(p);
}

void Trainer::log(const std::string& line) const {
    if (grid_.rank() == 0) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
    }
}

StepStats Trainer::step(int64_t s) {
    StepStats st;
    const auto& p = deck_.parallel;
    const int mbs = deck_.data.micro_batch_size, T = deck_.data.seq_len;
    const int dp = grid_.dp().size(), r = grid_.coord(kDP);
    const int64_t gb = int64_t(dp) * p.microbatches * mbs;
    const float grad_scale = float(1.0 / (double(gb) * T));
    double t0 = now_s();
    be_.zero(grads_, dp_->padded());
    double loss_sum = 0.0;
    for (int mb = 0; mb < p.microbatches; ++mb) {
        int g = r * p.microbatches + mb;  // microbatch index within the global batch
        for (int j = 0; j < mbs; ++j)
            sampler_.train_sample(s, int64_t(g) * mbs + j, gb, ids_.data() + size_t(j) * T,
                                  tgt_.data() + size_t(j) * T);
        loss_sum += model_->forward_backward(params_, grads_, ids_.data(), tgt_.data(), grad_scale);
    }
    double t1 = now_s();
    dp_->reduce_grads(grads_, gshard_);
    loss_sum = dp_->sum(loss_sum);
    double t2 = now_s();
    // Global L2 norm, each parameter counted once.
    double sumsq = dp_->zero() ? dp_->sum(be_.sumsq(gshard_, dp_->shard_size()))
                               : be_.sumsq(grads_, table_.total);
    double norm = std::sqrt(sumsq);
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
    double t3 = now_s();
    st.loss = loss_sum / (double(gb) * T);
    st.lr = lr;
    st.grad_norm = norm;
    st.t_compute = t1 - t0;
    st.t_dp = t2 - t1;
    st.t_optim = t3 - t2;
    st.step_time = t3 - t0;
    return st;
}

double Trainer::evaluate() {
    const int mbs = deck_.data.micro_batch_size, T = deck_.data.seq_len;
    const int dp = grid_.dp().size(), r = grid_.coord(kDP);
    double sum = 0.0;
    for (int i = r; i < deck_.eval.batches; i += dp) {
        for (int j = 0; j < mbs; ++j)
            sampler_.val_sample(i, j, mbs, ids_.data() + size_t(j) * T, tgt_.data() + size_t(j) * T);
        sum += model_->forward_loss(params_, ids_.data(), tgt_.data());
    }
    sum = dp_->sum(sum);
    return sum / (double(deck_.eval.batches) * mbs * T);
}

void Trainer::save_checkpoint(int64_t step) {
    CheckpointMeta meta;
    meta.step = step;
    meta.tokens_seen = tokens_seen_;
    meta.deck = deck_text_;
    meta.layout = grid_.layout().describe() + " zero=" + std::to_string(deck_.parallel.zero);
    // Host copies are the arenas themselves on the CPU backend.
    std::string path = checkpoint_save(grid_.world().handle(), deck_.output.run_dir, meta, table_,
                                       params_, m_, v_, opt_base_, dp_->owned(), deck_.checkpoint.keep);
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
    checkpoint_load(path, table_, params_, Range{0, table_.total}, m_, v_, own);
    start_step_ = meta.step;
    tokens_seen_ = meta.tokens_seen;
    log("resumed from " + path + " at step " + std::to_string(meta.step) + " (written with " +
        meta.layout + ")");
}

int Trainer::run() {
    const auto& t = deck_.train;
    const int64_t gb = int64_t(grid_.dp().size()) * deck_.parallel.microbatches * deck_.data.micro_batch_size;
    const int64_t tokens_per_step = gb * deck_.data.seq_len;
    resume_if_asked();
    if (grid_.rank() == 0) {
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "model: %.2fM params (%.2fM in matmuls), vocab %d, %d layers, d_model %d, "
                      "heads %d/%d, ffn %d | layout %s | global batch %lld x %d tokens | "
                      "activations %.1f MiB/rank | peak %.1f GFLOP/s",
                      table_.total / 1e6, table_.matmul_params / 1e6, dims_.V, dims_.L, dims_.C,
                      dims_.NH, dims_.NKV, dims_.F, grid_.layout().describe().c_str(), (long long)gb,
                      deck_.data.seq_len, model_->activation_bytes() / 1048576.0, peak_flops_ / 1e9);
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
    while (s < t.steps) {
        StepStats st = step(s);
        ++s;
        tokens_seen_ += tokens_per_step;
        double tps = tokens_per_step / st.step_time;
        double mfu = tps * flops_per_token_ / peak_flops_;
        if (metrics) {
            metrics->append("/train", {{"step", double(s)}, {"loss", st.loss}, {"ce_loss", st.loss},
                                       {"aux_loss", 0.0}, {"lr", st.lr}, {"grad_norm", st.grad_norm},
                                       {"tokens_per_s", tps}, {"mfu", mfu}, {"step_time_s", st.step_time}});
            metrics->append("/timing", {{"forward_backward", st.t_compute}, {"dp_reduce", st.t_dp},
                                        {"optimizer", st.t_optim}});
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
    }
    return 0;
}

}  // namespace quintet
