// The datasets of run_dir/metrics.h5 (docs/formats.md), named once: the trainer's telemetry
// writes them; the metrics file itself (trimming a resumed history), `quintet study` and the
// tests read them. A new metric is a name here and a value in train/telemetry.cpp.
#pragma once
#include <array>
#include <string>

namespace quintet::metrics_schema {

// Groups. Each has one row per training step, aligned with /train/step, except /eval (one row
// per evaluation, its own /eval/step).
inline constexpr const char* kTrain = "/train";
inline constexpr const char* kEval = "/eval";
inline constexpr const char* kTiming = "/timing";      // seconds (and bytes) per step, this rank 0
inline constexpr const char* kTimingOp = "/timing/op";  // train.profile: exclusive seconds per operation
inline constexpr const char* kPipeline = "/pipeline";   // stage<s>_{idle_fraction, activation_mib}
inline constexpr const char* kMoe = "/moe";
inline constexpr const char* kMemory = "/memory";       // <category>_bytes [step, rank]
inline constexpr const char* kData = "/data";           // source_samples [step, source]
inline constexpr const char* kRanks = "/ranks";         // step_time_s, compute_s, comm_wait_s [step, rank]
inline constexpr const char* kCheckpoint = "/checkpoint";  // one row per checkpoint written, its own step column
inline constexpr const char* kProbe = "/probe";         // train.probe_rms: <kind> (model/probe.hpp)
inline constexpr std::array<const char*, 11> kStepGroups = {kTrain, kEval, kTiming, kTimingOp, kPipeline, kMoe,
                                                            kMemory, kData, kRanks, kProbe, kCheckpoint};

// /data/source_samples [step, source]: samples drawn so far from each training source; its
// attribute `sources` names them, comma-separated. /eval/<source>/loss: each validation source's
// loss, one row per evaluation (aligned with /eval/step).
inline constexpr const char* kSourceSamples = "/data/source_samples";
inline constexpr const char* kSourcesAttr = "sources";

// One row per start of the run (a fresh start, then each resume): the step it started from and
// its layout -- what `quintet plot` marks on the x axis. Not step-aligned: never trimmed.
inline constexpr const char* kRuns = "/runs";
inline constexpr const char* kRunStartStep = "start_step";

// /train and /eval columns.
inline constexpr const char* kStep = "step";
inline constexpr const char* kLoss = "loss";
inline constexpr const char* kCeLoss = "ce_loss";
inline constexpr const char* kAuxLoss = "aux_loss";
// model.mtp_depth > 0: the MTP modules' cross-entropy, the mean over modules (docs/math.md §11).
inline constexpr const char* kMtpLoss = "mtp_loss";
inline constexpr const char* kLr = "lr";
inline constexpr const char* kGradNorm = "grad_norm";
inline constexpr const char* kTokensPerS = "tokens_per_s";
inline constexpr const char* kMfu = "mfu";
inline constexpr const char* kMfuMatmul = "mfu_matmul";  // the share of the measured sgemm rate
inline constexpr const char* kStepTime = "step_time_s";
inline constexpr const char* kSkipped = "skipped";       // 1: the update was skipped (non-finite, or a spike)
// train.on_spike (train/spikes): 1 when the step's first run had a loss or gradient norm above its
// limit; the limits in force (mean + spike_sigma x std of the window; NaN while it warms up).
inline constexpr const char* kSpike = "spike";
inline constexpr const char* kSpikeLossLimit = "spike_loss_limit";
inline constexpr const char* kSpikeGradNormLimit = "spike_grad_norm_limit";

// /checkpoint columns, one row per checkpoint: its step, the seconds the training thread spent on
// it (the step it was taken at was slower by about that much, counting the staging copy and, for a
// background save, waiting for it and completing it), and the seconds its bytes took to write.
inline constexpr const char* kBlocked = "blocked_s";
inline constexpr const char* kStaging = "staging_s";  // of blocked_s, the copy into host memory
inline constexpr const char* kWriteTime = "write_s";

// /timing columns.
inline constexpr const char* kTimePipeline = "pipeline", *kTimePipelineWait = "pipeline_wait",
                             *kTimeReplicaSync = "replica_sync", *kTimeDpReduce = "dp_reduce",
                             *kTimeOptimizer = "optimizer", *kTpComm = "tp_comm", *kTpBytes = "tp_bytes",
                             *kDpBucketsOverlapped = "dp_buckets_overlapped", *kCpComm = "cp_comm",
                             *kCpExposed = "cp_exposed", *kCpBytes = "cp_bytes", *kEpDispatch = "ep_dispatch",
                             *kEpCombine = "ep_combine", *kEpBytes = "ep_bytes", *kEpBytesAll = "ep_bytes_all",
                             *kEpBytesTheory = "ep_bytes_theory", *kTimeDataWait = "data_wait";

// /moe datasets: [step, layer, expert] and [step, layer, 1] ([step, layer, ep] for ep_tokens).
inline constexpr const char* kExpertLoad = "/moe/expert_load", *kImbalance = "/moe/imbalance",
                             *kDeadExperts = "/moe/dead_experts", *kDroppedTokens = "/moe/dropped_tokens",
                             *kMoeAux = "/moe/aux", *kEpTokens = "/moe/ep_tokens";

// /memory/<category>_bytes [step, rank], in this order (the trainer's accounting per rank).
inline constexpr std::array<const char*, 7> kMemoryCategories = {"params", "grads", "optimizer", "activations",
                                                                 "buffers", "runtime", "peak_rss"};
inline std::string memory_path(const char* category) { return std::string(kMemory) + "/" + category + "_bytes"; }

// /ranks/* [step, rank]: every rank's step time, and of it the seconds it computed (the step less
// its waits) and the seconds it was blocked in communication (docs/observability.md).
inline constexpr const char *kRankStepTime = "/ranks/step_time_s", *kRankCompute = "/ranks/compute_s",
                            *kRankCommWait = "/ranks/comm_wait_s";

// The full path of a column of a group: path(kTrain, kLoss) = "/train/loss".
inline std::string path(const char* group, const char* column) { return std::string(group) + "/" + column; }

}  // namespace quintet::metrics_schema
