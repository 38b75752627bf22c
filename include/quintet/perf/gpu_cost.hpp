// The step time of a layout on GPUs (docs/planner.md §7): each stage's GEMMs at a fraction of the
// device's peak that depends on their shapes, the attention core (FlashAttention-style, causal),
// memory-bound element-wise work, each axis's collectives on the link they cross (NVLink inside a
// node, the network across nodes) with overlap where the framework overlaps them, the pipeline
// bubble of the schedule, and the optimizer's pass once per step. Every constant is in
// src/perf/gpu_cost.cpp with its source.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "quintet/model/buffers.hpp"
#include "quintet/model/config.hpp"
#include "quintet/perf/hardware.hpp"
#include "quintet/perf/inventory.hpp"

namespace quintet {

enum PlanAxis { kAxisTp = 0, kAxisCp, kAxisDp, kAxisEp, kAxisPp, kNumPlanAxes };
const char* plan_axis_name(int axis);  // "tp", "cp", "dp", "ep", "pp"

// What the framework running the layout does where frameworks differ. The defaults are
// quintet's own; `quintet plan --overlap` and `--attention` describe another framework's run,
// to compare with published figures (docs/planner.md §8).
struct FrameworkModel {
    // Whether each axis's collectives are overlapped with compute. quintet: the dp buckets
    // (parallel.overlap_dp, not with zero = 1), the cp ring (behind the attention it feeds) and
    // the ep exchange (behind the shared expert); tp and pp transfers are exposed.
    std::array<bool, kNumPlanAxes> overlap{false, true, true, true, false};
    bool overlap_given = false;      // --overlap: the set above as given, zero = 1 included
    bool unfused_attention = false;  // attention as batched GEMMs and a softmax over s^2 scores
};

// Parses --overlap's list ("tp,dp", "none"); throws ConfigError naming the bad item.
FrameworkModel parse_overlap(const std::string& list, FrameworkModel fw);

// The layout and model, as perf/planner.cpp resolved them.
struct GpuLayout {
    const ModelConfig* model = nullptr;
    const ModelInventory* inv = nullptr;  // (tp, ep)'s shards and GEMMs
    int tp = 1, cp = 1, dp = 1, pp = 1, ep = 1, v = 1, microbatches = 1, zero = 0;
    std::string schedule = "1f1b";
    int B = 1, T = 1;  // micro_batch_size, seq_len
    bool sp = false, bf16 = true, overlap_dp = true;
    Recompute recompute = Recompute::none;
    double bucket_mb = 25;
    // Per stage: its layers of each kind, whether it holds the embedding / the head, and its
    // parameters by region.
    struct Stage {
        int dense_layers = 0, moe_layers = 0;
        bool first = false, last = false;
        RegionFloats params;
    };
    std::vector<Stage> stages;
};

struct GpuStepTime {
    double compute_s = 0;      // the busiest stage's compute per step (all microbatches)
    double bubble = 0, bubble_s = 0;
    double optimizer_s = 0;    // the optimizer's and the gradient norm's passes
    double step_s = 0;
    std::array<double, kNumPlanAxes> comm_bytes{};  // bytes one rank sends per step
    std::array<double, kNumPlanAxes> comm_s{};      // exposed seconds per step
    std::array<std::string, kNumPlanAxes> link{};   // "none", "nvlink" or "network"
    int busiest_stage = 0;
};

// The model's two calibrated constants (docs/planner.md §8 gives the published runs they were
// fitted on; tests/perf/test_gpu_validation.cpp refits them and checks these values).
struct GpuCalibration {
    double gemm_share_of_best = 0.915;  // GEMMs of a training step reach this share of the best shape's rate
    double attention_share = 0.118;     // the fused attention core's share of the dense peak (fwd and bwd)
};

GpuStepTime gpu_step_time(const GpuLayout& l, const Hardware& hw, const FrameworkModel& fw,
                          const GpuCalibration& cal = {});

// One GEMM's modelled time, C[M,N] = A[M,K] B[K,N]: the best shape's rate times the calibrated
// share and the last wave's fill, or the memory roofline when that is slower. The term
// quintet_cuda_bench --planner_gemms measures on a GPU beside its prediction (docs/planner.md §8).
double gpu_gemm_seconds(double M, double N, double K, const Hardware& hw, bool bf16, const GpuCalibration& cal = {});

// The matmuls the planner costs for one dense layer and the LM head of `m` on one rank of `tp`
// (sequence parallel: a layer's GEMMs see the gathered rows), for a microbatch of `rows` tokens:
// each weight's forward (rows x out x in), input gradient (rows x in x out) and weight gradient
// (out x in x rows), `count` weights of that shape, and the planner's time for all of them.
struct PlannedGemm {
    std::string name, pass;  // the weight's name in the parameter table; fwd, dgrad or wgrad
    double M = 0, N = 0, K = 0, count = 1;
    bool head = false;
    double planned_s = 0;
};
std::vector<PlannedGemm> planned_layer_gemms(const ModelConfig& m, int tp, double rows, const Hardware& hw, bool bf16,
                                             const GpuCalibration& cal = {});

// The link an axis group crosses: ranks `stride` apart, `size` of them, in rank order (tp
// fastest, then cp, dp, pp: tp neighbours share a node); "none" for a group of one.
std::string group_link(int stride, int size, int devices_per_node);


}  // namespace quintet
