// DeepSeek-V3's multi-token prediction through the real binary under mpirun (docs/math.md §11):
// model.mtp_depth = 2 on tp2+SP, pp2, cp2, dp2 with ZeRO-1, 2 and 3, the zero-bubble schedules
// (zb_h1, zbv: the modules on the stage that holds the head), depth 1 as well, a tied head, bf16,
// and an MLA + MoE model with ep2, ZeRO-3 and zb_h1, against the single-rank run of the same deck
// -- the loss (main + mtp_weight/D x the modules'), the modules' own /train/mtp_loss and the eval
// curve to fp32 reduction order (bf16: to bf16 noise); the modules' tensors in the checkpoint
// under DeepSeek-V3's names (the layers after the last decoder layer); generation ignores them
// unless --speculative mtp drafts with them (plain greedy's tokens, exactly); a sample too short
// for the deepest module is refused naming the key.
// ctest: labels=mpi timeout=1200 launches_mpirun
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
mtp_depth = 2
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
mtp_weight = 0.5
[eval]
every = 5
batches = 4
[output]
log_every = 5
)";

struct Mtp : TrainFixture {
    void SetUp() override { prepare("mtp_", kDeck, 5); }
    void compare(const std::string& model, const std::vector<std::pair<int, std::string>>& layouts,
                 double tol = 1e-5) {
        const auto names = compare_layouts(model, layouts, tol, 0.3);
        ASSERT_EQ(names.size(), layouts.size());
        const auto mref = metrics_column(dir / "ref", "/train/mtp_loss");
        ASSERT_EQ(mref.size(), 10u);
        EXPECT_LT(mref.back(), mref.front()) << "the MTP modules did not learn";
        for (size_t k = 0; k < names.size(); ++k) {
            const auto m = metrics_column(dir / names[k], "/train/mtp_loss");
            ASSERT_EQ(m.size(), mref.size()) << layouts[k].second;
            for (size_t i = 0; i < m.size(); ++i)
                EXPECT_LE(std::abs(m[i] - mref[i]), tol * std::abs(mref[i])) << model << " " << layouts[k].second
                                                                              << " mtp_loss " << i + 1;
        }
    }
};

TEST_F(Mtp, EveryLayoutMatchesOneRank) {
    compare("", {{2, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
                 {2, "--parallel.pp=2 --parallel.microbatches=8"},
                 {2, "--parallel.cp=2 --parallel.microbatches=8"},
                 {2, "--parallel.microbatches=4 --parallel.zero=1"}});
    // The modules' tensors under DeepSeek-V3's names: layers 2 and 3 of a 2-layer model.
    const auto t = checkpoint_tensors((dir / "ref/checkpoints/step_00000010.h5").string());
    int named = 0;
    for (const auto& [name, values] : t)
        for (const char* n : {"params/model.layers.2.eh_proj.weight", "params/model.layers.3.enorm.weight",
                              "params/model.layers.3.hnorm.weight", "params/model.layers.3.shared_head.norm.weight",
                              "params/model.layers.3.self_attn.q_proj.weight"})
            named += name == n;
    EXPECT_EQ(named, 5);
    // Generation runs the main model alone.
    const auto g = run_quintet(0, "generate --checkpoint " + (dir / "ref/checkpoints/step_00000010.h5").string() +
                                      " --prompt-ids '1 2 3' --tokens 4 --temperature 0 --print-ids");
    EXPECT_EQ(g.status, 0) << g.output;
}

TEST_F(Mtp, MlaMoeWithExpertParallelismMatchesOneRank) {
    compare("--model.attention=mla --model.n_kv_heads=0 --model.kv_lora_rank=16 --model.q_lora_rank=24 "
            "--model.qk_nope_dim=8 --model.qk_rope_dim=4 --model.v_head_dim=8 --moe.experts=4 --moe.top_k=2 "
            "--moe.ffn_dim=16 --moe.layers=1 --moe.scoring=sigmoid --moe.topk_method=noaux_tc --moe.groups=2 "
            "--moe.group_top_k=1 --moe.balance=aux_free --moe.bias_rate=0.01",
            {{2, "--parallel.ep=2 --parallel.microbatches=4"},
             {2, "--parallel.pp=2 --parallel.microbatches=8"},
             {2, "--parallel.microbatches=4 --parallel.zero=3"},
             {2, "--parallel.pp=2 --parallel.schedule=zb_h1 --parallel.microbatches=8"}});
}

// The layouts that shard the modules' parameters and gradients (ZeRO-2 and 3: each module is a
// unit) and that split their backward (zb_h1, and zbv, whose V puts the head and the modules on
// the first stage), at depths 2 and 1, one with ZeRO-3 under zb_h1 (pp2 x dp2). zbv needs
// n_layers a multiple of 2pp.
const std::vector<std::pair<int, std::string>> kShardedAndSplit = {
    {2, "--parallel.microbatches=4 --parallel.zero=2"},
    {2, "--parallel.microbatches=4 --parallel.zero=3"},
    {2, "--parallel.pp=2 --parallel.schedule=zb_h1 --parallel.microbatches=8"},
    {2, "--parallel.pp=2 --parallel.schedule=zbv --parallel.virtual_stages=2 --parallel.microbatches=8"},
};

TEST_F(Mtp, ZeroAndZeroBubbleSchedulesMatchOneRank) {
    auto layouts = kShardedAndSplit;
    layouts.push_back({4, "--parallel.pp=2 --parallel.schedule=zb_h1 --parallel.microbatches=4 --parallel.zero=3"});
    layouts.push_back({4, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=4 --parallel.zero=3"});
    compare("--model.n_layers=4", layouts);
    compare("--model.n_layers=4 --model.mtp_depth=1", kShardedAndSplit);
    // A tied head: the modules read the embedding's unit (one stage, zbv's V) or the last stage's
    // copy in unit "head" (pp2 x dp2).
    compare("--model.n_layers=4 --model.tie_embeddings=true",
            {kShardedAndSplit[1], kShardedAndSplit[3], {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=3"}});
}

// bf16: a layout changes fp32 summation orders, and a GEMM output that then rounds to the other
// bf16 neighbour differs by 2^-8 in that element, so layouts agree to bf16 noise.
TEST_F(Mtp, Bf16ZeroAndZeroBubbleMatchOneRank) {
    compare("--model.n_layers=4 --train.precision=bf16", {kShardedAndSplit[1], kShardedAndSplit[3]}, 1e-3);
}

// quintet generate --speculative mtp on models trained 30 steps on the synthetic data's chain
// x -> 7x + 3 (the modules draft well but not always: both acceptances and rejections happen): the
// printed ids are plain greedy decoding's, token for token, with depth 1 and 2, dense and MLA; a
// model without modules, sampling and an unknown mode are refused with exit 2 before any work.
TEST_F(Mtp, SpeculativeGenerationIsPlainGreedy) {
    const std::string mla = "--model.attention=mla --model.n_kv_heads=0 --model.kv_lora_rank=16 --model.q_lora_rank=24 "
                            "--model.qk_nope_dim=8 --model.qk_rope_dim=4 --model.v_head_dim=8";
    struct Case {
        std::string name, args;
    } cases[] = {{"d1", "--model.mtp_depth=1"}, {"d2", "--model.mtp_depth=2"}, {"mla2", "--model.mtp_depth=2 " + mla}};
    const std::string common = "--train.steps=30 --eval.every=0 --output.log_every=50 --checkpoint.every=0 ";
    for (const Case& c : cases) {
        const auto r = train(1, c.name, common + c.args);
        ASSERT_EQ(r.status, 0) << r.output;
        const std::string ckpt = (dir / c.name / "checkpoints/step_00000030.h5").string();
        const std::string gen = "generate --checkpoint " + ckpt + " --prompt-ids '5 38 10 73' --tokens 60 --temperature 0 --print-ids";
        const auto plain = run_quintet(0, gen);
        const auto spec = run_quintet(0, gen + " --speculative mtp");
        ASSERT_EQ(plain.status, 0) << plain.output;
        ASSERT_EQ(spec.status, 0) << spec.output;
        auto ids_line = [](const std::string& out) {  // the --print-ids line: the prompt's ids first
            const size_t at = out.find("\n5 38 10 73 ");
            return at == std::string::npos ? std::string() : out.substr(at + 1, out.find('\n', at + 1) - at - 1);
        };
        ASSERT_FALSE(ids_line(plain.output).empty()) << plain.output;
        EXPECT_EQ(ids_line(spec.output), ids_line(plain.output)) << c.name;
        const size_t at = spec.output.find("acceptance rate ");
        ASSERT_NE(at, std::string::npos) << spec.output;
        const double rate = std::stod(spec.output.substr(at + 16));
        const size_t line = spec.output.rfind("generate: speculative", at);
        std::printf("[ mtp ] %s: %s\n", c.name.c_str(), spec.output.substr(line, at + 21 - line).c_str());
        const long drafted = std::stol(spec.output.substr(spec.output.find("drafted ", line) + 8));
        const long accepted = std::stol(spec.output.substr(spec.output.find("accepted ", line) + 9));
        EXPECT_GT(rate, 0.15) << c.name << ": the modules' drafts are rarely accepted\n" << spec.output;
        EXPECT_LT(accepted, drafted) << c.name << ": no draft rejected: the trimming is not exercised";
    }
    // Refused before any work, exit 2, naming what to change.
    const std::string d1 = (dir / "d1/checkpoints/step_00000030.h5").string();
    auto r = run_quintet(0, "generate --checkpoint " + d1 + " --tokens 5 --temperature 0.8 --speculative mtp");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--temperature 0"), std::string::npos) << r.output;
    r = run_quintet(0, "generate --checkpoint " + d1 + " --tokens 5 --temperature 0 --speculative draft");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--speculative = 'draft'"), std::string::npos) << r.output;
    ASSERT_EQ(train(1, "plain", common + "--model.mtp_depth=0").status, 0);
    r = run_quintet(0, "generate --checkpoint " + (dir / "plain/checkpoints/step_00000030.h5").string() +
                           " --tokens 5 --temperature 0 --speculative mtp");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("has no MTP modules (model.mtp_depth = 0)"), std::string::npos) << r.output;
}

TEST_F(Mtp, TooShortSamplesNameTheKey) {
    const auto r = train(1, "bad", "--data.seq_len=2 --model.mtp_depth=2");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("model.mtp_depth"), std::string::npos) << r.output;
}

}  // namespace
