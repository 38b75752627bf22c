// Mixture-of-Experts through the real binary under mpirun (docs/math.md §9): tp2+SP, pp2 (1F1B,
// interleaved), dp2+ZeRO-1, cp2, cp2 x tp2+SP and full recomputation against the single-rank run
// of the same deck -- loss (ce + aux) and eval curves to fp32 reduction order, and the expert
// loads of every step -- for aux_loss, aux_free (its bias the same) and a subset of MoE layers;
// step-0 checkpoints bit-identical; bad MoE input. Expert parallelism: test_expert_parallel.cpp.
// ctest: labels=mpi timeout=1500 launches_mpirun
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstring>
#include <random>

#include "quintet/io/token_data.hpp"
#include "quintet/tokenizer/tokenizer.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
[moe]
experts = 4
top_k = 2
shared_experts = 1
ffn_dim = 32
aux_coef = 0.01
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

std::vector<double> expert_load(const fs::path& run) { return metrics_column(run, "/moe/expert_load"); }

struct Moe : TrainFixture {
    void SetUp() override { prepare("moe_", kDeck, 5); }
    std::vector<double> col(const std::string& name, const char* what = "/train/loss") {
        return metrics_column(dir / name, what);
    }
    // Loss and eval as every layout test, then the aux loss and the expert loads of each step.
    void compare(const std::string& model, const std::vector<std::pair<int, std::string>>& layouts) {
        const auto names = compare_layouts(model, layouts, 1e-5, 0.3);
        ASSERT_EQ(names.size(), layouts.size());
        const auto aref = col("ref", "/train/aux_loss");
        const auto loads = expert_load(dir / "ref");
        ASSERT_EQ(loads.size(), 10u * 4 * 4);
        // Every step routes 2 choices for each of the 16 x 32 tokens on every MoE layer.
        double total = 0;
        for (int l = 0; l < 4; ++l) total += loads[size_t(l) * 4] + loads[size_t(l) * 4 + 1] + loads[size_t(l) * 4 + 2] + loads[size_t(l) * 4 + 3];
        EXPECT_EQ(total, model.find("moe.layers=1,3") != std::string::npos ? 2 * 1024.0 : 4 * 1024.0);
        for (size_t k = 0; k < names.size(); ++k) {
            const std::string& args = layouts[k].second;
            const auto a = col(names[k], "/train/aux_loss");
            ASSERT_EQ(a.size(), aref.size()) << args;
            for (size_t i = 0; i < a.size(); ++i)
                EXPECT_LE(std::abs(a[i] - aref[i]), 1e-5 * std::abs(aref[i]) + 1e-9) << model << " " << args << " aux " << i + 1;
            EXPECT_EQ(expert_load(dir / names[k]), loads) << model << " " << args << ": other expert loads";
        }
    }
};

const std::vector<std::pair<int, std::string>> kLayouts = {
    {2, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
    {2, "--parallel.pp=2 --parallel.microbatches=8"},
    {2, "--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=interleaved --parallel.virtual_stages=2"},
    {2, "--parallel.microbatches=4 --parallel.zero=1"},  // dp = 2
    {2, "--parallel.cp=2 --parallel.microbatches=8"},
    {4, "--parallel.cp=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
    {1, "--parallel.microbatches=8 --train.recompute=full"},
};

TEST_F(Moe, AuxLossEveryLayoutMatchesOneRank) { compare("", kLayouts); }

TEST_F(Moe, AuxFreeAndALayerSubsetMatchOneRank) {
    compare("--moe.balance=aux_free --moe.bias_rate=0.01 --moe.layers=1,3 --moe.shared_experts=0 "
            "--moe.norm_topk=false",
            {kLayouts[0], kLayouts[1], kLayouts[3], kLayouts[4]});
    // aux_free adds no aux term, and the bias moved (it is in the final checkpoint, the same on
    // every layout: a buffer updated identically everywhere).
    for (double a : col("ref", "/train/aux_loss")) EXPECT_EQ(a, 0.0);
    auto ta = checkpoint_tensors((dir / "ref/checkpoints/step_00000010.h5").string());
    auto tb = checkpoint_tensors((dir / "l0/checkpoints/step_00000010.h5").string());
    int biases = 0;
    for (size_t i = 0; i < ta.size(); ++i)
        if (ta[i].first.find("e_score_correction_bias") != std::string::npos &&
            ta[i].first.rfind("params/", 0) == 0) {
            ++biases;
            double moved = 0;
            for (size_t e = 0; e < ta[i].second.size(); ++e) {
                moved += std::abs(ta[i].second[e]);
                EXPECT_EQ(ta[i].second[e], tb[i].second[e]) << ta[i].first;
            }
            EXPECT_GT(moved, 0.0) << ta[i].first;
        }
    EXPECT_EQ(biases, 2);  // layers 1 and 3
}

// DeepSeek's routers (docs/math.md §9): V3's -- sigmoid scores, the aux-free bias in the choice,
// the top-2-sum group rule, renormalised and scaled -- and V2's -- softmax, groups ranked by their
// best score, scaled, with the balance loss -- on every layout as on one rank.
TEST_F(Moe, DeepSeekRoutersMatchOneRank) {
    compare("--moe.scoring=sigmoid --moe.topk_method=noaux_tc --moe.groups=2 --moe.group_top_k=1 "
            "--moe.routed_scaling=2.5 --moe.balance=aux_free --moe.bias_rate=0.01",
            {kLayouts[0], kLayouts[1], kLayouts[4], kLayouts[5]});
    for (double a : col("ref", "/train/aux_loss")) EXPECT_EQ(a, 0.0);
    compare("--moe.topk_method=group_limited_greedy --moe.groups=2 --moe.group_top_k=1 --moe.norm_topk=false "
            "--moe.routed_scaling=1.5",
            {kLayouts[0], kLayouts[2], kLayouts[3]});
    double aux = 0;
    for (double a : col("ref", "/train/aux_loss")) aux += a;
    EXPECT_GT(aux, 0.0);
}

TEST_F(Moe, StepZeroCheckpointsAreBitIdentical) {
    auto a = train(1, "s0a", "--train.steps=0");
    auto b = train(4, "s0b", "--train.steps=0 --parallel.cp=2 --parallel.tp=2 --parallel.sequence_parallel=true");
    auto c = train(2, "s0c", "--train.steps=0 --parallel.pp=2");
    ASSERT_EQ(a.status, 0) << a.output;
    ASSERT_EQ(b.status, 0) << b.output;
    ASSERT_EQ(c.status, 0) << c.output;
    auto ta = checkpoint_tensors((dir / "s0a/checkpoints/step_00000000.h5").string());
    size_t experts = 0;
    for (const auto& t : ta) experts += t.first.find("params/model.layers.2.mlp.experts.") == 0;
    EXPECT_EQ(experts, 4u * 3);
    for (const char* other : {"s0b", "s0c"}) {
        auto tb = checkpoint_tensors((dir / other / "checkpoints/step_00000000.h5").string());
        ASSERT_EQ(ta.size(), tb.size());
        for (size_t i = 0; i < ta.size(); ++i) {
            ASSERT_EQ(ta[i].first, tb[i].first);
            EXPECT_EQ(0, std::memcmp(ta[i].second.data(), tb[i].second.data(), ta[i].second.size() * 4))
                << other << " " << ta[i].first;
        }
    }
}

TEST_F(Moe, BadInputNamesTheKey) {
    struct Case {
        int ranks;
        std::string args, key;
    };
    const std::vector<Case> cases = {
        {1, "--moe.top_k=5", "moe.top_k"},
        {1, "--moe.layers=1,7", "moe.layers"},
        {1, "--moe.layers=x", "moe.layers"},
        {2, "--parallel.tp=2", "parallel.sequence_parallel"},
    };
    int k = 0;
    for (const auto& c : cases) {
        auto r = train(c.ranks, "bad" + std::to_string(k++), c.args);
        EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
        EXPECT_NE(r.output.find(c.key), std::string::npos) << c.args << "\n" << r.output;
    }
}

// A router that collapses onto one expert is named once per layer (at most), with the key that
// helps, once the collapse has lasted moe.dead_after steps -- and not before.
TEST_F(Moe, CollapsingRouterWarnsOncePerLayer) {
    auto count = [](const std::string& out, const std::string& what) {
        size_t n = 0;
        for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
        return n;
    };
    // Words of English as bytes: without balancing, the router latches onto one expert.
    std::mt19937 g(3);
    const char* words[] = {"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
                           "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
                           "an", "they", "you", "were", "her", "she", "there", "their", "one", "all", "we", "can"};
    const size_t n_words = sizeof words / sizeof *words;
    std::vector<uint32_t> text;
    for (int line = 0; line < 2000; ++line)
        for (int w = 0; w < 12; ++w) {
            for (const char* c = words[g() % n_words]; *c; ++c) text.push_back(uint8_t(*c));
            text.push_back(w == 11 ? '\n' : ' ');
        }
    data = dir / "words.h5";
    quintet::token_file_write(data.string(), text, quintet::Tokenizer{});
    const std::string run = "--train.steps=60 --parallel.microbatches=8 --moe.balance=none";
    auto warned = train(1, "none", run + " --moe.dead_after=10");
    ASSERT_EQ(warned.status, 0) << warned.output;
    const size_t n = count(warned.output, "warning: MoE layer");
    EXPECT_GE(n, 1u) << warned.output;
    EXPECT_LE(n, 4u) << warned.output;  // once per layer at most
    EXPECT_NE(warned.output.find("moe.balance = aux_free or aux_loss"), std::string::npos) << warned.output;
    // The same run with a window longer than the run: the same collapse, no warning.
    auto quiet = train(1, "none_long", run + " --moe.dead_after=61");
    ASSERT_EQ(quiet.status, 0) << quiet.output;
    EXPECT_EQ(count(quiet.output, "warning: MoE layer"), 0u) << quiet.output;
}

// quintet eval of a MoE checkpoint under tp: sequence parallelism is turned on by eval itself
// (MoE layers need it under tp), and the loss is the one rank's.
TEST_F(Moe, EvalUnderTpNeedsNoSequenceParallelFlag) {
    auto t = train(1, "ev", "--train.steps=2 --parallel.microbatches=8");
    ASSERT_EQ(t.status, 0) << t.output;
    const std::string ckpt = (dir / "ev/checkpoints/step_00000002.h5").string();
    auto loss = [](const std::string& out) {
        const auto at = out.find("val_loss=");
        return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 9));
    };
    auto one = run_quintet(1, "eval --checkpoint " + ckpt + " --data " + data.string());
    auto two = run_quintet(2, "eval --checkpoint " + ckpt + " --data " + data.string() + " --parallel.tp=2");
    ASSERT_EQ(one.status, 0) << one.output;
    ASSERT_EQ(two.status, 0) << two.output;
    ASSERT_GT(loss(one.output), 0) << one.output;
    EXPECT_NEAR(loss(two.output), loss(one.output), 1e-5 * loss(one.output)) << two.output;
    // Said explicitly, the flag is respected: false is refused with the key named.
    auto no = run_quintet(2, "eval --checkpoint " + ckpt + " --data " + data.string() +
                                 " --parallel.tp=2 --parallel.sequence_parallel=false");
    EXPECT_EQ(no.status, 2) << no.output;
    EXPECT_NE(no.output.find("parallel.sequence_parallel"), std::string::npos) << no.output;
}

}  // namespace
