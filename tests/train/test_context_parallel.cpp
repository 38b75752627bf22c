// Context parallelism through the real binary under mpirun (docs/parallelism.md): cp2, cp4 and
// cp with TP (with and without SP), PP (1F1B, GPipe, interleaved) and DP + ZeRO-1 against the
// single-rank run of the same deck -- loss and eval curves to fp32 reduction order (1e-5) --
// each with and without document masking on packed samples; step-0 checkpoints bit-identical;
// a cp2 checkpoint resumes at cp1 and at cp4 on the same curve; the ring's metrics and bytes;
// bad input.
// ctest: labels=mpi timeout=1500 launches_mpirun
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

// T = 32: 2*cp chunks of 8 (cp2) or 4 (cp4) tokens; (T/cp) divisible by tp = 2 under SP.
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

constexpr int kEos = 255;

struct ContextParallel : TrainFixture {
    void SetUp() override {
        prepare("cp_", kDeck, 5);
        make_document_token_file(data, 20000, kEos, 9);  // boundaries cross chunks and ranks
    }
    std::vector<double> col(const std::string& name, const char* what = "/train/loss") {
        return metrics_column(dir / name, what);
    }
    void compare(const std::string& model, const std::vector<std::pair<int, std::string>>& layouts) {
        compare_layouts(model, layouts, 1e-5, 0.3);
    }
};

const std::vector<std::pair<int, std::string>> kLayouts = {
    {2, "--parallel.cp=2 --parallel.microbatches=8"},
    {4, "--parallel.cp=4 --parallel.microbatches=8"},
    {4, "--parallel.cp=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
    {4, "--parallel.cp=2 --parallel.tp=2 --parallel.microbatches=8"},
    {4, "--parallel.cp=2 --parallel.pp=2 --parallel.microbatches=8"},
    {4, "--parallel.cp=2 --parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=gpipe"},
    {4, "--parallel.cp=2 --parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=interleaved "
        "--parallel.virtual_stages=2"},
    {4, "--parallel.cp=2 --parallel.microbatches=4 --parallel.zero=1"},  // dp = 2
    {4, "--parallel.cp=2 --parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zb_h1"},
    {4, "--parallel.cp=2 --parallel.microbatches=4 --parallel.zero=2"},  // dp = 2: shards over dp x cp = 4
    {4, "--parallel.cp=2 --parallel.microbatches=4 --parallel.zero=3"},
    {4, "--parallel.cp=2 --parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=zbv "
        "--parallel.virtual_stages=2 --train.recompute=selective"},
};

TEST_F(ContextParallel, EveryLayoutMatchesOneRank) { compare("", kLayouts); }

TEST_F(ContextParallel, EveryLayoutMatchesOneRankWithDocumentMasks) {
    compare("--data.document_mask=true", kLayouts);
    // The mask changes the model's view: the curve differs from the unmasked one.
    auto plain = train(1, "plain", "--parallel.microbatches=8");
    ASSERT_EQ(plain.status, 0) << plain.output;
    EXPECT_GT(std::abs(col("plain")[5] - col("ref")[5]), 1e-4);
}

TEST_F(ContextParallel, DocumentPositionsMatchOneRank) {
    compare("--data.document_mask=true --rope.document_positions=true",
            {{2, "--parallel.cp=2 --parallel.microbatches=8"},
             {4, "--parallel.cp=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"}});
}

TEST_F(ContextParallel, StepZeroCheckpointsAreBitIdenticalAndResumeAcrossCp) {
    auto a = train(1, "s0a", "--train.steps=0");
    auto b = train(4, "s0b", "--train.steps=0 --parallel.cp=2 --parallel.tp=2");
    ASSERT_EQ(a.status, 0) << a.output;
    ASSERT_EQ(b.status, 0) << b.output;
    auto ta = checkpoint_tensors((dir / "s0a/checkpoints/step_00000000.h5").string());
    auto tb = checkpoint_tensors((dir / "s0b/checkpoints/step_00000000.h5").string());
    ASSERT_EQ(ta.size(), tb.size());
    for (size_t i = 0; i < ta.size(); ++i)
        EXPECT_EQ(0, std::memcmp(ta[i].second.data(), tb[i].second.data(), ta[i].second.size() * 4))
            << ta[i].first;
    // A cp2 run stopped after 5 steps continues at cp1 and at cp4 on the unbroken curve.
    auto ref = train(1, "ref", "--parallel.microbatches=8");
    ASSERT_EQ(ref.status, 0) << ref.output;
    auto lref = col("ref");
    for (const auto& [ranks, to] : std::vector<std::pair<int, std::string>>{
             {1, "--parallel.microbatches=8"}, {4, "--parallel.cp=4 --parallel.microbatches=8"}}) {
        const std::string name = "mv" + std::to_string(ranks);
        auto first = train(2, name, "--parallel.cp=2 --parallel.microbatches=8 --train.exit_after=5");
        ASSERT_EQ(first.status, 0) << first.output;
        auto second = train(ranks, name, to);
        ASSERT_EQ(second.status, 0) << second.output;
        EXPECT_NE(second.output.find("resumed from"), std::string::npos);
        auto l = col(name);
        ASSERT_EQ(l.size(), 10u);
        for (size_t i = 5; i < 10; ++i) EXPECT_LE(std::abs(l[i] - lref[i]), 1e-5 * lref[i]) << to << " step " << i + 1;
    }
}

// train.recompute = selective | full: for every layout the same curve as none, bit for bit (the
// same arithmetic on the same inputs), and less activation memory.
TEST_F(ContextParallel, RecomputationKeepsTheCurveBitForBit) {
    const std::vector<std::pair<int, std::string>> layouts = {
        {1, "--parallel.microbatches=8"},
        {2, "--parallel.cp=2 --parallel.microbatches=8 --data.document_mask=true"},
        {4, "--parallel.cp=2 --parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=interleaved "
            "--parallel.virtual_stages=2"},
        {2, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
    };
    int k = 0;
    for (const auto& [ranks, args] : layouts) {
        std::vector<std::vector<double>> curves;
        for (const char* r : {"none", "selective", "full"}) {
            const std::string name = "rc" + std::to_string(k) + r;
            auto run = train(ranks, name, args + " --train.recompute=" + r);
            ASSERT_EQ(run.status, 0) << args << " " << r << "\n" << run.output;
            curves.push_back(col(name));
            EXPECT_NE(run.output.find("activations:"), std::string::npos);
        }
        ++k;
        for (int i = 1; i < 3; ++i) EXPECT_EQ(curves[i], curves[0]) << args << " recompute " << i;
    }
}

// The ring's metrics: bytes per step equal docs/math.md §8's count, the wait is timed.
TEST_F(ContextParallel, RingBytesEqualTheTheory) {
    for (int cp : {2, 4}) {
        const std::string name = "bytes" + std::to_string(cp);
        auto r = train(cp, name, "--parallel.cp=" + std::to_string(cp) + " --parallel.microbatches=8");
        ASSERT_EQ(r.status, 0) << r.output;
        auto bytes = col(name, "/timing/cp_bytes"), exposed = col(name, "/timing/cp_exposed");
        ASSERT_EQ(bytes.size(), 10u);
        // Per layer and microbatch, forward: (cp-1) K|V blocks; backward: (cp-1) K|V blocks and
        // (cp-1) dK|dV blocks. A block: B * T/cp rows of 2 * n_kv_heads * head_dim floats.
        const double block = 2.0 * (32.0 / cp) * (2 * 2 * 8) * 4;  // B=2, NKV=2, HD=8, fp32
        const double theory = 4 /*layers*/ * 8 /*microbatches*/ * 3.0 * (cp - 1) * block;
        for (double b : bytes) EXPECT_EQ(b, theory) << "cp=" << cp;
        for (double e : exposed) EXPECT_GE(e, 0.0);
    }
}

TEST_F(ContextParallel, BadInputStopsBeforeAnyWork) {
    auto a = train(2, "bad1", "--parallel.cp=2 --data.seq_len=30");
    EXPECT_EQ(a.status, 2) << a.output;
    EXPECT_NE(a.output.find("data.seq_len"), std::string::npos) << a.output;
    EXPECT_NE(a.output.find("2*parallel.cp = 4"), std::string::npos) << a.output;
    auto b = train(3, "bad2", "--parallel.cp=2");
    EXPECT_EQ(b.status, 2) << b.output;
    EXPECT_NE(b.output.find("parallel.tp*cp*pp"), std::string::npos) << b.output;
    auto c = train(1, "bad3", "--data.document_mask=true --data.eos_id=300");
    EXPECT_EQ(c.status, 2) << c.output;
    EXPECT_NE(c.output.find("data.eos_id"), std::string::npos) << c.output;
    EXPECT_FALSE(fs::exists(dir / "bad1" / "checkpoints"));
}

}  // namespace
