// The planner for GPU clusters, in-process: hardware descriptions (built-in, files, their
// errors), the links each axis crosses, bf16 mixed-precision memory, train.global_batch, the
// enumeration's restriction to command-line values, and the shapes that used to crash it (a
// DeepSeek-V3-shaped deck at --world 2048: tp x cp x pp overflowed an int and divided by zero).
// ctest: labels=unit
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "quintet/core/error.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/perf/gpu_cost.hpp"
#include "quintet/perf/hardware.hpp"
#include "quintet/perf/planner.hpp"

using namespace quintet;

namespace {

const char* kHardware = R"([device]
bf16_tflops = 989.4
fp32_tflops = 66.9
memory_gib = 80
memory_gbs = 3350
[node]
devices = 8
link_gbs = 450
network_gbs = 50
network_latency_us = 9.6
)";

std::string without(const std::string& text, const std::string& key) {
    const size_t at = text.find(key + " =");
    const size_t end = text.find('\n', at);
    return text.substr(0, at) + text.substr(end + 1);
}

Deck deepseek_v3() {
    // DeepSeek-V3's published shape (arXiv 2412.19437): MLA, 256 routed experts of which 8 per
    // token, one shared, dense FFN on the first 3 layers.
    return deck_load("", {"--model.d_model=7168", "--model.n_layers=61", "--model.n_heads=128", "--model.ffn_dim=18432",
                          "--model.attention=mla", "--model.kv_lora_rank=512", "--model.q_lora_rank=1536",
                          "--model.qk_nope_dim=128", "--model.qk_rope_dim=64", "--model.v_head_dim=128",
                          "--model.vocab_size=129280", "--moe.experts=256", "--moe.top_k=8", "--moe.shared_experts=1",
                          "--moe.ffn_dim=2048", "--moe.layers=3-60", "--data.seq_len=4096", "--data.micro_batch_size=1",
                          "--train.precision=bf16", "--parallel.sequence_parallel=true", "--parallel.zero=1"});
}

PlanTarget gpu(const std::string& name = "h100-sxm") {
    PlanTarget t;
    t.hardware = hardware_load(name);
    return t;
}

}  // namespace

TEST(Hardware, BuiltInsAndFiles) {
    EXPECT_EQ(hardware_names(), (std::vector<std::string>{"host", "a100-sxm-80g", "h100-sxm", "h200"}));
    EXPECT_TRUE(hardware_load("host").host);
    const Hardware a = hardware_load("a100-sxm-80g"), h = hardware_load("h100-sxm"), h2 = hardware_load("h200");
    EXPECT_EQ(a.bf16_tflops, 312);
    EXPECT_EQ(h.bf16_tflops, h2.bf16_tflops);
    EXPECT_GT(h2.memory_gib, 140);
    EXPECT_EQ(a.devices_per_node, 8);
    // A file in the deck's syntax; written back it reads the same.
    const Hardware f = hardware_parse(kHardware, "test.hw");
    EXPECT_EQ(f.network_gbs, 50);
    EXPECT_EQ(f.matmul_fraction, 0.80);  // the default
    const Hardware g = hardware_parse(hardware_to_text(h), "again");
    EXPECT_EQ(g.bf16_tflops, h.bf16_tflops);
    EXPECT_EQ(g.sms, h.sms);
    EXPECT_EQ(g.memory_gib, h.memory_gib);
}

TEST(Hardware, BadInputNamesTheKeyAndWhatIsValid) {
    try {
        hardware_load("b200");
        FAIL();
    } catch (const ConfigError& e) {
        const std::string w = e.what();
        for (const char* n : {"'b200'", "host", "a100-sxm-80g", "h100-sxm", "h200"}) EXPECT_NE(w.find(n), std::string::npos) << w;
    }
    for (const char* key : {"bf16_tflops", "memory_gib", "devices", "network_latency_us"}) {
        try {
            hardware_parse(without(kHardware, key), "f.hw");
            ADD_FAILURE() << key;
        } catch (const ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find(std::string("missing key '")), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        }
    }
    std::string neg = kHardware;
    neg.replace(neg.find("= 3350"), 6, "= -3350");
    EXPECT_THROW(hardware_parse(neg, "f.hw"), ConfigError);
    try {
        hardware_parse(neg, "f.hw");
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("'device.memory_gbs' = '-3350'"), std::string::npos) << e.what();
    }
    std::string zero_dev = kHardware;
    zero_dev.replace(zero_dev.find("devices = 8"), 11, "devices = 0");
    EXPECT_THROW(hardware_parse(zero_dev, "f.hw"), ConfigError);
    EXPECT_THROW(hardware_parse(std::string(kHardware) + "[node]\nnics = 4\n", "f.hw"), ConfigError);  // unknown key
    EXPECT_THROW(hardware_parse("[device\nbf16_tflops = 1\n", "f.hw"), ConfigError);                 // not the syntax
}

TEST(PlanGpu, LinksFollowTheGridOrder) {
    EXPECT_EQ(group_link(1, 1, 8), "none");
    EXPECT_EQ(group_link(1, 8, 8), "nvlink");    // tp 8: one node
    EXPECT_EQ(group_link(1, 16, 8), "network");  // tp 16: two nodes
    EXPECT_EQ(group_link(8, 4, 8), "network");   // dp after tp 8: a node each
    EXPECT_EQ(group_link(2, 4, 8), "nvlink");    // cp 4 after tp 2
    EXPECT_EQ(group_link(1, 3, 8), "network");   // 3 does not divide a node: groups straddle nodes
    Deck d = deck_load("", {"--model.d_model=512", "--model.n_layers=8", "--model.n_heads=8", "--model.vocab_size=1000",
                            "--data.seq_len=1024", "--parallel.tp=8", "--parallel.cp=2", "--parallel.sequence_parallel=true",
                            "--train.precision=bf16"});
    const PlanRow r = plan_layout(d, 64, gpu());
    ASSERT_TRUE(r.valid) << r.reason;
    EXPECT_EQ(r.link[kAxisTp], "nvlink");
    EXPECT_EQ(r.link[kAxisCp], "network");
    EXPECT_EQ(r.link[kAxisDp], "network");
    EXPECT_EQ(r.link[kAxisPp], "none");
}

TEST(PlanGpu, MixedPrecisionMemory) {
    // One rank, bf16: weights 2 bytes, fp32 gradients 4, master weights and two moments 12.
    Deck d = deck_load("", {"--model.d_model=256", "--model.n_layers=4", "--model.n_heads=4", "--model.vocab_size=1000",
                            "--data.seq_len=128", "--data.micro_batch_size=2", "--train.precision=bf16"});
    const PlanRow r = plan_layout(d, 1, gpu());
    ASSERT_TRUE(r.valid) << r.reason;
    const double P = r.params_total;
    EXPECT_EQ(r.memory.params, 2 * P);
    EXPECT_EQ(r.memory.grads, 4 * P);
    EXPECT_EQ(r.memory.optimizer, 12 * P);
    EXPECT_GT(r.memory.activations, 0);
    EXPECT_TRUE(r.fits);
    // ZeRO-1 over 8 replicas shards the optimizer: 12 bytes a parameter over 8.
    d.parallel.zero = 1;
    const PlanRow z = plan_layout(d, 8, gpu());
    ASSERT_TRUE(z.valid) << z.reason;
    EXPECT_NEAR(z.memory.optimizer, 12 * P / 8, 12 * 2);
    EXPECT_EQ(z.memory.grads, r.memory.grads);
    // fp32: 4-byte weights, no separate master copy.
    d.train.precision = "fp32", d.parallel.zero = 0;
    const PlanRow f = plan_layout(d, 1, gpu());
    EXPECT_EQ(f.memory.params, 4 * P);
    EXPECT_EQ(f.memory.optimizer, 8 * P);
    // Full recompute keeps less; a smaller device limit marks it as not fitting.
    d.train.precision = "bf16";
    Deck full = d;
    full.train.recompute = "full";
    EXPECT_LT(plan_layout(full, 1, gpu()).memory.activations, plan_layout(d, 1, gpu()).memory.activations);
    PlanTarget small = gpu();
    small.device_memory_bytes = 1e6;
    EXPECT_FALSE(plan_layout(d, 1, small).fits);
    // The figures a report needs.
    EXPECT_GT(r.tflops_per_device, 0);
    EXPECT_GT(r.mfu, 0);
    EXPECT_LT(r.mfu, 1);
    EXPECT_EQ(r.global_batch, 2);
    EXPECT_NEAR(r.flops_per_step, r.tflops_per_device * 1e12 * r.step_time_s, 1e-6 * r.flops_per_step);
}

TEST(PlanGpu, GlobalBatchSetsMicrobatchesPerLayout) {
    Deck d = deck_load("", {"--model.d_model=256", "--model.n_layers=4", "--model.n_heads=4", "--model.vocab_size=1000",
                            "--data.seq_len=128", "--data.micro_batch_size=2", "--train.precision=bf16",
                            "--train.global_batch=40"});
    const auto rows = plan_all(d, 8, gpu());
    int valid = 0, indivisible = 0;
    for (const auto& r : rows) {
        if (r.valid) {
            ++valid;
            EXPECT_EQ(r.global_batch, 40);
            EXPECT_EQ(r.microbatches * r.dp * 2, 40);
        } else if (r.reason.find("train.global_batch") != std::string::npos) {
            ++indivisible;
        }
    }
    EXPECT_GT(valid, 0);
    EXPECT_GT(indivisible, 0);  // dp = 8: 40 / (8 x 2) is not whole
}

TEST(PlanGpu, CommandLineValuesRestrictTheEnumeration) {
    Deck d = deck_load("", {"--model.d_model=256", "--model.n_layers=4", "--model.n_heads=4", "--model.vocab_size=1000",
                            "--data.seq_len=128", "--train.precision=bf16"});
    PlanOnly only;
    only.tp = 2;
    const auto rows = plan_all(d, 16, gpu(), {}, only);
    ASSERT_FALSE(rows.empty());
    for (const auto& r : rows) EXPECT_EQ(r.tp, 2);
    only.pp = 4;
    for (const auto& r : plan_all(d, 16, gpu(), {}, only)) EXPECT_EQ(r.pp * r.tp, 8);
}

TEST(PlanGpu, DeepSeekV3ShapeAtScaleDoesNotCrash) {
    // --world 2048 used to die with SIGFPE: the product tp x cp x pp of three divisors of 2048
    // overflowed an int to 0 and the planner took the world modulo it.
    const Deck d = deepseek_v3();
    for (int world : {256, 2048, 4096}) {
        const auto rows = plan_all(d, world, gpu());
        size_t valid = 0;
        for (const auto& r : rows) {
            valid += r.valid;
            if (r.valid) {
                EXPECT_TRUE(std::isfinite(r.step_time_s) && r.step_time_s > 0);
                EXPECT_GT(r.memory.total, 0);
            }
        }
        EXPECT_GT(valid, 0) << world;
        const PlanRow& best = rows.front();
        EXPECT_NEAR(best.params_total / 1e9, 671.0, 0.5);  // DeepSeek-V3: 671 B parameters
        EXPECT_NEAR(best.params_active / 1e9, 37, 1.0);    // 37 B active per token
    }
}

TEST(PlanGpu, PipelineLayersTakeRanges) {
    Deck d = deck_load("", {"--parallel.pp_layers=7,8-8,7"});
    EXPECT_EQ(d.parallel.pp_layers, (std::vector<int>{7, 8, 7}));
    EXPECT_EQ(deck_load("", {"--parallel.pp_layers=1,2-5"}).parallel.pp_layers, (std::vector<int>{1, 2, 3, 4, 5}));
    EXPECT_THROW(deck_load("", {"--parallel.pp_layers=0,2-5"}), ConfigError);  // a stage of 0 layers
    EXPECT_THROW(deck_load("", {"--parallel.pp_layers=3-1"}), ConfigError);
    EXPECT_THROW(deck_load("", {"--parallel.pp_layers=0,1"}), ConfigError);
}

TEST(PlanGpu, LayerGemmsAreTheProductsThePlannerCosts) {
    // What quintet_cuda_bench --planner_gemms times on a GPU: for the 1.7 B shape of the
    // Megatron-Core H100 runs (docs/planner.md §8) on tp 1 and the 32 B shape's width on tp 8,
    // every weight of a dense layer and the LM head, three products each.
    const Hardware hw = hardware_load("h100-sxm");
    for (int tp : {1, 8}) {
        ModelConfig m;
        m.d_model = 2048, m.n_heads = 16, m.n_kv_heads = 0, m.n_layers = 2, m.ffn_dim = 0;
        m.vocab_size = 131072, m.tie_embeddings = false;
        const double rows = 4096, F = m.ffn_width(), C = m.d_model;
        const auto gemms = planned_layer_gemms(m, tp, rows, hw, true);
        ASSERT_FALSE(gemms.empty());
        double layer_fwd = 0, layer_dgrad = 0, layer_wgrad = 0, head_fwd = 0;
        for (const PlannedGemm& g : gemms) {
            const double flop = g.count * 2 * g.M * g.N * g.K;
            if (g.head) {
                if (g.pass == "fwd") head_fwd += flop;
                continue;
            }
            (g.pass == "fwd" ? layer_fwd : g.pass == "dgrad" ? layer_dgrad : layer_wgrad) += flop;
            // Each pass keeps the weight's two extents and multiplies the microbatch's rows.
            EXPECT_TRUE(g.pass == "wgrad" ? g.K == rows : g.M == rows) << g.name << " " << g.pass;
            EXPECT_GT(g.planned_s, 0) << g.name;
            EXPECT_DOUBLE_EQ(g.planned_s, g.count * gpu_gemm_seconds(g.M, g.N, g.K, hw, true)) << g.name;
        }
        // One layer's matmul parameters (q, k, v, o: 4 C^2; gate, up, down: 3 C F) on this rank.
        const double per_rank = (4 * C * C + 3 * C * F) / tp;
        EXPECT_NEAR(layer_fwd, 2 * rows * per_rank, 1e-6 * layer_fwd) << tp;
        EXPECT_DOUBLE_EQ(layer_dgrad, layer_fwd);
        EXPECT_DOUBLE_EQ(layer_wgrad, layer_fwd);
        EXPECT_NEAR(head_fwd, 2 * rows * C * m.vocab_size / tp, 1e-6 * head_fwd) << tp;
    }
    // The model's rate for a product never exceeds the best shape's share of the peak.
    const double best = hw.bf16_tflops * 1e12 * hw.matmul_fraction * GpuCalibration{}.gemm_share_of_best;
    const double s = gpu_gemm_seconds(8192, 8192, 8192, hw, true);
    EXPECT_LE(2.0 * 8192 * 8192 * 8192 / s, best * (1 + 1e-12));
}
