// Every tensor- and pipeline-parallel layout against the single-rank run of the same deck,
// through the real binary under mpirun: loss curves to fp32 reduction order (relative 1e-5),
// step-0 checkpoints bit-identical, and checkpoints that move between layouts mid-run.
// ctest: labels=mpi timeout=1500 launches_mpirun
#include <gtest/gtest.h>

#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

// 4 layers (pp = 4 gets one each), 4 heads over 2 kv heads (tp = 4 replicates kv heads),
// T = 32 (divisible by tp under sequence parallelism). Global batch 16 samples in every layout.
const char* kDeck = R"([model]
d_model = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
[data]
seq_len = 32
micro_batch_size = 2
order = random
val_fraction = 0.1
[train]
steps = 10
lr = 1e-2
lr_min = 1e-3
warmup = 2
grad_clip = 1.0
seed = 11
peak_tflops = 0.1
[eval]
every = 5
batches = 4
[output]
log_every = 5
)";

struct Layouts : TrainFixture {
    void SetUp() override { prepare("layouts_", kDeck, 3); }
    std::vector<double> losses(const std::string& name, const char* what = "/train/loss") {
        return metrics_column(dir / name, what);
    }
    // Writes the step-0 checkpoint of each layout (ranks, overrides): every one bit for bit the first's.
    void step_zero_identical(const std::vector<std::pair<int, std::string>>& layouts) {
        std::vector<std::vector<std::pair<std::string, std::vector<float>>>> all;
        int k = 0;
        for (const auto& [ranks, args] : layouts) {
            std::string name = "s0_" + std::to_string(k++);
            auto r = train(ranks, name, "--train.steps=0 " + args);
            ASSERT_EQ(r.status, 0) << r.output;
            all.push_back(checkpoint_tensors((dir / name / "checkpoints/step_00000000.h5").string()));
        }
        for (size_t j = 1; j < all.size(); ++j) {
            ASSERT_EQ(all[j].size(), all[0].size());
            for (size_t i = 0; i < all[0].size(); ++i)
                EXPECT_EQ(0, std::memcmp(all[j][i].second.data(), all[0][i].second.data(), all[0][i].second.size() * 4))
                    << all[0][i].first << " differs in " << layouts[j].second;
        }
    }
    // Runs `layouts` (ranks, overrides) and compares each with the single-rank `ref` run.
    void compare(const std::string& model, const std::vector<std::pair<int, std::string>>& layouts,
                 double tol = 1e-5) {
        compare_layouts(model, layouts, tol, 0.5);
    }
};

TEST_F(Layouts, TensorParallelMatchesSingleRank) {
    compare("", {
        {2, "--parallel.tp=2 --parallel.microbatches=8"},
        {4, "--parallel.tp=4 --parallel.microbatches=8"},  // tp > n_kv_heads: kv heads replicated
        {2, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
        {4, "--parallel.tp=4 --parallel.sequence_parallel=true --parallel.microbatches=8"},
        {4, "--parallel.tp=2 --parallel.microbatches=4 --parallel.sequence_parallel=true"},  // dp=2
        {4, "--parallel.tp=2 --parallel.microbatches=4 --parallel.zero=1"},                   // dp=2, ZeRO-1
    });
}

TEST_F(Layouts, TensorParallelMhaAndTiedHead) {
    compare("--model.n_kv_heads=4 --model.tie_embeddings=true", {
        {2, "--parallel.tp=2 --parallel.microbatches=8"},
        {4, "--parallel.tp=4 --parallel.sequence_parallel=true --parallel.microbatches=8"},
    });
}

// µP (init.scheme = mup, width multiplier 2 against a base of 16, tied head): its per-group
// learning rates, the logits' 1/m and an attention-scale multiplier are the same on every layout.
// At multiplier 1 it is the scaled scheme, bit for bit.
TEST_F(Layouts, MupMatchesSingleRankAndIsScaledAtMultiplierOne) {
    const std::string mup = "--init.scheme=mup --init.base_width=16 --init.base_head_dim=4 --model.tie_embeddings=true";
    compare(mup, {
        {2, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
        {2, "--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zb_h1"},
        {4, "--parallel.tp=2 --parallel.microbatches=4 --parallel.zero=3"},  // dp=2
    });
    ASSERT_EQ(train(1, "mup_one", "--init.scheme=mup --parallel.microbatches=8").status, 0);
    ASSERT_EQ(train(1, "scaled_one", "--init.scheme=scaled --parallel.microbatches=8").status, 0);
    EXPECT_EQ(losses("mup_one"), losses("scaled_one")) << "init.scheme = mup at width multiplier 1 is not scaled";
    EXPECT_NE(losses("mup_one"), losses("ref")) << "the multiplier-1 run should differ from the mup run above";
}

TEST_F(Layouts, PipelineParallelMatchesSingleRank) {
    compare("", {
        {2, "--parallel.pp=2 --parallel.microbatches=8"},
        {4, "--parallel.pp=4 --parallel.microbatches=8"},
        {2, "--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=gpipe"},
        {2, "--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=interleaved --parallel.virtual_stages=2"},
        {4, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=8 --parallel.sequence_parallel=true"},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=1"},  // dp=2
        {2, "--parallel.pp=2 --parallel.microbatches=8 --parallel.pp_layers=1,3"},
    });
}

// The zero-bubble schedules (backwards split into B and W, the W's filling the bubble): zb_h1 on
// pp2 and pp4, zbv (two chunks per stage in a V) on pp2 and -- with 8 layers -- pp4 (also with
// fewer microbatches than the V's 2pp-1), under tp+SP, full and selective recomputation, dp with
// the overlapped reduction (buckets of 1024 floats, so most start during the last W's) and tied
// embeddings (zbv holds both ends on stage 0).
TEST_F(Layouts, ZeroBubbleSchedulesMatchSingleRank) {
    const std::string zb = " --parallel.schedule=zb_h1", zv = " --parallel.schedule=zbv --parallel.virtual_stages=2";
    compare("", {
        {2, "--parallel.pp=2 --parallel.microbatches=8" + zb},
        {4, "--parallel.pp=4 --parallel.microbatches=8" + zb},
        {2, "--parallel.pp=2 --parallel.microbatches=8" + zv},
        {4, "--parallel.pp=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8" + zb},
        {4, "--parallel.pp=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8" + zv},
        {2, "--parallel.pp=2 --parallel.microbatches=8 --train.recompute=full" + zb},
        {2, "--parallel.pp=2 --parallel.microbatches=8 --train.recompute=full" + zv},
        {2, "--parallel.pp=2 --parallel.microbatches=8 --train.recompute=selective" + zv},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.bucket_mb=0.001" + zb},  // dp2
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.bucket_mb=0.001" + zv},
    });
}

TEST_F(Layouts, ZeroBubbleSchedulesOnFourStages) {
    const std::string zb = " --parallel.schedule=zb_h1", zv = " --parallel.schedule=zbv --parallel.virtual_stages=2";
    compare("--model.n_layers=8", {
        {4, "--parallel.pp=4 --parallel.microbatches=8" + zv},
        {4, "--parallel.pp=4 --parallel.microbatches=8" + zb},
        {8, "--parallel.pp=4 --parallel.microbatches=4" + zv},  // dp2; fewer microbatches than the V's 2pp-1
    });
}

TEST_F(Layouts, ZeroBubbleSchedulesWithTiedEmbeddings) {
    const std::string zb = " --parallel.schedule=zb_h1", zv = " --parallel.schedule=zbv --parallel.virtual_stages=2";
    compare("--model.tie_embeddings=true", {
        {2, "--parallel.pp=2 --parallel.microbatches=8" + zb},
        {2, "--parallel.pp=2 --parallel.microbatches=8" + zv},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.bucket_mb=0.001" + zv},
    });
}

// ZeRO-2 (gradients reduce-scattered unit by unit during the backward, each rank keeping its
// slice) and ZeRO-3 (the parameters too, each unit gathered before its forward and backward):
// dp2, dp4, dp x tp+SP, dp x pp under 1F1B, interleaved, zb_h1 (with full recomputation) and zbv,
// and tied embeddings on one stage and across two.
TEST_F(Layouts, ZeroTwoAndThreeMatchSingleRank) {
    std::vector<std::pair<int, std::string>> layouts;
    for (const std::string z : {" --parallel.zero=2", " --parallel.zero=3"}) {
        layouts.push_back({2, "--parallel.microbatches=4" + z});
        layouts.push_back({4, "--parallel.microbatches=2" + z});
        layouts.push_back({4, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=4" + z});
        layouts.push_back({4, "--parallel.pp=2 --parallel.microbatches=4" + z});
        layouts.push_back({4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=interleaved "
                              "--parallel.virtual_stages=2" + z});
        layouts.push_back({4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=zb_h1 "
                              "--train.recompute=full" + z});
        layouts.push_back({4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=zbv "
                              "--parallel.virtual_stages=2" + z});
        layouts.push_back({8, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=4 --train.recompute=selective" + z});
    }
    compare("", layouts);
}

TEST_F(Layouts, ZeroTwoAndThreeWithTiedEmbeddings) {
    compare("--model.tie_embeddings=true", {
        {2, "--parallel.microbatches=4 --parallel.zero=2"},
        {2, "--parallel.microbatches=4 --parallel.zero=3"},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=3"},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=2 --parallel.schedule=zb_h1"},
    });
}

// Every ZeRO level writes the same step-0 checkpoint bit for bit (a parameter element is a
// function of (seed, name, index) whoever holds it), and a checkpoint moves between levels and
// layouts mid-run: the curve continues as if nothing had happened (optimizer state included).
TEST_F(Layouts, ZeroLevelsShareCheckpointsAndResumeAcrossLevels) {
    const std::vector<std::pair<int, std::string>> layouts = {
        {1, "--parallel.microbatches=8"},
        {2, "--parallel.microbatches=4 --parallel.zero=1"},
        {2, "--parallel.microbatches=4 --parallel.zero=2"},
        {2, "--parallel.microbatches=4 --parallel.zero=3"},
        {4, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=8 --parallel.zero=3"},
        {4, "--parallel.microbatches=2 --parallel.zero=3 --train.precision=bf16"},
    };
    step_zero_identical(layouts);
    auto ref = train(1, "ref", "--parallel.microbatches=8");
    ASSERT_EQ(ref.status, 0) << ref.output;
    auto lref = losses("ref");
    struct Move { int from_ranks; std::string from; int to_ranks; std::string to; };
    const std::vector<Move> moves = {
        {2, "--parallel.microbatches=4 --parallel.zero=3", 4, "--parallel.microbatches=2 --parallel.zero=1"},
        {4, "--parallel.microbatches=2 --parallel.zero=1", 2, "--parallel.microbatches=4 --parallel.zero=2"},
        {1, "--parallel.microbatches=8", 4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=3"},
        {4, "--parallel.tp=2 --parallel.microbatches=4 --parallel.zero=2", 2, "--parallel.microbatches=4 --parallel.zero=3"},
    };
    int k = 0;
    for (const auto& mv : moves) {
        std::string name = "mv" + std::to_string(k++);
        auto a = train(mv.from_ranks, name, mv.from + " --train.exit_after=5");
        ASSERT_EQ(a.status, 0) << a.output;
        auto b = train(mv.to_ranks, name, mv.to);
        ASSERT_EQ(b.status, 0) << b.output;
        EXPECT_NE(b.output.find("resumed from"), std::string::npos);
        auto l = losses(name);
        ASSERT_EQ(l.size(), 10u);
        for (size_t i = 0; i < 10; ++i)
            EXPECT_LE(std::abs(l[i] - lref[i]), 1e-5 * lref[i]) << mv.from << " -> " << mv.to << " step " << i + 1;
    }
}

// data.order = shuffle (epochs of a seeded permutation, docs/data.md): the samples of a step do
// not depend on the layout either.
TEST_F(Layouts, ShuffleOrderMatchesSingleRank) {
    compare("--data.order=shuffle", {
        {2, "--parallel.tp=2 --parallel.microbatches=8"},
        {4, "--parallel.pp=2 --parallel.microbatches=4"},  // dp=2
        {4, "--parallel.microbatches=2 --parallel.zero=1"},  // dp=4
    });
}

TEST_F(Layouts, PipelineWithTiedEmbeddings) {
    compare("--model.tie_embeddings=true", {
        {2, "--parallel.pp=2 --parallel.microbatches=8"},
        {4, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=8"},
    });
}

// parallel.overlap_dp with buckets of 1024 floats, so most buckets start during the backward:
// the kv-group and sequence-parallel norm gradients are completed inside the hook, tied
// embeddings after the schedule, and interleaved chunks report their own last backward.
TEST_F(Layouts, OverlappedDpReductionMatchesSingleRank) {
    const std::string small = " --parallel.bucket_mb=0.001";
    compare("", {
        {4, "--parallel.microbatches=2" + small},                                     // dp=4
        {8, "--parallel.tp=4 --parallel.microbatches=4" + small},                     // kv group, dp=2
        {4, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=4" + small},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=interleaved "
            "--parallel.virtual_stages=2" + small},
        {4, "--parallel.microbatches=2 --parallel.overlap_dp=false" + small},
    });
    compare("--model.tie_embeddings=true", {
        {4, "--parallel.pp=2 --parallel.microbatches=4" + small},
        {2, "--parallel.microbatches=4" + small},
    });
    auto early = losses("l0", "/timing/dp_buckets_overlapped");  // pp=2 x dp=2, tied
    ASSERT_FALSE(early.empty());
    EXPECT_GT(early.back(), 2.0);
}

// bf16: a layout changes fp32 summation orders, and a GEMM output that then rounds to the other
// bf16 neighbour differs by 2^-8 in that element, so layouts agree to bf16 noise, not fp32's.
TEST_F(Layouts, Bf16LayoutsMatchSingleRankBf16) {
    compare("--train.precision=bf16", {
        {2, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
        {4, "--parallel.tp=4 --parallel.microbatches=8"},
        {2, "--parallel.pp=2 --parallel.microbatches=8"},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=1"},  // dp=2
        {2, "--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zb_h1"},
        {2, "--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zbv --parallel.virtual_stages=2"},
        {2, "--parallel.microbatches=4 --parallel.zero=2"},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=3"},  // dp=2
    }, 1e-3);
}

// The bf16 acceptance bound: 20 bf16 steps within 2% of the fp32 losses -- and not equal to them.
TEST_F(Layouts, Bf16FollowsFp32Within2Percent) {
    auto a = train(1, "fp32", "--train.steps=20 --parallel.microbatches=8");
    auto b = train(1, "bf16", "--train.steps=20 --parallel.microbatches=8 --train.precision=bf16");
    ASSERT_EQ(a.status, 0) << a.output;
    ASSERT_EQ(b.status, 0) << b.output;
    auto la = losses("fp32"), lb = losses("bf16");
    ASSERT_EQ(la.size(), 20u);
    ASSERT_EQ(lb.size(), 20u);
    double most = 0;
    for (size_t i = 0; i < la.size(); ++i) {
        EXPECT_LE(std::abs(lb[i] - la[i]), 0.02 * la[i]) << "step " << i + 1;
        most = std::max(most, std::abs(lb[i] - la[i]) / la[i]);
    }
    EXPECT_GT(most, 1e-6) << "bf16 reproduced fp32 exactly: the bf16 path is not taken";
    EXPECT_LT(lb.back(), lb.front() - 0.5);
}

TEST_F(Layouts, StepZeroCheckpointsAreBitIdentical) {
    const std::vector<std::pair<int, std::string>> layouts = {
        {1, "--parallel.microbatches=8"},
        {4, "--parallel.tp=4 --parallel.sequence_parallel=true --parallel.microbatches=8"},
        {4, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=8"},
        {4, "--parallel.pp=4 --parallel.microbatches=8"},
        {4, "--parallel.tp=2 --parallel.microbatches=4 --parallel.zero=1"},
    };
    step_zero_identical(layouts);
}

TEST_F(Layouts, CheckpointsReshardOnResume) {
    auto ref = train(1, "ref", "--parallel.microbatches=8");
    ASSERT_EQ(ref.status, 0) << ref.output;
    auto lref = losses("ref");
    struct Move { int from_ranks; std::string from; int to_ranks; std::string to; };
    const std::vector<Move> moves = {
        {4, "--parallel.tp=2 --parallel.microbatches=4", 4, "--parallel.tp=4 --parallel.microbatches=8"},
        {4, "--parallel.tp=2 --parallel.microbatches=4 --parallel.zero=1", 1, "--parallel.microbatches=8"},
        {4, "--parallel.pp=4 --parallel.microbatches=8", 1, "--parallel.microbatches=8"},
        {4, "--parallel.pp=4 --parallel.microbatches=8", 2, "--parallel.pp=2 --parallel.microbatches=8"},
        {1, "--parallel.microbatches=8", 4, "--parallel.pp=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
    };
    int k = 0;
    for (const auto& mv : moves) {
        std::string name = "mv" + std::to_string(k++);
        auto a = train(mv.from_ranks, name, mv.from + " --train.exit_after=5");
        ASSERT_EQ(a.status, 0) << a.output;
        auto b = train(mv.to_ranks, name, mv.to);
        ASSERT_EQ(b.status, 0) << b.output;
        EXPECT_NE(b.output.find("resumed from"), std::string::npos);
        auto l = losses(name);
        ASSERT_EQ(l.size(), 10u);
        for (size_t i = 5; i < 10; ++i)
            EXPECT_LE(std::abs(l[i] - lref[i]), 1e-5 * lref[i]) << mv.from << " -> " << mv.to << " step " << i + 1;
    }
}

// train.global_batch fixes the samples per step: every layout derives its microbatches from it,
// and a resume on another layout keeps the checkpoint's batch (the same curve) unless the deck
// sets another one -- also for a run that never set the key (its dp x microbatches x B).
TEST_F(Layouts, GlobalBatchIsTheDecksOnEveryLayout) {
    auto ref = train(1, "ref", "--parallel.microbatches=8");  // 16 samples per step
    ASSERT_EQ(ref.status, 0) << ref.output;
    const auto lref = losses("ref");
    ASSERT_EQ(lref.size(), 10u);
    // dp 4 with the global batch (and a parallel.microbatches it overrides, said so).
    auto gb = train(4, "gb", "--train.global_batch=16 --parallel.microbatches=8");
    ASSERT_EQ(gb.status, 0) << gb.output;
    EXPECT_NE(gb.output.find("parallel.microbatches = 2, not 8"), std::string::npos) << gb.output;
    expect_close(losses("gb"), lref, 1e-5, "dp4 global_batch 16");
    // tp2 x dp2 for 5 steps, then pp2 on 2 ranks with no batch key: the checkpoint's 16 stays.
    auto a = train(4, "mv", "--parallel.tp=2 --train.global_batch=16 --train.exit_after=5");
    ASSERT_EQ(a.status, 0) << a.output;
    auto b = train(2, "mv", "--parallel.pp=2");
    ASSERT_EQ(b.status, 0) << b.output;
    expect_close(losses("mv"), lref, 1e-5, "tp2 dp2 -> pp2", 5);
    // A run without the key: dp 4 x 1 microbatch x 2 = 8 samples, resumed on one rank.
    auto r8 = train(1, "ref8", "--parallel.microbatches=4");
    ASSERT_EQ(r8.status, 0) << r8.output;
    auto c = train(4, "legacy", "--parallel.microbatches=1 --train.exit_after=5");
    ASSERT_EQ(c.status, 0) << c.output;
    auto d = train(1, "legacy", "--parallel.microbatches=8");
    ASSERT_EQ(d.status, 0) << d.output;
    EXPECT_NE(d.output.find("the global batch stays the checkpoint's 8 samples per step"), std::string::npos) << d.output;
    expect_close(losses("legacy"), losses("ref8"), 1e-5, "dp4 (8 samples) -> 1 rank", 5);
    // A global batch this layout cannot split, given or inherited: exit 2 before any work.
    auto bad = train(4, "bad", "--train.global_batch=12");
    EXPECT_EQ(bad.status, 2) << bad.output;
    for (const char* piece : {"train.global_batch", "'12'", "dp x data.micro_batch_size", "4 x 2 = 8"})
        EXPECT_NE(bad.output.find(piece), std::string::npos) << piece << "\n" << bad.output;
    auto e = train(1, "odd", "--train.global_batch=4 --train.exit_after=2");
    ASSERT_EQ(e.status, 0) << e.output;
    auto f = train(4, "odd", "");
    EXPECT_EQ(f.status, 2) << f.output;
    EXPECT_NE(f.output.find("4 samples per step, not a multiple of dp x data.micro_batch_size = 8"), std::string::npos)
        << f.output;
    EXPECT_FALSE(fs::exists(dir / "odd/checkpoints/step_00000003.h5"));
}

TEST_F(Layouts, FailedOrStuckStageEndsTheJobWithAMessage) {
    // A stage that throws: its message names the rank; MPI_Abort ends the others.
    setenv("QUINTET_INJECT_FAULT", "rank=1,step=2,mode=fail", 1);
    auto a = train(2, "fail", "--parallel.pp=2 --parallel.microbatches=4");
    EXPECT_NE(a.status, 0);
    EXPECT_NE(a.output.find("rank 1: error: injected fault"), std::string::npos) << a.output;
    // A rank that stops answering: the ranks waiting for it give up at the deadline
    // (train.collective_timeout_s), naming the axis and the operation, and the job ends with
    // exit status 4 (a transient fault, docs/reliability.md) -- in a pipeline receive, a tp
    // all-reduce inside the layers (timed by the watchdog) and a dp gradient reduction.
    struct Hang {
        std::string layout, expect;
    };
    const Hang hangs[] = {
        {"--parallel.pp=2 --parallel.microbatches=4", "pipeline stage 1: recv_fwd mb 0"},
        {"--parallel.tp=2 --parallel.microbatches=4", "on the tp communicator"},
        {"--parallel.microbatches=2", "on the dp"},
    };
    for (const auto& h : hangs) {
        setenv("QUINTET_INJECT_FAULT", "rank=0,step=2,mode=hang", 1);
        auto t0 = std::chrono::steady_clock::now();
        auto b = train(2, "hang", h.layout + " --train.collective_timeout_s=5");
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        unsetenv("QUINTET_INJECT_FAULT");
        EXPECT_EQ(b.status, 4) << h.layout << "\n" << b.output;
        EXPECT_NE(b.output.find(h.expect), std::string::npos) << h.layout << "\n" << b.output;
        EXPECT_NE(b.output.find("rank 1"), std::string::npos) << h.layout << "\n" << b.output;
        EXPECT_NE(b.output.find("did not complete within"), std::string::npos) << b.output;
        // The stuck rank is named without the stuck collective (the status side channel).
        EXPECT_NE(b.output.find("world ranks that did not arrive: 0 (no report)"), std::string::npos) << b.output;
        EXPECT_LT(secs, 60.0) << h.layout;
        // Recorded for job scripts (requeue on 4): kind, step (the one logged as 3), rank.
        const std::string fault = read_file(dir / "hang" / "fault");
        EXPECT_NE(fault.find("kind=transient step=3 rank="), std::string::npos) << h.layout << "\n" << fault;
        std::filesystem::remove_all(dir / "hang");
    }
}

}  // namespace
