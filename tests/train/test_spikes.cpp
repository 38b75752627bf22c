// Loss spikes (train.on_spike, docs/reliability.md "Loss spikes"), injected for real: one rank's
// gradient of one step multiplied by 1000 (QUINTET_INJECT_FAULT mode=spike) is skipped on one
// rank, dp2, tp2, pp2 (injected on the first stage), ep2 and ZeRO-3 -- the same step everywhere,
// and the run goes on exactly as one whose step was dropped by the non-finite policy (tensors,
// moments and curve bit for bit); under rerun a spike that does not come back is kept (the
// unbroken curve bit for bit) and one that does is skipped; max_skips stops the run; the window
// is checkpointed, so a resumed run judges as the unbroken one (its limits bit for bit); bad
// keys stop before any work.
// ctest: labels=mpi timeout=1500 launches_mpirun
#include <gtest/gtest.h>

#include <cmath>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
[data]
seq_len = 32
micro_batch_size = 2
order = random
val_fraction = 0.1
[train]
steps = 20
lr = 1e-2
lr_min = 1e-3
warmup = 2
seed = 5
peak_tflops = 0.1
spike_window = 8
[eval]
every = 5
batches = 2
[checkpoint]
every = 5
keep = 0
[output]
log_every = 5
)";

constexpr const char* kMoe = " --moe.experts=4 --moe.top_k=2 --moe.ffn_dim=32 --moe.shared_experts=1";
constexpr int kStep = 12;  // 0-based: the step logged as 13

std::vector<double> one_hot(size_t n, size_t at) {
    std::vector<double> v(n, 0.0);
    v[at] = 1.0;
    return v;
}

// Equal element by element, NaN equal to NaN (the limits while the window fills).
void expect_same(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) << what << " row " << i << ": " << a[i] << " " << b[i];
}

// v without row `skip`.
std::vector<double> without(std::vector<double> v, size_t skip) {
    v.erase(v.begin() + long(skip));
    return v;
}

struct Spikes : TrainFixture {
    void SetUp() override { prepare("spikes_", kDeck, 5); }
    void TearDown() override { unsetenv("QUINTET_INJECT_FAULT"); }
    RunResult injected(int ranks, const std::string& name, const std::string& fault, const std::string& extra) {
        setenv("QUINTET_INJECT_FAULT", fault.c_str(), 1);
        RunResult r = train(ranks, name, extra);
        unsetenv("QUINTET_INJECT_FAULT");
        return r;
    }
    std::vector<double> col(const std::string& run, const char* c) { return metrics_column(dir / run, c); }
};

TEST_F(Spikes, ASpikeIsSkippedOnEveryLayoutAsIfTheStepWereDropped) {
    struct L {
        int ranks, rank;  // world size, the rank whose gradient is multiplied
        std::string name, args;
    };
    const L layouts[] = {
        {1, 0, "one", "--parallel.microbatches=4"},
        {2, 1, "dp2", "--parallel.microbatches=2"},
        {2, 1, "tp2", "--parallel.tp=2 --parallel.microbatches=4"},
        {2, 0, "pp2", "--parallel.pp=2 --parallel.microbatches=4"},
        {2, 1, "ep2", std::string(kMoe) + " --parallel.ep=2 --parallel.microbatches=2"},
        {2, 1, "zero3", "--parallel.zero=3 --parallel.microbatches=2"},
    };
    std::vector<double> loss_one;
    for (const L& l : layouts) {
        SCOPED_TRACE(l.name);
        const std::string at = "rank=" + std::to_string(l.rank) + ",step=" + std::to_string(kStep);
        auto a = injected(l.ranks, l.name + "_spike", at + ",mode=spike,factor=1000", l.args + " --train.on_spike=skip");
        ASSERT_EQ(a.status, 0) << a.output;
        EXPECT_NE(a.output.find("warning: step 13: the gradient norm"), std::string::npos) << a.output;
        EXPECT_NE(a.output.find("a loss spike; the update is skipped"), std::string::npos) << a.output;
        // The reference: the same step dropped by the non-finite policy.
        auto b = injected(l.ranks, l.name + "_nan", at + ",mode=nan", l.args + " --train.on_nonfinite=skip");
        ASSERT_EQ(b.status, 0) << b.output;
        EXPECT_EQ(col(l.name + "_spike", "/train/skipped"), one_hot(20, kStep));
        EXPECT_EQ(col(l.name + "_spike", "/train/spike"), one_hot(20, kStep));
        EXPECT_EQ(col(l.name + "_nan", "/train/skipped"), one_hot(20, kStep));
        for (const char* c : {"/train/loss", "/train/grad_norm"})
            EXPECT_EQ(without(col(l.name + "_spike", c), kStep), without(col(l.name + "_nan", c), kStep)) << c;
        EXPECT_EQ(col(l.name + "_spike", "/eval/loss"), col(l.name + "_nan", "/eval/loss"));
        // The weights, the moments and the window of the final checkpoint: the same bytes.
        EXPECT_EQ(checkpoint_difference((dir / (l.name + "_spike") / "checkpoints/step_00000020.h5").string(),
                                        (dir / (l.name + "_nan") / "checkpoints/step_00000020.h5").string(), {"deck"}),
                  "");
        // Every layout follows one rank (fp32 reduction order); the MoE run has its own model.
        if (l.name == "one") loss_one = col("one_spike", "/train/loss");
        else if (l.name != "ep2") expect_close(col(l.name + "_spike", "/train/loss"), loss_one, 1e-5, l.name);
    }
}

TEST_F(Spikes, RerunKeepsATransientSpikeAndSkipsOneThatComesBack) {
    auto ref = train(2, "ref", "--parallel.microbatches=2 --train.on_spike=rerun");
    ASSERT_EQ(ref.status, 0) << ref.output;
    EXPECT_EQ(col("ref", "/train/spike"), std::vector<double>(20, 0.0)) << "a false positive";
    // Once: the rerun is within the limits, kept -- the unbroken curve bit for bit.
    const std::string at = "rank=1,step=" + std::to_string(kStep);
    auto once = injected(2, "once", at + ",mode=spike_once,factor=1000", "--parallel.microbatches=2 --train.on_spike=rerun");
    ASSERT_EQ(once.status, 0) << once.output;
    EXPECT_NE(once.output.find("the step is re-run once from the same state"), std::string::npos) << once.output;
    EXPECT_NE(once.output.find("the rerun is within the limits"), std::string::npos) << once.output;
    EXPECT_EQ(col("once", "/train/spike"), one_hot(20, kStep));
    EXPECT_EQ(col("once", "/train/skipped"), std::vector<double>(20, 0.0));
    for (const char* c : {"/train/loss", "/train/grad_norm", "/eval/loss", "/train/spike_grad_norm_limit"})
        expect_same(col("once", c), col("ref", c), c);
    EXPECT_EQ(read_file(dir / "once" / "fault").rfind("kind=transient_spike step=13", 0), 0u) << read_file(dir / "once" / "fault");
    // Every time: the rerun spikes again, the step is skipped as under skip.
    auto every = injected(2, "every", at + ",mode=spike,factor=1000", "--parallel.microbatches=2 --train.on_spike=rerun");
    ASSERT_EQ(every.status, 0) << every.output;
    EXPECT_NE(every.output.find("also when the step is re-run from the same state"), std::string::npos) << every.output;
    auto skip = injected(2, "skip", at + ",mode=spike,factor=1000", "--parallel.microbatches=2 --train.on_spike=skip");
    ASSERT_EQ(skip.status, 0) << skip.output;
    EXPECT_EQ(col("every", "/train/skipped"), one_hot(20, kStep));
    for (const char* c : {"/train/loss", "/eval/loss"}) EXPECT_EQ(col("every", c), col("skip", c)) << c;
}

TEST_F(Spikes, MaxSkipsInARowStopsTheRun) {
    auto r = injected(1, "three", "rank=0,step=12,mode=spike,factor=1000,until=14",
                      "--parallel.microbatches=4 --train.on_spike=skip --train.max_skips=3");
    EXPECT_EQ(r.status, 3) << r.output;
    EXPECT_NE(r.output.find("3 steps in a row rejected (train.max_skips"), std::string::npos) << r.output;
    EXPECT_EQ(col("three", "/train/skipped").size(), 14u);  // steps 1..14; 15 stopped
    EXPECT_NE(read_file(dir / "three" / "fault").find("kind=diverged step=15"), std::string::npos);
}

// The window travels in the checkpoint: a run stopped at step 10 and resumed judges step 13 with
// the limits of the unbroken run, bit for bit, and skips it the same.
TEST_F(Spikes, AResumedRunKeepsTheWindow) {
    const std::string fault = "rank=0,step=" + std::to_string(kStep) + ",mode=spike,factor=1000";
    const std::string args = "--parallel.microbatches=4 --train.on_spike=skip";
    auto u = injected(1, "unbroken", fault, args);
    ASSERT_EQ(u.status, 0) << u.output;
    auto b1 = injected(1, "broken", fault, args + " --train.exit_after=10");
    ASSERT_EQ(b1.status, 0) << b1.output;
    auto b2 = injected(1, "broken", fault, args);
    ASSERT_EQ(b2.status, 0) << b2.output;
    EXPECT_NE(b2.output.find("resumed from"), std::string::npos) << b2.output;
    for (const char* c : {"/train/loss", "/train/skipped", "/train/spike", "/train/spike_loss_limit",
                          "/train/spike_grad_norm_limit"})
        expect_same(col("unbroken", c), col("broken", c), c);
    EXPECT_EQ(col("broken", "/train/skipped"), one_hot(20, kStep));
}

TEST_F(Spikes, BadKeysStopBeforeAnyWork) {
    struct Bad {
        std::string args, key;
    };
    const Bad bad[] = {
        {"--train.on_spike=maybe", "train.on_spike"},
        {"--train.spike_window=1", "train.spike_window"},
        {"--train.spike_sigma=0", "train.spike_sigma"},
        {"--train.spike_sigma=-3", "train.spike_sigma"},
        {"--train.on_spike=skip --train.spike_window=50", "train.spike_window"},  // longer than the 20 steps
    };
    int k = 0;
    for (const Bad& b : bad) {
        const std::string name = "bad" + std::to_string(k++);
        auto r = train(1, name, b.args);
        EXPECT_EQ(r.status, 2) << b.args << "\n" << r.output;
        EXPECT_NE(r.output.find(b.key), std::string::npos) << r.output;
        EXPECT_FALSE(fs::exists(dir / name)) << b.args;
    }
    auto r = train(1, "window", "--train.on_spike=skip --train.spike_window=50");
    EXPECT_NE(r.output.find("exceeds train.steps = 20"), std::string::npos) << r.output;
}

}  // namespace
