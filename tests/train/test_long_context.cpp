// The long-context workflow through the real binary (docs/long-context.md, "The contracts"):
// `quintet eval` on any layout
// and sequence length (the run's own eval loss reproduced, nothing written into the run folder,
// loss by position), `checkpoint.init_from` (weights only, across a layout and seq_len change,
// a fresh optimizer, resume winning, shape mismatches refused), and the trained context that
// travels with checkpoints (YaRN's original_max_position = 0, the warning past it).
// ctest: labels=mpi timeout=900 launches_mpirun
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstring>

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
val_fraction = 0.1
[train]
steps = 6
lr = 1e-2
lr_min = 1e-3
warmup = 2
seed = 3
peak_tflops = 0.1
[eval]
every = 6
batches = 3
[output]
log_every = 3
)";

struct LongContext : TrainFixture {
    void SetUp() override { prepare("lc_", kDeck, 4); }
    RunResult eval(int ranks, const std::string& ckpt, const std::string& extra) {
        return run_quintet(ranks, "eval --checkpoint " + ckpt + " --data " + data.string() + " " + extra);
    }
    static double val_loss(const std::string& out) {
        auto at = out.rfind("val_loss=");
        return at == std::string::npos ? NAN : std::stod(out.substr(at + 9));
    }
    static std::string last_line(const std::string& out) {
        std::string s = out;
        while (!s.empty() && s.back() == '\n') s.pop_back();
        return s.substr(s.rfind('\n') + 1);
    }
    static int64_t attr_i64(const std::string& file, const char* name) {
        hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t a = H5Aopen(f, name, H5P_DEFAULT);
        int64_t v = -1;
        H5Aread(a, H5T_NATIVE_INT64, &v);
        H5Aclose(a);
        H5Fclose(f);
        return v;
    }
};

TEST_F(LongContext, EvalReproducesTheRunsEvalOnAnyLayoutAndWritesNothing) {
    auto r = train(2, "run", "--parallel.microbatches=2");  // dp = 2
    ASSERT_EQ(r.status, 0) << r.output;
    const double run_eval = metrics_column(dir / "run", "/eval/loss").back();
    const std::string ck = (dir / "run/checkpoints/step_00000006.h5").string();
    std::vector<std::string> before;
    for (auto& e : fs::recursive_directory_iterator(dir / "run")) before.push_back(e.path().string());
    for (const auto& [ranks, layout] : std::vector<std::pair<int, std::string>>{
             {1, ""}, {2, "--parallel.tp=2"}, {4, "--parallel.cp=2 --parallel.pp=2"}, {2, "--parallel.cp=2"}}) {
        auto e = eval(ranks, ck, layout);
        ASSERT_EQ(e.status, 0) << layout << "\n" << e.output;
        EXPECT_NEAR(val_loss(e.output), run_eval, 1e-5 * run_eval) << layout;
        EXPECT_EQ(last_line(e.output).rfind("val_loss=", 0), 0u) << e.output;
        EXPECT_NE(e.output.find("seq_len=32 tokens=192"), std::string::npos) << e.output;
    }
    std::vector<std::string> after;
    for (auto& e : fs::recursive_directory_iterator(dir / "run")) after.push_back(e.path().string());
    EXPECT_EQ(before, after) << "quintet eval wrote into the run folder";
    // By position at twice the length: /loss_by_position [64], its mean the val loss; a warning
    // that 64 is past the trained context of 32 without a scaling rule.
    const std::string bp = (dir / "bp.h5").string();
    auto e = eval(1, ck, "--data.seq_len=64 --by-position " + bp);
    ASSERT_EQ(e.status, 0) << e.output;
    EXPECT_NE(e.output.find("past the context"), std::string::npos) << e.output;
    hid_t f = H5Fopen(bp.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t d = H5Dopen2(f, "/loss_by_position", H5P_DEFAULT);
    std::vector<double> v(64);
    ASSERT_GE(H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
    H5Dclose(d);
    H5Fclose(f);
    double mean = 0;
    for (double x : v) mean += x / 64;
    EXPECT_NEAR(mean, val_loss(e.output), 1e-6 * mean);
    // Bad input: no such checkpoint, an unknown key -- exit 2.
    EXPECT_EQ(eval(1, (dir / "nope.h5").string(), "").status, 2);
    auto bad = eval(1, ck, "--data.seq_lenn=64");
    EXPECT_EQ(bad.status, 2);
    EXPECT_NE(bad.output.find("seq_lenn"), std::string::npos) << bad.output;
}

// `quintet eval` reported tokens=16384 from a 3.8k-token split by wrapping around it. Each
// validation token is evaluated at most once: eval.batches past the split's whole batches is
// capped (a note names both numbers), tokens= is what was evaluated, and the loss is that of the
// whole batches; a split without one whole batch is refused. Training keeps its batches and warns.
TEST_F(LongContext, EvalCountsEachValidationTokenOnce) {
    // 20000 tokens, val_fraction 0.1: a split of 2000, so 62 samples of 33 tokens, 31 batches of 2.
    auto r = train(1, "run", "--eval.batches=100");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("warning: eval.batches = 100 batches of 2 x 32 tokens, but the validation split of"),
              std::string::npos) << r.output;
    EXPECT_NE(r.output.find("holds 31 whole batches: the samples past them wrap around"), std::string::npos) << r.output;
    const std::string ck = (dir / "run/checkpoints/step_00000006.h5").string();
    auto capped = eval(1, ck, "--eval.batches=100");
    ASSERT_EQ(capped.status, 0) << capped.output;
    EXPECT_NE(capped.output.find("quintet eval: note: eval.batches = 100 batches of 2 x 32 tokens"), std::string::npos)
        << capped.output;
    EXPECT_NE(capped.output.find("holds 31 whole batches: evaluating those 31 (each token once) instead of 100"),
              std::string::npos) << capped.output;
    EXPECT_NE(last_line(capped.output).find("seq_len=32 tokens=1984"), std::string::npos) << capped.output;
    auto exact = eval(2, ck, "--eval.batches=31");
    ASSERT_EQ(exact.status, 0) << exact.output;
    EXPECT_EQ(exact.output.find("note: eval.batches"), std::string::npos) << exact.output;
    EXPECT_NEAR(val_loss(capped.output), val_loss(exact.output), 1e-6 * val_loss(exact.output));
    // Longer samples: 3 of 513 tokens, one batch of 2.
    auto longer = eval(1, ck, "--data.seq_len=512 --eval.batches=5");
    ASSERT_EQ(longer.status, 0) << longer.output;
    EXPECT_NE(longer.output.find("holds 1 whole batch: evaluating those 1"), std::string::npos) << longer.output;
    EXPECT_NE(last_line(longer.output).find("seq_len=512 tokens=1024"), std::string::npos) << longer.output;
    // One sample of 1025 tokens: not a whole batch of 2.
    auto none = eval(1, ck, "--data.seq_len=1024 --eval.batches=2");
    EXPECT_EQ(none.status, 2) << none.output;
    EXPECT_NE(none.output.find("eval.batches = 2 batches of 2 x 1024 tokens, but the validation split of"),
              std::string::npos) << none.output;
    EXPECT_NE(none.output.find("holds 0 whole batches: it cannot be evaluated"), std::string::npos) << none.output;
}

// `quintet generate` warns, as train and eval do, when prompt + new tokens run past the context
// the weights were trained at without a scaling rule, or past what YaRN extends it to.
TEST_F(LongContext, GenerateWarnsPastTheTrainedContext) {
    auto r = train(1, "run", "");
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string ck = (dir / "run/checkpoints/step_00000006.h5").string();
    auto gen = [&](const std::string& ckpt, int tokens) {
        return run_quintet(0, "generate --checkpoint " + ckpt + " --prompt-ids '1 2 3 4' --temperature 0 --tokens " +
                                  std::to_string(tokens));
    };
    auto within = gen(ck, 28);  // 4 + 28 = 32 positions: the trained context
    ASSERT_EQ(within.status, 0) << within.output;
    EXPECT_EQ(within.output.find("warning"), std::string::npos) << within.output;
    auto past = gen(ck, 40);
    ASSERT_EQ(past.status, 0) << past.output;
    EXPECT_NE(past.output.find("generate: warning: the prompt (4 tokens) and --tokens 40 reach position 44, past the "
                               "context its weights were trained at (32) of checkpoint"), std::string::npos)
        << past.output;
    EXPECT_NE(past.output.find("rope.scaling = none"), std::string::npos) << past.output;
    // With YaRN (factor 2 over the 32 trained): 64 positions are within, 70 past.
    r = train(1, "yarn", "--checkpoint.init_from=" + ck + " --rope.scaling=yarn --rope.factor=2 --train.steps=1 --train.warmup=0");
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string yk = (dir / "yarn/checkpoints/step_00000001.h5").string();
    EXPECT_EQ(gen(yk, 60).output.find("warning: the prompt"), std::string::npos);
    auto far = gen(yk, 66);
    EXPECT_NE(far.output.find("reach position 70, past the context YaRN extends it to (64)"), std::string::npos)
        << far.output;
}

TEST_F(LongContext, InitFromLoadsWeightsOnlyAcrossLayoutAndSeqLen) {
    auto a = train(2, "short", "--parallel.microbatches=2");
    ASSERT_EQ(a.status, 0) << a.output;
    const std::string ck = (dir / "short/checkpoints/step_00000006.h5").string();
    // At step 0 of a tp2 run at seq_len 64 the weights are the short run's, bit for bit.
    auto b = train(2, "long0", "--parallel.tp=2 --data.seq_len=64 --train.steps=0 --checkpoint.init_from=" + ck);
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("initialised the weights from"), std::string::npos) << b.output;
    auto ta = checkpoint_tensors(ck), tb = checkpoint_tensors((dir / "long0/checkpoints/step_00000000.h5").string());
    ASSERT_EQ(ta.size(), tb.size());
    // (H5Ovisit names are relative: "params/...", "optim/...".)
    size_t compared = 0, moments = 0;
    for (size_t i = 0; i < ta.size(); ++i) {
        if (ta[i].first.rfind("params/", 0) != 0) continue;
        ++compared;
        EXPECT_EQ(0, std::memcmp(ta[i].second.data(), tb[i].second.data(), ta[i].second.size() * 4)) << ta[i].first;
    }
    EXPECT_EQ(compared, 3u + 2 * 9);  // embedding, lm_head, final norm; 9 tensors per layer
    // The optimizer is fresh: step-0 moments are zero.
    for (const auto& [name, v] : tb)
        if (name.rfind("optim/", 0) == 0) {
            ++moments;
            for (float x : v) ASSERT_EQ(x, 0.0f) << name;
        }
    EXPECT_GT(moments, 0u);
    EXPECT_EQ(attr_i64((dir / "long0/checkpoints/step_00000000.h5").string(), "trained_context"), 64);
    // YaRN with original_max_position = 0 takes the source's trained context (32).
    auto y = train(1, "yarn", "--data.seq_len=64 --rope.scaling=yarn --rope.factor=2 --train.steps=2 "
                              "--checkpoint.init_from=" + ck);
    ASSERT_EQ(y.status, 0) << y.output;
    EXPECT_NE(y.output.find("original_max_position = 32"), std::string::npos) << y.output;
    EXPECT_EQ(y.output.find("past the context"), std::string::npos) << y.output;
    // A second start in the same run_dir resumes (resume wins over init_from).
    auto y2 = train(1, "yarn", "--data.seq_len=64 --rope.scaling=yarn --rope.factor=2 --train.steps=3 "
                               "--checkpoint.init_from=" + ck);
    ASSERT_EQ(y2.status, 0) << y2.output;
    EXPECT_NE(y2.output.find("resumed from"), std::string::npos) << y2.output;
    EXPECT_EQ(y2.output.find("initialised the weights"), std::string::npos) << y2.output;
    // Another model shape is refused before any work.
    auto bad = train(1, "bad", "--model.d_model=48 --model.n_heads=4 --checkpoint.init_from=" + ck);
    EXPECT_EQ(bad.status, 2) << bad.output;
    EXPECT_NE(bad.output.find("shape"), std::string::npos) << bad.output;
}

TEST_F(LongContext, PasskeyTableAndCorpus) {
    auto r = train(1, "run", "--data.seq_len=96");
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string ck = (dir / "run/checkpoints/step_00000006.h5").string();
    const std::string out = (dir / "pk.h5").string();
    auto e = eval(2, ck, "--passkey 3 --passkey-lengths 96,128 --passkey-out " + out);
    ASSERT_EQ(e.status, 0) << e.output;
    EXPECT_NE(e.output.find("passkey length=96 retrieval="), std::string::npos) << e.output;
    EXPECT_NE(e.output.find("passkey length=128 retrieval="), std::string::npos) << e.output;
    EXPECT_EQ(last_line(e.output).rfind("val_loss=", 0), 0u) << e.output;
    hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    auto column = [&](const char* name) {
        hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
        std::vector<double> v(6, -1);
        EXPECT_GE(H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0) << name;
        H5Dclose(d);
        return v;
    };
    EXPECT_EQ(column("/passkey/length"), (std::vector<double>{96, 96, 96, 128, 128, 128}));
    EXPECT_EQ(column("/passkey/depth"), (std::vector<double>{0, 0.5, 1, 0, 0.5, 1}));
    for (double c : column("/passkey/correct")) EXPECT_TRUE(c == 0.0 || c == 1.0) << c;
    H5Fclose(f);
    // The training corpus: documents of exactly the length, each prompt ending in its key.
    const fs::path txt = dir / "corpus.txt";
    auto c = run_quintet(0, "eval --write-passkey-corpus " + txt.string() + " --passkey 11 --passkey-lengths 96");
    ASSERT_EQ(c.status, 0) << c.output;
    const std::string corpus = read_file(txt);
    ASSERT_EQ(corpus.size(), 11u * 96u);
    for (int i = 0; i < 11; ++i) {
        const std::string doc = corpus.substr(size_t(i) * 96, 96);
        EXPECT_EQ(doc.rfind("Remember the pass key. ", 0), 0u) << doc;
        const auto q = doc.find("What is the pass key? The pass key is <");
        ASSERT_NE(q, std::string::npos) << doc;
        std::string key = doc.substr(q + 39, 5);
        EXPECT_EQ(doc.size(), q + 39 + 5) << doc;  // the document ends with its key
        EXPECT_NE(doc.find("The pass key is <" + key + ">. "), std::string::npos) << doc;
    }
    // Too short for the prompt: a clear error naming the length.
    auto bad = eval(1, ck, "--passkey 2 --passkey-lengths 40");
    EXPECT_EQ(bad.status, 2) << bad.output;
    EXPECT_NE(bad.output.find("length 40"), std::string::npos) << bad.output;
}

}  // namespace
