// The layout planner behind `quintet plan` (docs/planner.md) and the trainer's "predicted" line:
// memory per rank by category, bytes per step on each axis, the pipeline bubble and a predicted
// step time, for any (tp, cp, dp, pp, ep) of a deck -- without running it. Two machines: this
// host as measured (the trainer's own accounting; tests/perf/test_planner.cpp holds params,
// grads, optimizer, activations and buffers to it to the byte), and GPU clusters described by
// perf/hardware (bf16 mixed-precision memory, perf/gpu_memory; the step-time model of
// perf/gpu_cost, validated against published runs in docs/planner.md §8).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/deck/train_config.hpp"
#include "quintet/perf/gpu_cost.hpp"
#include "quintet/perf/hardware.hpp"

namespace quintet {

// Bytes of one rank by category (the metrics' /memory/*, docs/formats.md). total = the predicted (or measured)
// peak resident set; runtime = what the process holds besides the model's own buffers.
struct MemoryBytes {
    double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0, runtime = 0, total = 0;
};

// One figure per axis.
struct AxisFigures {
    double tp = 0, cp = 0, dp = 0, ep = 0, pp = 0;
    double sum() const { return tp + cp + dp + ep + pp; }
};

// What this host does: the rates a CPU prediction is made from.
struct MachineModel {
    double matmul_gflops_per_core = 0;  // one thread's sgemm rate (quintet peak, --matmul-gflops)
    int cores = 1;                      // of one node
    int ranks_per_node = 0;             // 0: all ranks on one node
    int threads_per_rank = 0;           // 0: cores / ranks on the node (at least 1)
    double link_gbs = 10;               // one rank's point-to-point / collective bandwidth, GB/s
    double link_latency_s = 5e-6;       // per message
    double runtime_base_bytes = 0;      // a rank's resident set besides the model (calibrated)
    double data_bytes = 0;              // the sampler's prefetch buffers (data/dataset.hpp)
};

// What a plan is made for: this host (hardware.host, described by `machine`) or a GPU cluster.
struct PlanTarget {
    Hardware hardware;           // hardware_load("host") by default
    MachineModel machine;        // host only
    FrameworkModel framework;    // GPU only: what the framework overlaps, its attention
    GpuCalibration calibration;  // GPU only: the step-time model's fitted constants
    double device_memory_bytes = 0;  // the fit limit; 0 = the device's capacity (GPU), none (host)
    PlanTarget();
};

struct PlanRow {
    int tp = 1, cp = 1, dp = 1, pp = 1, ep = 1, microbatches = 1, zero = 0;
    int micro_batch_size = 1;  // data.micro_batch_size: samples of a microbatch
    std::string recompute = "none";
    bool valid = false;
    std::string reason;        // why not valid
    bool fits = true;          // within the device's memory (GPU) or --device-memory
    int stage = 0;             // the pipeline stage of the largest rank
    MemoryBytes memory;        // of the largest rank
    AxisFigures comm_bytes;    // bytes one rank sends per step on each axis (largest of the axis)
    AxisFigures comm_s;        // the time they take (exposed)
    std::array<std::string, kNumPlanAxes> link{};  // the link each axis crosses: none | nvlink | network | host
    double compute_s = 0, bubble = 0, bubble_s = 0, step_time_s = 0, tokens_per_s = 0;
    double fixed_s = 0;          // per step, whatever the microbatches (the optimizer's pass, ...)
    int64_t global_batch = 0;    // samples per step: dp x microbatches x micro_batch_size
    double params_total = 0, params_active = 0;  // of the whole model; active: what a token multiplies
    double flops_per_step = 0;   // model FLOPs of the global batch (docs/math.md §1: 6·N_active·tokens + attention)
    // The optimizer's own FLOPs per step on its busiest rank (train.optimizer = muon: the
    // Newton-Schulz iterations), apart from the model's: not in flops_per_step nor in MFU.
    double optimizer_flops = 0;
    double tflops_per_device = 0, mfu = 0;  // flops_per_step / (world · step time), and over the device's peak
    // Predicted within the planner's validated error (plan_error) of the first row (the fastest
    // that fits): the order among such rows is not a prediction.
    bool tie = false;
};

// The planner's error, as validated (docs/planner.md): on GPU hardware the largest of the 33
// published runs of §8 (12.4%, so 0.125); on this host the largest of §4's calibration (9%, so 0.10).
double plan_error(const PlanTarget& target);

// The deck with its [parallel] section set for `world` ranks: checks it (deck_validate, without
// this machine's memory check) and predicts. deck.model.vocab_size must be set.
PlanRow plan_layout(const Deck& deck, int world, const MachineModel& machine);  // this host
PlanRow plan_layout(const Deck& deck, int world, const PlanTarget& target);

// Every (tp, cp, dp, pp, ep) of `world` (dp = what the others leave), crossed with the sweep
// lists (empty: the deck's value), sorted by predicted tokens/s, invalid ones last. A non-zero
// `only` value keeps the layouts with that value (a --parallel.KEY=V on the command line).
struct PlanSweep {
    std::vector<int> microbatches, zero, micro_batch_size;
    std::vector<std::string> recompute;
};
struct PlanOnly {
    int tp = 0, cp = 0, dp = 0, pp = 0, ep = 0;
};
std::vector<PlanRow> plan_all(const Deck& deck, int world, const PlanTarget& target, const PlanSweep& sweep = {},
                              const PlanOnly& only = {});
std::vector<PlanRow> plan_all(const Deck& deck, int world, const MachineModel& machine, const PlanSweep& sweep = {},
                              double device_memory_bytes = 0);

// JSON of the rows as docs/planner.md fixes it (a list of objects; null where not valid).
std::string plan_json(const std::vector<PlanRow>& rows);

// A rank's resident set besides the model: the executable and its libraries as loaded (with a
// CUDA build, the CUDA libraries are most of it even on a CPU run), MPI, OpenMP, the BLAS, HDF5.
// The planner's default: this process's own resident set when it starts (the same binary),
// which docs/planner.md compares with the trainer's measured remainder.
double runtime_base_estimate();

}  // namespace quintet
