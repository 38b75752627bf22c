// DeepSeek-V3's multi-token prediction through the real binary under mpirun (docs/math.md §11):
// model.mtp_depth = 2 on tp2+SP, pp2, cp2, dp2 with ZeRO-1 and an MLA + MoE model with ep2 against the
// single-rank run of the same deck -- the loss (main + mtp_weight/D x the modules'), the modules'
// own /train/mtp_loss and the eval curve to fp32 reduction order; the modules' tensors in the
// checkpoint under DeepSeek-V3's names (the layers after the last decoder layer); generation
// ignores them; the layouts MTP does not run on are refused naming the key.
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
    void compare(const std::string& model, const std::vector<std::pair<int, std::string>>& layouts) {
        const auto names = compare_layouts(model, layouts, 1e-5, 0.3);
        ASSERT_EQ(names.size(), layouts.size());
        const auto mref = metrics_column(dir / "ref", "/train/mtp_loss");
        ASSERT_EQ(mref.size(), 10u);
        EXPECT_LT(mref.back(), mref.front()) << "the MTP modules did not learn";
        for (size_t k = 0; k < names.size(); ++k) {
            const auto m = metrics_column(dir / names[k], "/train/mtp_loss");
            ASSERT_EQ(m.size(), mref.size()) << layouts[k].second;
            for (size_t i = 0; i < m.size(); ++i)
                EXPECT_LE(std::abs(m[i] - mref[i]), 1e-5 * std::abs(mref[i])) << model << " " << layouts[k].second
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
             {2, "--parallel.pp=2 --parallel.microbatches=8"}});
}

TEST_F(Mtp, UnsupportedLayoutsNameTheKey) {
    struct Case {
        int ranks;
        std::string args, key;
    } cases[] = {
        {2, "--parallel.zero=2 --parallel.microbatches=4", "parallel.zero"},
        {2, "--parallel.pp=2 --parallel.schedule=zb_h1 --parallel.microbatches=4", "parallel.schedule"},
        {1, "--data.seq_len=2 --model.mtp_depth=2", "model.mtp_depth"},
    };
    int k = 0;
    for (const auto& c : cases) {
        const auto r = train(c.ranks, "bad" + std::to_string(k++), c.args);
        EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
        EXPECT_NE(r.output.find(c.key), std::string::npos) << c.args << "\n" << r.output;
    }
}

}  // namespace
