// train.optimizer = muon through the real binary under mpirun (docs/parallelism.md "Muon"): every
// layout and ZeRO level against the single-rank run of the same deck -- dense (dp, tp with
// replicated kv heads, tp + SP, pp under 1F1B, interleaved, zb_h1 and zbv, cp, ZeRO-1/2/3 and
// their products) and MLA + MoE (ep, ep x tp + SP, ep x pp, ep x cp, ZeRO over edp) -- to fp32
// reduction order (relative 1e-5 over 10 steps), which a matrix orthogonalised per shard would
// miss by orders of magnitude; the first update of a matrix is the orthogonalised gradient
// (singular values in the iteration's band) on one rank, tp and ZeRO-3; step-0 checkpoints bit
// for bit; the momentum checkpointed whole under its Hugging Face name; resume bit for bit and
// across layouts; a change of optimizer refused (exit 2) or, allowed, reported with the new
// state at zero; bad input; the parameter groups decide which tensors Muon takes, and a group's
// learning-rate multiplier scales its matrices' step.
// ctest: labels=mpi timeout=1800 launches_mpirun
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

// test_layouts' model: 4 layers, 4 heads over 2 kv heads (tp = 4 replicates kv heads), T = 32;
// 16 samples per step on every layout.
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
optimizer = muon
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

const std::string kMoeMla =
    "--moe.experts=4 --moe.top_k=2 --moe.shared_experts=1 --moe.ffn_dim=32 --moe.aux_coef=0.01 "
    "--model.attention=mla --model.n_kv_heads=0 --model.kv_lora_rank=16 --model.q_lora_rank=24 --model.qk_nope_dim=8 "
    "--model.qk_rope_dim=4 --model.v_head_dim=8";

using Tensors = std::vector<std::pair<std::string, std::vector<float>>>;

const std::vector<float>* find(const Tensors& t, const std::string& name) {
    for (const auto& [n, v] : t)
        if (n == name) return &v;
    return nullptr;
}

// Eigenvalues of a symmetric n x n matrix (cyclic Jacobi).
std::vector<double> eigenvalues(std::vector<double> a, int n) {
    for (int sweep = 0; sweep < 100; ++sweep) {
        double off = 0;
        for (int p = 0; p < n; ++p)
            for (int q = p + 1; q < n; ++q) off += a[size_t(p * n + q)] * a[size_t(p * n + q)];
        if (off < 1e-30) break;
        for (int p = 0; p < n; ++p)
            for (int q = p + 1; q < n; ++q) {
                const double apq = a[size_t(p * n + q)];
                if (std::abs(apq) < 1e-300) continue;
                const double th = (a[size_t(q * n + q)] - a[size_t(p * n + p)]) / (2 * apq);
                const double t = (th >= 0 ? 1.0 : -1.0) / (std::abs(th) + std::sqrt(th * th + 1));
                const double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < n; ++k) {
                    const double x = a[size_t(k * n + p)], y = a[size_t(k * n + q)];
                    a[size_t(k * n + p)] = c * x - s * y, a[size_t(k * n + q)] = s * x + c * y;
                }
                for (int k = 0; k < n; ++k) {
                    const double x = a[size_t(p * n + k)], y = a[size_t(q * n + k)];
                    a[size_t(p * n + k)] = c * x - s * y, a[size_t(q * n + k)] = s * x + c * y;
                }
            }
    }
    std::vector<double> e(size_t(n), 0.0);
    for (int i = 0; i < n; ++i) e[size_t(i)] = a[size_t(i * n + i)];
    std::sort(e.begin(), e.end());
    return e;
}

// Singular values of d [rows, cols] (rows <= cols), ascending.
std::vector<double> singular_values(const std::vector<double>& d, int rows, int cols) {
    std::vector<double> g(size_t(rows * rows), 0.0);
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < rows; ++j)
            for (int k = 0; k < cols; ++k) g[size_t(i * rows + j)] += d[size_t(i * cols + k)] * d[size_t(j * cols + k)];
    std::vector<double> e = eigenvalues(g, rows);
    for (double& v : e) v = std::sqrt(std::max(v, 0.0));
    return e;
}

struct Muon : TrainFixture {
    void SetUp() override { prepare("muon_", kDeck, 3); }
    std::vector<double> col(const std::string& name, const char* what = "/train/loss") {
        return metrics_column(dir / name, what);
    }
    Tensors tensors(const std::string& run, int step) {
        char f[64];
        std::snprintf(f, sizeof f, "checkpoints/step_%08d.h5", step);
        return checkpoint_tensors((dir / run / f).string());
    }
    // The step-0 checkpoints of `layouts` (ranks, overrides of `model`), bit for bit the first's.
    void step_zero_identical(const std::string& prefix, const std::string& model,
                             const std::vector<std::pair<int, std::string>>& layouts) {
        std::vector<Tensors> all;
        int k = 0;
        for (const auto& [ranks, args] : layouts) {
            const std::string name = prefix + std::to_string(k++);
            auto r = train(ranks, name, "--train.steps=0 " + model + " " + args);
            ASSERT_EQ(r.status, 0) << r.output;
            all.push_back(tensors(name, 0));
        }
        for (size_t j = 1; j < all.size(); ++j) {
            ASSERT_EQ(all[j].size(), all[0].size()) << layouts[j].second;
            for (size_t i = 0; i < all[0].size(); ++i) {
                ASSERT_EQ(all[j][i].first, all[0][i].first);
                EXPECT_EQ(0, std::memcmp(all[j][i].second.data(), all[0][i].second.data(), all[0][i].second.size() * 4))
                    << all[0][i].first << " differs in " << layouts[j].second;
            }
        }
    }
};

TEST_F(Muon, DenseLayoutsAndZeroLevelsMatchOneRank) {
    const std::string zb = " --parallel.schedule=zb_h1", zv = " --parallel.schedule=zbv --parallel.virtual_stages=2";
    compare_layouts("", {
        {2, "--parallel.microbatches=4"},                                                    // dp2
        {4, "--parallel.microbatches=2"},                                                    // dp4
        {2, "--parallel.tp=2 --parallel.microbatches=8"},                                    // rows and columns split
        {4, "--parallel.tp=4 --parallel.microbatches=8"},                                    // kv heads replicated
        {4, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=4"},  // tp2 x dp2
        {2, "--parallel.pp=2 --parallel.microbatches=8"},
        {4, "--parallel.pp=2 --parallel.microbatches=8 --parallel.schedule=interleaved --parallel.virtual_stages=2 "
            "--parallel.tp=2"},
        {2, "--parallel.pp=2 --parallel.microbatches=8" + zb},
        {2, "--parallel.pp=2 --parallel.microbatches=8" + zv},
        {2, "--parallel.cp=2 --parallel.microbatches=8"},
        {2, "--parallel.microbatches=4 --parallel.zero=1"},
        {4, "--parallel.microbatches=2 --parallel.zero=1"},
        {2, "--parallel.microbatches=4 --parallel.zero=2"},
        {2, "--parallel.microbatches=4 --parallel.zero=3"},
        {4, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=4 --parallel.zero=3"},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=1"},
        {4, "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=2" + zb},
        {4, "--parallel.cp=2 --parallel.microbatches=4 --parallel.zero=3"},                 // dp2 x cp2
        {8, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=4 --parallel.zero=3" + zv},
    }, 1e-5, 0.3);
}

TEST_F(Muon, MlaAndMoeLayoutsMatchOneRank) {
    compare_layouts(kMoeMla, {
        {2, "--parallel.ep=2 --parallel.microbatches=4"},
        {4, "--parallel.ep=4 --parallel.microbatches=2"},
        {4, "--parallel.ep=2 --parallel.microbatches=2"},  // edp2
        {4, "--parallel.ep=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=4"},
        {4, "--parallel.ep=2 --parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=zbv --parallel.virtual_stages=2"},
        {2, "--parallel.ep=2 --parallel.cp=2 --parallel.microbatches=8"},
        {4, "--parallel.ep=2 --parallel.microbatches=2 --parallel.zero=1"},
        {4, "--parallel.ep=2 --parallel.microbatches=2 --parallel.zero=2"},
        {4, "--parallel.ep=2 --parallel.microbatches=2 --parallel.zero=3"},
        {8, "--parallel.ep=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=2 --parallel.zero=3"},
        {4, "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=4 --parallel.zero=2"},
    }, 1e-5, 0.3);
}

// The first step moves each matrix by -lr (0.2 sqrt(max(rows, cols)) X + wd W): X, recovered
// from the step-0 and step-1 weights, has the singular values of a matrix orthogonalised by five
// Newton-Schulz steps -- on one rank, with the matrix split over tp (rows for q_proj, columns for
// o_proj) and cut over ZeRO-3 slices.
TEST_F(Muon, TheFirstUpdateIsTheOrthogonalisedGradient) {
    const double wd = 0.1;  // train.weight_decay's default
    for (const auto& [ranks, args] : std::vector<std::pair<int, std::string>>{
             {1, "--parallel.microbatches=8"},
             {2, "--parallel.tp=2 --parallel.microbatches=8"},
             {2, "--parallel.microbatches=4 --parallel.zero=3"}}) {
        const std::string name = "first" + std::to_string(ranks) + (args.find("zero") != std::string::npos ? "z" : "");
        auto r = train(ranks, name, args + " --train.steps=1 --train.warmup=1 --eval.every=0");
        ASSERT_EQ(r.status, 0) << r.output;
        auto s1 = tensors(name, 1);
        auto r0 = train(ranks, name + "_0", args + " --train.steps=0");
        ASSERT_EQ(r0.status, 0) << r0.output;
        auto s0 = tensors(name + "_0", 0);
        const double lr0 = col(name, "/train/lr").at(0);  // train.lr: the warm-up's one step
        ASSERT_NEAR(lr0, 1e-2, 1e-12);
        // q_proj [32, 32] (row-split by tp) and o_proj [32, 32] (column-split), down [32, 64].
        for (const auto& [tensor, rows, cols] : std::vector<std::tuple<std::string, int, int>>{
                 {"model.layers.1.self_attn.q_proj.weight", 32, 32},
                 {"model.layers.2.self_attn.o_proj.weight", 32, 32},
                 {"model.layers.0.mlp.down_proj.weight", 32, 64}}) {
            const auto* w0 = find(s0, "params/" + tensor);
            const auto* w1 = find(s1, "params/" + tensor);
            ASSERT_TRUE(w0 && w1) << tensor;
            const double f = lr0 * 0.2 * std::sqrt(double(std::max(rows, cols)));
            std::vector<double> x(w0->size());
            for (size_t i = 0; i < x.size(); ++i)
                x[i] = (double((*w0)[i]) * (1 - lr0 * wd) - double((*w1)[i])) / f;
            const auto sv = singular_values(x, rows, cols);
            // The band of five steps for singular values of the normalised gradient above 0.01
            // (docs/math.md "Muon"); a gradient's tail below that maps lower, never above.
            // Five steps map every singular value of the normalised gradient in (0, 1] to at most
            // 1.2024 (at 0.0041), those above 0.01 into [0.682, 1.134] (docs/math.md "Muon"); a
            // gradient's weak directions (below 0.01) land lower. An AdamW step, sign-like,
            // has singular values up to several times that.
            EXPECT_LE(sv.back(), 1.21) << args << " " << tensor;
            size_t in_band = 0;
            for (double s : sv) in_band += s >= 0.68 && s <= 1.21;
            EXPECT_GE(in_band, sv.size() / 2) << args << " " << tensor;
        }
    }
}

// The parameter groups decide Muon's matrices: the start-up split is the groups table's (hidden and
// expert to Muon; embedding, head, norms and router to AdamW), and a group's learning-rate
// multiplier scales Muon's step of its matrices (decay included) while the AdamW tensors' steps
// stay bit for bit.
TEST_F(Muon, TheParameterGroupsDecideAndScaleMuonsMatrices) {
    auto r = train(1, "split", kMoeMla + " --train.steps=1 --train.warmup=1 --eval.every=0 --parallel.microbatches=8");
    ASSERT_EQ(r.status, 0) << r.output;
    auto group = [&](const std::string& g) -> std::pair<long, long> {  // tensors, elements of a group
        const size_t at = r.output.find("\n  " + g + " ");
        if (at == std::string::npos) return {0, 0};
        long n = 0, e = 0;
        std::sscanf(r.output.c_str() + at + 3 + g.size(), " %ld tensors %ld elements", &n, &e);
        return {n, e};
    };
    const auto hidden = group("hidden"), expert = group("expert");
    const long adamw = group("embedding").first + group("output").first + group("norm").first + group("router").first;
    ASSERT_GT(expert.first, 0) << r.output;
    ASSERT_GT(group("router").first, 0) << r.output;
    char want[160];
    std::snprintf(want, sizeof want, "optimizer: Muon for %ld matrices (%.4g M elements", hidden.first + expert.first,
                  double(hidden.second + expert.second) / 1e6);
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
    EXPECT_NE(r.output.find("AdamW for the other " + std::to_string(adamw) + " tensors"), std::string::npos)
        << r.output;

    const std::string one = "--train.steps=1 --train.warmup=1 --eval.every=0 --parallel.microbatches=8";
    ASSERT_EQ(train(1, "g0", "--train.steps=0").status, 0);
    ASSERT_EQ(train(1, "g1", one).status, 0);
    ASSERT_EQ(train(1, "gh", one + " --groups.hidden_lr=0.5").status, 0);
    const auto s0 = tensors("g0", 0), full = tensors("g1", 1), half = tensors("gh", 1);
    int scaled = 0, same = 0;
    for (const auto& [name, w1] : full) {
        if (name.rfind("params/", 0) != 0) continue;
        const auto *w0 = find(s0, name), *wh = find(half, name);
        ASSERT_TRUE(w0 && wh) << name;
        if (name.find("_proj") != std::string::npos) {  // a hidden matrix: Muon, at half the rate
            double big = 0, err = 0;
            for (size_t i = 0; i < w1.size(); ++i) {
                const double d1 = double(w1[i]) - (*w0)[i], dh = double((*wh)[i]) - (*w0)[i];
                big = std::max(big, std::abs(d1));
                err = std::max(err, std::abs(dh - 0.5 * d1));
            }
            ASSERT_GT(big, 0) << name;
            EXPECT_LE(err, 1e-4 * big) << name;  // the rounding of fp32 weights ~0.02 moved by ~1e-3
            ++scaled;
        } else {  // embedding, head, norms: AdamW, multiplier 1, the same gradient
            EXPECT_EQ(0, std::memcmp(w1.data(), wh->data(), w1.size() * 4)) << name;
            ++same;
        }
    }
    EXPECT_EQ(scaled, 28);  // 4 layers x (q, k, v, o, gate, up, down)
    EXPECT_GT(same, 3);
}

TEST_F(Muon, StepZeroCheckpointsAreBitIdenticalAndHoldTheMomentumWhole) {
    step_zero_identical("dense", "", {
        {1, "--parallel.microbatches=8"},
        {4, "--parallel.tp=4 --parallel.microbatches=8"},
        {4, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=8"},
        {4, "--parallel.tp=2 --parallel.microbatches=4 --parallel.zero=1"},
        {4, "--parallel.microbatches=2 --parallel.zero=3"},
    });
    step_zero_identical("moe", kMoeMla, {
        {1, "--parallel.microbatches=8"},
        {4, "--parallel.ep=4 --parallel.microbatches=2 --parallel.zero=2"},
        {4, "--parallel.ep=2 --parallel.tp=2 --parallel.sequence_parallel=true --parallel.microbatches=4"},
    });
    // After 10 steps: Muon's matrices have a momentum (whole, the Hugging Face shape) and no
    // AdamW moments; the embedding, head, norms and router have AdamW's moments and no momentum.
    auto r = train(4, "after", kMoeMla + " --parallel.ep=2 --parallel.tp=2 --parallel.sequence_parallel=true "
                                         "--parallel.microbatches=4 --parallel.zero=3");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("optimizer: Muon for 80 matrices"), std::string::npos) << r.output;
    const Tensors t = tensors("after", 10);
    std::map<std::string, int> count;
    for (const auto& [name, v] : t) {
        const std::string group = name.substr(0, name.find('/', name.find('/') + 1));
        count[name.rfind("params/", 0) == 0 ? "params" : group]++;
    }
    const std::string q = "model.layers.0.self_attn.q_b_proj.weight", e = "model.layers.1.mlp.experts.3.down_proj.weight";
    for (const std::string& m : {q, e, std::string("model.layers.2.mlp.shared_experts.up_proj.weight")}) {
        const auto* mom = find(t, "optim/momentum/" + m);
        ASSERT_TRUE(mom) << m;
        EXPECT_EQ(mom->size(), find(t, "params/" + m)->size()) << m;
        double ss = 0;
        for (float v : *mom) ss += double(v) * v;
        EXPECT_GT(ss, 0.0) << m;
        EXPECT_FALSE(find(t, "optim/exp_avg/" + m)) << m;
        EXPECT_FALSE(find(t, "optim/exp_avg_sq/" + m)) << m;
    }
    for (const std::string& a : {std::string("model.embed_tokens.weight"), std::string("lm_head.weight"),
                                 std::string("model.layers.1.mlp.gate.weight"), std::string("model.norm.weight")}) {
        EXPECT_TRUE(find(t, "optim/exp_avg/" + a)) << a;
        EXPECT_FALSE(find(t, "optim/momentum/" + a)) << a;
    }
    EXPECT_EQ(count["optim/momentum"], 80);
}

TEST_F(Muon, ResumeIsBitForBitAndMovesAcrossLayouts) {
    auto ref = train(1, "ref", "--parallel.microbatches=8");
    ASSERT_EQ(ref.status, 0) << ref.output;
    const auto lref = col("ref");
    ASSERT_EQ(lref.size(), 10u);
    // 5 + 5 steps on one rank: the unbroken curve, bit for bit (momentum included).
    auto a = train(1, "halves", "--parallel.microbatches=8 --train.exit_after=5");
    ASSERT_EQ(a.status, 0) << a.output;
    auto b = train(1, "halves", "--parallel.microbatches=8");
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_EQ(col("halves"), lref);
    EXPECT_EQ(col("halves", "/eval/loss"), col("ref", "/eval/loss"));
    struct Move {
        int from_ranks;
        std::string from;
        int to_ranks;
        std::string to;
    };
    const std::vector<Move> moves = {
        {4, "--parallel.tp=2 --parallel.microbatches=4", 2, "--parallel.microbatches=4 --parallel.zero=3"},
        {2, "--parallel.microbatches=4 --parallel.zero=2", 4, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=8"},
        {4, "--parallel.pp=4 --parallel.microbatches=8", 1, "--parallel.microbatches=8"},
        {4, "--parallel.microbatches=2 --parallel.zero=1", 2, "--parallel.cp=2 --parallel.microbatches=8"},
    };
    int k = 0;
    for (const auto& mv : moves) {
        const std::string name = "mv" + std::to_string(k++);
        auto x = train(mv.from_ranks, name, mv.from + " --train.exit_after=5");
        ASSERT_EQ(x.status, 0) << x.output;
        auto y = train(mv.to_ranks, name, mv.to);
        ASSERT_EQ(y.status, 0) << y.output;
        EXPECT_NE(y.output.find("resumed from"), std::string::npos) << y.output;
        expect_close(col(name), lref, 1e-5, mv.from + " -> " + mv.to);
    }
    // MLA + MoE: ep2 with ZeRO-1 over the experts, resumed at ep4 under ZeRO-3.
    auto mref = train(1, "mref", kMoeMla + " --parallel.microbatches=8");
    ASSERT_EQ(mref.status, 0) << mref.output;
    auto x = train(2, "mmv", kMoeMla + " --parallel.ep=2 --parallel.zero=1 --parallel.microbatches=4 --train.exit_after=5");
    ASSERT_EQ(x.status, 0) << x.output;
    auto y = train(4, "mmv", kMoeMla + " --parallel.ep=4 --parallel.zero=3 --parallel.microbatches=2");
    ASSERT_EQ(y.status, 0) << y.output;
    expect_close(col("mmv"), col("mref"), 1e-5, "MoE ep2 zero1 -> ep4 zero3");
}

// Another optimizer on resume: exit 2 naming the change before any work; allowed, the change is
// reported, the tensors that keep their optimizer keep their state, and the new state starts at
// zero: one step after an adamw -> muon resume, a matrix's momentum is that step's gradient
// alone, as an AdamW continuation of the same checkpoint shows (its first moment moved by
// (1 - beta1) of the same gradient), and the embedding's AdamW step is the AdamW run's, bit for bit.
TEST_F(Muon, ChangingTheOptimizerOnResumeIsRefusedOrStartsAtZero) {
    auto a = train(1, "adam", "--train.optimizer=adamw --parallel.microbatches=8 --train.exit_after=5");
    ASSERT_EQ(a.status, 0) << a.output;
    fs::copy(dir / "adam", dir / "adam_cont", fs::copy_options::recursive);
    fs::copy(dir / "adam", dir / "to_muon", fs::copy_options::recursive);
    auto refused = train(1, "to_muon", "--parallel.microbatches=8");
    EXPECT_EQ(refused.status, 2) << refused.output;
    for (const char* piece : {"train.optimizer = muon", "was trained with train.optimizer = adamw",
                              "checkpoint.allow_optimizer_change"})
        EXPECT_NE(refused.output.find(piece), std::string::npos) << piece << "\n" << refused.output;
    EXPECT_FALSE(fs::exists(dir / "to_muon/checkpoints/step_00000006.h5"));
    auto ok = train(1, "to_muon", "--parallel.microbatches=8 --train.steps=6 --checkpoint.allow_optimizer_change=true");
    ASSERT_EQ(ok.status, 0) << ok.output;
    EXPECT_NE(ok.output.find("train.optimizer: adamw -> muon (allowed by checkpoint.allow_optimizer_change"),
              std::string::npos) << ok.output;
    auto cont = train(1, "adam_cont", "--train.optimizer=adamw --parallel.microbatches=8 --train.steps=6");
    ASSERT_EQ(cont.status, 0) << cont.output;
    const Tensors m6 = tensors("to_muon", 6), a6 = tensors("adam_cont", 6), a5 = tensors("adam", 5);
    for (const std::string emb : {"params/model.embed_tokens.weight", "optim/exp_avg/model.embed_tokens.weight",
                                  "optim/exp_avg_sq/lm_head.weight"})
        EXPECT_EQ(*find(m6, emb), *find(a6, emb)) << emb;
    const std::string q = "model.layers.1.self_attn.q_proj.weight";
    const auto &mom = *find(m6, "optim/momentum/" + q), &e6 = *find(a6, "optim/exp_avg/" + q),
               &e5 = *find(a5, "optim/exp_avg/" + q);
    double most = 0, diff = 0;
    for (size_t i = 0; i < mom.size(); ++i) {
        const double g = (double(e6[i]) - 0.9 * double(e5[i])) / 0.1;  // m6 = 0.9 m5 + 0.1 g
        most = std::max(most, std::abs(g));
        diff = std::max(diff, std::abs(double(mom[i]) - g));
    }
    EXPECT_GT(most, 0.0);
    EXPECT_LE(diff, 1e-4 * most);
    // And back: muon -> adamw, allowed, reported; AdamW's moments of the matrices start at zero.
    auto back = train(1, "to_muon", "--train.optimizer=adamw --parallel.microbatches=8 --train.steps=7 "
                                    "--checkpoint.allow_optimizer_change=true");
    ASSERT_EQ(back.status, 0) << back.output;
    EXPECT_NE(back.output.find("train.optimizer: muon -> adamw"), std::string::npos) << back.output;
    const Tensors b7 = tensors("to_muon", 7);
    EXPECT_TRUE(find(b7, "optim/exp_avg/" + q));
    EXPECT_FALSE(find(b7, "optim/momentum/" + q));
}

TEST_F(Muon, BadInputNamesTheKey) {
    struct Bad {
        std::string args;
        std::vector<std::string> pieces;
    };
    const std::vector<Bad> bad = {
        {"--train.muon_ns_steps=0", {"train.muon_ns_steps", "'0'", "an integer in [1, 100]"}},
        {"--train.muon_momentum=1", {"train.muon_momentum", "'1'", "[0, 1)"}},
        {"--train.muon_momentum=-0.1", {"train.muon_momentum", "'-0.1'", "[0, 1)"}},
        {"--train.muon_scale=0", {"train.muon_scale", "'0'", "(0, 1000]"}},
        {"--train.optimizer=sgd", {"train.optimizer", "'sgd'", "adamw | muon"}},
        // Muon's keys with AdamW: every matrix would silently stay under AdamW.
        {"--train.optimizer=adamw --train.muon_momentum=0.9",
         {"train.muon_momentum", "train.optimizer = adamw puts every tensor under AdamW"}},
    };
    int k = 0;
    for (const auto& b : bad) {
        const std::string name = "bad" + std::to_string(k++);
        auto r = train(2, name, "--parallel.microbatches=4 " + b.args);
        EXPECT_EQ(r.status, 2) << b.args << "\n" << r.output;
        for (const auto& p : b.pieces) EXPECT_NE(r.output.find(p), std::string::npos) << p << "\n" << r.output;
        EXPECT_FALSE(fs::exists(dir / name / "checkpoints")) << b.args;
    }
    // The start-up line says what Muon took: 4 layers x (q, k, v, o, gate, up, down).
    auto ok = train(1, "ok", "--train.steps=1 --train.warmup=1 --parallel.microbatches=8");
    ASSERT_EQ(ok.status, 0) << ok.output;
    EXPECT_NE(ok.output.find("optimizer: Muon for 28 matrices"), std::string::npos) << ok.output;
}

}  // namespace
