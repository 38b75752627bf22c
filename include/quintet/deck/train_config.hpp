// Run configuration: one struct per deck section, field name = key.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "quintet/data/data_config.hpp"
#include "quintet/model/config.hpp"
#include "quintet/model/param_groups.hpp"

namespace quintet {

struct ParallelConfig {
    int tp = 1, pp = 1, cp = 1, ep = 1;
    int dp = 0;                  // 0 = world / (tp*pp*cp)
    int microbatches = 1;        // per DP replica per step
    int zero = 0;                // 0 | 1 (optimizer state sharded over dp)
    bool sequence_parallel = false;
    std::string schedule = "1f1b";
    int virtual_stages = 1;
    std::vector<int> pp_layers;  // layers per pipeline stage; empty = the even split
    double bucket_mb = 25.0;     // DP gradient bucket size in MiB
    bool overlap_dp = true;      // bucket all-reduces overlap the backward (all-reduce mode)
    std::string cp_mla_kv = "ring";  // MLA under cp: ring of per-head K/V | latent all-gather
};

struct TrainConfig {
    int steps = 100;
    int global_batch = 0;           // samples per step; 0 = dp x microbatches x micro_batch_size
    double lr = 3e-4, lr_min = 3e-5;
    int warmup = 10;
    double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
    std::string optimizer = "adamw";  // adamw | muon (the hidden and expert matrices; the rest AdamW)
    double muon_momentum = 0.95;      // Muon's Nesterov momentum, in [0, 1)
    int muon_ns_steps = 5;            // Newton-Schulz iterations
    double muon_scale = 0.2;          // the update's RMS factor: scale * sqrt(max(rows, cols))
    int64_t seed = 1234;
    std::string device = "cpu";     // cpu | cuda
    std::string precision = "fp32"; // fp32 | bf16
    double peak_tflops = 0.0;       // 0 = backend default (CPU: measured sgemm-bound peak)
    int threads = 0;                // OpenMP/BLAS threads per rank; 0 = OMP_NUM_THREADS or cores/ranks
    int exit_after = 0;             // stop (with a checkpoint) after this many steps of this run; 0 = never
    double collective_timeout_s = 600;  // deadline of every communicator wait; 0 = none
    std::string recompute = "none";     // none | selective | full
    std::string on_nonfinite = "stop";  // stop | skip: a step whose loss or gradient norm is not finite
    bool profile = false;               // per-operation times: /timing/op/<name> and a table at the end
    int max_skips = 5;                  // skip: consecutive skipped steps before stopping (exit 3)
    std::string on_spike = "none";      // none | skip | rerun: a loss or gradient norm far above its window
    int spike_window = 128;             // accepted steps the spike statistics cover (and the warm-up)
    double spike_sigma = 6;             // a spike is above mean + spike_sigma x std of the window
    // train.trace_steps = A-B: steps A..B (1-based, as logged) on every rank's timeline
    // (run_dir/trace/rank<r>.json); 0-0 = none
    int trace_from = 0, trace_to = 0;
    double straggler_ratio = 1.2;  // a rank computing this many times its peers' median is named
    bool probe_rms = false;             // /probe/<kind>: the RMS of each kind of layer output per step
    double mtp_weight = 0.3;            // lambda: loss = main + lambda/D * sum of the MTP modules' losses
};

struct EvalConfig {
    int every = 0;   // 0 = never
    int batches = 4;
};

struct CheckpointConfig {
    int every = 0;                 // 0 = only at the end (and on SIGTERM/SIGUSR1)
    std::string resume = "auto";   // auto | none | PATH
    std::string init_from = "";    // weights only from this checkpoint, then a fresh run
    int keep = 3;                  // complete checkpoints kept; 0 = all
    bool allow_tokenizer_change = false;  // train on data whose tokenizer is not the checkpoint's
    bool async = false;            // write checkpoints in the background from a staging copy
    bool allow_optimizer_change = false;  // resume with another train.optimizer (its state starts at zero)
};

struct OutputConfig {
    std::string run_dir = "runs/quickstart";
    int log_every = 1;
};

// The whole resolved deck.
struct Deck {
    // The values as the user wrote them, by key (deck file or command line): what error
    // messages echo (deck_value), so that 0.05 reads 0.05. Not part of the resolved deck.
    std::map<std::string, std::string> given;
    ModelConfig model;
    RopeConfig rope;
    ParallelConfig parallel;
    DataConfig data;
    TrainConfig train;
    InitConfig init;
    GroupOverrides groups;  // [groups]: the parameter groups' multipliers (negative = the scheme's)
    EvalConfig eval;
    CheckpointConfig checkpoint;
    OutputConfig output;
};

}  // namespace quintet
