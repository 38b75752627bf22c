// Multi-head Latent Attention through the real binary under mpirun (docs/math.md §7.2): every
// layout -- tp2, tp2+SP, pp2, dp2+ZeRO-1, cp2 with both ways of moving K/V (ring, latent),
// tp2 x cp2, with and without document masks -- against the single-rank run of the same deck
// (loss and eval curves to fp32 reduction order, 1e-5); bf16 on the same layouts; step-0
// checkpoints bit-identical; a tp2 x cp2 checkpoint resuming on one rank; the latent mode's
// bytes against the theory and against the ring's; bad MLA input.
// ctest: labels=mpi timeout=1500 launches_mpirun
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

// d_model 32 is not n_heads * any head dim here: MLA's dims are its own. T = 32: cp2 chunks of 8.
const char* kDeck = R"([model]
d_model = 32
n_layers = 4
n_heads = 4
attention = mla
kv_lora_rank = 8
q_lora_rank = 12
qk_nope_dim = 6
qk_rope_dim = 4
v_head_dim = 8
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

struct Mla : TrainFixture {
    void SetUp() override {
        prepare("mla_", kDeck, 5);
        make_document_token_file(data, 20000, kEos, 9);  // as in test_context_parallel
    }
    std::vector<double> col(const std::string& name, const char* what = "/train/loss") {
        return metrics_column(dir / name, what);
    }
    void compare(const std::string& model, const std::vector<std::pair<int, std::string>>& layouts,
                 double tol = 1e-5) {
        compare_layouts(model, layouts, tol, 0.3);
    }
};

const std::vector<std::pair<int, std::string>> kLayouts = {
    {2, "--parallel.tp=2 --parallel.microbatches=8"},
    {2, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8"},
    {2, "--parallel.pp=2 --parallel.microbatches=8"},
    {2, "--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=interleaved --parallel.virtual_stages=2"},
    {2, "--parallel.microbatches=4 --parallel.zero=1"},  // dp = 2
    {2, "--parallel.cp=2 --parallel.microbatches=8 --parallel.cp_mla_kv=ring"},
    {2, "--parallel.cp=2 --parallel.microbatches=8 --parallel.cp_mla_kv=latent"},
    {4, "--parallel.cp=4 --parallel.microbatches=8 --parallel.cp_mla_kv=latent"},
    {4, "--parallel.cp=2 --parallel.tp=2 --parallel.microbatches=8 --parallel.cp_mla_kv=ring"},
    {4, "--parallel.cp=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=8 "
        "--parallel.cp_mla_kv=latent"},
    {4, "--parallel.cp=2 --parallel.pp=2 --parallel.microbatches=8 --parallel.cp_mla_kv=latent"},
};

TEST_F(Mla, EveryLayoutMatchesOneRank) { compare("", kLayouts); }

TEST_F(Mla, EveryLayoutMatchesOneRankWithDocumentMasksAndYarn) {
    compare("--data.document_mask=true --rope.scaling=yarn --rope.factor=4 --rope.original_max_position=8",
            {kLayouts[1], kLayouts[5], kLayouts[6], kLayouts[9]});
}

TEST_F(Mla, WithoutQueryCompression) {
    compare("--model.q_lora_rank=0", {kLayouts[0], kLayouts[6], kLayouts[8]});
}

// bf16 GEMM operands: each layout follows the single-rank bf16 run (rounding of the operands is
// layout-invariant; only fp32 sums reorder, then bf16 rounding of those can flip a last bit).
TEST_F(Mla, Bf16LayoutsFollowOneRank) {
    compare("--train.precision=bf16", {kLayouts[1], kLayouts[6], kLayouts[9]}, 2e-3);
}

TEST_F(Mla, StepZeroCheckpointsAreBitIdenticalAndTp2Cp2ResumesOnOneRank) {
    auto a = train(1, "s0a", "--train.steps=0");
    auto b = train(4, "s0b", "--train.steps=0 --parallel.cp=2 --parallel.tp=2");
    auto c = train(2, "s0c", "--train.steps=0 --parallel.pp=2");
    ASSERT_EQ(a.status, 0) << a.output;
    ASSERT_EQ(b.status, 0) << b.output;
    ASSERT_EQ(c.status, 0) << c.output;
    auto ta = checkpoint_tensors((dir / "s0a/checkpoints/step_00000000.h5").string());
    for (const char* other : {"s0b", "s0c"}) {
        auto tb = checkpoint_tensors((dir / other / "checkpoints/step_00000000.h5").string());
        ASSERT_EQ(ta.size(), tb.size());
        for (size_t i = 0; i < ta.size(); ++i) {
            ASSERT_EQ(ta[i].first, tb[i].first);
            EXPECT_EQ(0, std::memcmp(ta[i].second.data(), tb[i].second.data(), ta[i].second.size() * 4))
                << other << " " << ta[i].first;
        }
    }
    // Hugging Face DeepSeek-V2 names.
    std::vector<std::string> names;
    for (const auto& t : ta) names.push_back(t.first);
    for (const char* n : {"params/model.layers.0.self_attn.q_a_proj.weight",
                          "params/model.layers.0.self_attn.q_a_layernorm.weight",
                          "params/model.layers.0.self_attn.q_b_proj.weight",
                          "params/model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                          "params/model.layers.0.self_attn.kv_a_layernorm.weight",
                          "params/model.layers.0.self_attn.kv_b_proj.weight",
                          "params/model.layers.3.self_attn.o_proj.weight"})
        EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
    // tp2 x cp2 (latent) for 5 steps, then one rank: the unbroken single-rank curve.
    auto ref = train(1, "ref", "--parallel.microbatches=8");
    ASSERT_EQ(ref.status, 0) << ref.output;
    auto first = train(4, "mv", "--parallel.cp=2 --parallel.tp=2 --parallel.cp_mla_kv=latent "
                                "--parallel.microbatches=8 --train.exit_after=5");
    ASSERT_EQ(first.status, 0) << first.output;
    auto second = train(1, "mv", "--parallel.microbatches=8");
    ASSERT_EQ(second.status, 0) << second.output;
    EXPECT_NE(second.output.find("resumed from"), std::string::npos);
    auto lref = col("ref"), l = col("mv");
    ASSERT_EQ(l.size(), 10u);
    for (size_t i = 5; i < 10; ++i) EXPECT_LE(std::abs(l[i] - lref[i]), 1e-5 * lref[i]) << "step " << i + 1;
}

// Bytes per step (docs/math.md §7): the latent mode all-gathers (cp-1) * N * (kv_lora_rank +
// qk_rope_dim) floats per layer and microbatch forward and reduce-scatters as many backward; the
// ring moves 3 (cp-1) blocks of N * n_heads * (nope + rope + v) floats.
TEST_F(Mla, LatentModeMovesTheTheorysBytes) {
    auto ring = train(2, "ring", "--parallel.cp=2 --parallel.microbatches=8 --parallel.cp_mla_kv=ring");
    auto lat = train(2, "lat", "--parallel.cp=2 --parallel.microbatches=8 --parallel.cp_mla_kv=latent");
    ASSERT_EQ(ring.status, 0) << ring.output;
    ASSERT_EQ(lat.status, 0) << lat.output;
    const double N = 2 * 16;  // B * T/cp rows on a rank
    const double per_lat = 2.0 * 1 * N * (8 + 4) * 4;
    const double per_ring = 3.0 * 1 * N * 4 * (6 + 4 + 8) * 4;
    for (double b : col("lat", "/timing/cp_bytes")) EXPECT_EQ(b, 4 * 8 * per_lat);
    for (double b : col("ring", "/timing/cp_bytes")) EXPECT_EQ(b, 4 * 8 * per_ring);
}

TEST_F(Mla, BadInputNamesTheKey) {
    struct Case {
        int ranks;
        std::string args, key;
    };
    const std::vector<Case> cases = {
        {1, "--model.qk_rope_dim=5", "model.qk_rope_dim"},
        {1, "--model.kv_lora_rank=0", "model.kv_lora_rank"},
        {1, "--model.v_head_dim=0", "model.v_head_dim"},
        {1, "--model.n_kv_heads=2", "model.n_kv_heads"},
        {1, "--model.attention=mha --model.n_kv_heads=2", "model.kv_lora_rank"},  // MLA keys with mha
        {1, "--model.attention=mha --model.kv_lora_rank=0 --model.q_lora_rank=0 --model.qk_nope_dim=0 "
            "--model.qk_rope_dim=0 --model.v_head_dim=0 --parallel.cp_mla_kv=latent",
         "parallel.cp_mla_kv"},
        {1, "--parallel.cp_mla_kv=gather", "parallel.cp_mla_kv"},
        {3, "--parallel.tp=3", "model.n_heads"},
    };
    int k = 0;
    for (const auto& c : cases) {
        auto r = train(c.ranks, "bad" + std::to_string(k++), c.args);
        EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
        EXPECT_NE(r.output.find(c.key), std::string::npos) << c.args << "\n" << r.output;
        EXPECT_FALSE(fs::exists(dir / ("bad" + std::to_string(k - 1)) / "checkpoints")) << c.args;
    }
}

}  // namespace
