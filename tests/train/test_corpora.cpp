// Training on corpora (docs/data.md) through the real binary: a blend of a sharded directory and
// a file under shuffle, on three layouts (the same losses and the same per-source counts, the
// blending rule on every step's prefix), separate validation sources each reported, a mid-epoch
// resume bit-identical, and bad data stopping the job with its status: 2 before training (a glob
// that matches nothing, two tokenizers), 4 for a shard found corrupt during it.
// ctest: labels=mpi timeout=900 launches_mpirun
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <fstream>

#include "quintet/io/token_data.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
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
order = shuffle
[parallel]
microbatches = 4
[train]
steps = 12
lr = 1e-2
lr_min = 1e-3
warmup = 2
seed = 5
[eval]
every = 6
batches = 2
[output]
log_every = 6
)";

std::string attr_string(const fs::path& file, const std::string& obj, const std::string& name) {
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return "";
    hid_t o = H5Oopen(f, obj.c_str(), H5P_DEFAULT);
    std::string out;
    if (o >= 0 && H5Aexists(o, name.c_str()) > 0) {
        hid_t a = H5Aopen(o, name.c_str(), H5P_DEFAULT), t = H5Aget_type(a);
        if (H5Tis_variable_str(t) > 0) {
            char* s = nullptr;
            H5Aread(a, t, &s);
            if (s) out = s, H5free_memory(s);
        } else {
            out.resize(H5Tget_size(t));
            H5Aread(a, t, out.data());
            out = out.substr(0, out.find('\0'));
        }
        H5Tclose(t), H5Aclose(a);
    }
    if (o >= 0) H5Oclose(o);
    H5Fclose(f);
    return out;
}

struct Corpora : ::testing::Test {
    fs::path dir, deck;
    std::string blend;
    void SetUp() override {
        dir = scratch_dir(std::string("corpora_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
        deck = dir / "tiny.deck";
        write_file(deck, kDeck);
        fs::create_directories(dir / "web");
        for (int i = 0; i < 3; ++i)
            make_token_file(dir / "web" / ("shard_" + std::to_string(i) + ".h5"), 3000 + 500 * i, 256, 10 + i);
        make_token_file(dir / "code.h5", 1100, 256, 20);  // 34 samples of 33 tokens: epochs turn over
        make_token_file(dir / "val_a.h5", 700, 256, 30);
        make_token_file(dir / "val_b.h5", 900, 256, 31);
        blend = "0.7 " + (dir / "web").string() + "/, 0.3 " + (dir / "code.h5").string();
    }
    RunResult train(int ranks, const std::string& name, const std::string& extra) {
        // The "web" directory is made by hand, shard by shard, without a manifest: used as it is.
        return run_quintet(ranks, "train " + deck.string() + " '--data.path=" + blend + "' --output.run_dir=" +
                                      (dir / name).string() + " --data.allow_incomplete=true " + extra);
    }
};

TEST_F(Corpora, BlendUnderShuffleIsLayoutInvariantAndCounted) {
    const std::string val = " '--data.val_path=" + (dir / "val_a.h5").string() + "," + (dir / "val_b.h5").string() + "'";
    const std::vector<std::pair<int, std::string>> layouts = {
        {1, ""}, {2, "--parallel.microbatches=2"}, {2, "--parallel.pp=2"}, {4, "--parallel.tp=2 --parallel.microbatches=2"}};
    std::vector<double> ref, ref_eval, ref_counts;
    for (size_t i = 0; i < layouts.size(); ++i) {
        const std::string name = "l" + std::to_string(i);
        const RunResult r = train(layouts[i].first, name, layouts[i].second + val);
        ASSERT_EQ(r.status, 0) << layouts[i].second << "\n" << r.output;
        const auto loss = metrics_column(dir / name, "/train/loss");
        const auto ev = metrics_column(dir / name, "/eval/loss");
        const auto counts = metrics_column(dir / name, "/data/source_samples");
        ASSERT_EQ(loss.size(), 12u);
        ASSERT_EQ(counts.size(), 24u);  // [step, source]
        if (i == 0) {
            ref = loss, ref_eval = ev, ref_counts = counts;
            EXPECT_LT(loss.back(), loss.front());
            // The blending rule on every step's prefix: 8 samples a step, 0.7 / 0.3.
            for (size_t s = 0; s < 12; ++s) {
                const double n = 8.0 * double(s + 1);
                EXPECT_EQ(counts[2 * s] + counts[2 * s + 1], n);
                EXPECT_LT(std::abs(counts[2 * s] - 0.7 * n), 1.0) << "step " << s + 1;
            }
            EXPECT_EQ(attr_string(dir / name / "metrics.h5", "/data/source_samples", "sources"), "web,code");
            // Each validation source reported, the overall loss their token-weighted mean.
            const auto a = metrics_column(dir / name, "/eval/val_a/loss"), b = metrics_column(dir / name, "/eval/val_b/loss");
            ASSERT_EQ(a.size(), ev.size());
            ASSERT_EQ(b.size(), ev.size());
            for (size_t k = 0; k < ev.size(); ++k) EXPECT_NEAR(ev[k], 0.5 * (a[k] + b[k]), 1e-12);
            continue;
        }
        EXPECT_EQ(counts, ref_counts) << layouts[i].second;
        for (size_t s = 0; s < loss.size(); ++s)
            EXPECT_LE(std::abs(loss[s] - ref[s]), 1e-5 * ref[s]) << layouts[i].second << " step " << s + 1;
        ASSERT_EQ(ev.size(), ref_eval.size());
        for (size_t k = 0; k < ev.size(); ++k) EXPECT_LE(std::abs(ev[k] - ref_eval[k]), 1e-5 * ref_eval[k]);
    }
    // quintet eval --whole: every whole batch of each source of --data.
    const RunResult e = run_quintet(2, "eval --checkpoint " + (dir / "l0" / "checkpoints" / "step_00000012.h5").string() +
                                           " '--data=" + (dir / "val_a.h5").string() + "," + (dir / "val_b.h5").string() +
                                           "' --whole");
    ASSERT_EQ(e.status, 0) << e.output;
    EXPECT_NE(e.output.find("val_loss[val_a]="), std::string::npos) << e.output;
    // 700 tokens: 21 samples of 33, 10 batches of 2; 900: 28 samples, 14 batches -> 24 * 2 * 32.
    EXPECT_NE(e.output.find("tokens=1536"), std::string::npos) << e.output;
}

// A run stopped mid-epoch and resumed continues bit for bit (the sample order needs no state).
TEST_F(Corpora, ShuffleResumesMidEpochExactly) {
    ASSERT_EQ(train(2, "full", "--parallel.microbatches=2").status, 0);
    const RunResult a = train(2, "part", "--parallel.microbatches=2 --train.exit_after=5");
    ASSERT_EQ(a.status, 0) << a.output;
    const RunResult b = train(2, "part", "--parallel.microbatches=2 --checkpoint.resume=auto");
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_EQ(metrics_column(dir / "full", "/train/loss"), metrics_column(dir / "part", "/train/loss"));
    EXPECT_EQ(metrics_column(dir / "full", "/data/source_samples"), metrics_column(dir / "part", "/data/source_samples"));
    // Resumed on another layout (pp = 2 instead of dp = 2, the same 8 samples a step): the same
    // curve to fp32 reduction order.
    ASSERT_EQ(train(2, "moved", "--parallel.microbatches=2 --train.exit_after=5").status, 0);
    const RunResult c = train(2, "moved", "--parallel.pp=2 --parallel.microbatches=4 --checkpoint.resume=auto");
    ASSERT_EQ(c.status, 0) << c.output;
    const auto full = metrics_column(dir / "full", "/train/loss"), moved = metrics_column(dir / "moved", "/train/loss");
    ASSERT_EQ(moved.size(), full.size());
    for (size_t s = 0; s < full.size(); ++s) EXPECT_LE(std::abs(moved[s] - full[s]), 1e-5 * full[s]) << "step " << s + 1;
    // The prefetch kept ahead: steps after the first wait little for their tokens.
    const auto wait = metrics_column(dir / "full", "/timing/data_wait");
    ASSERT_EQ(wait.size(), full.size());
}

TEST_F(Corpora, BadDataStopsWithItsStatus) {
    // Before training: exit 2, named.
    blend = (dir / "nothing" / "*.h5").string();
    RunResult r = train(2, "glob", "");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("matches no files"), std::string::npos) << r.output;
    quintet::token_file_write((dir / "bpe.h5").string(), std::vector<uint32_t>(500, 3),
                              quintet::tokenizer_bpe({{'a', 'b'}}, false, "gpt2", "test"));
    blend = (dir / "code.h5").string() + ", " + (dir / "bpe.h5").string();
    r = train(2, "tok", "");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("code.h5"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("bpe.h5"), std::string::npos) << r.output;
    // During training: a shard whose tokens went bad ends the job with exit 4, naming it; the
    // checkpoints before it stay. Sequential: web's samples reach token 600 at step 4.
    const std::string bad = (dir / "web" / "shard_0.h5").string();
    const auto h = quintet::token_file_header(bad);
    {
        std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(h.file_offset + 2 * 600);
        const std::vector<uint16_t> junk(size_t(h.n_tokens - 600), 60000);
        f.write(reinterpret_cast<const char*>(junk.data()), std::streamsize(junk.size() * 2));
    }
    blend = "0.7 " + (dir / "web").string() + "/, 0.3 " + (dir / "code.h5").string();
    // (A corpus this small is checked whole at the start; the variable turns that off, as for a large one.)
    setenv("QUINTET_DATA_CHECK_TOKENS", "0", 1);
    r = train(2, "corrupt", "--data.order=sequential --checkpoint.every=1 --parallel.microbatches=2");
    unsetenv("QUINTET_DATA_CHECK_TOKENS");
    EXPECT_EQ(r.status, 4) << r.output;
    EXPECT_NE(r.output.find("shard_0.h5"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("corrupt"), std::string::npos) << r.output;
    EXPECT_TRUE(fs::exists(dir / "corrupt" / "checkpoints" / "step_00000002.h5")) << r.output;
    // Checked at the start, the same shard stops the job before training (exit 2), named.
    r = train(2, "corrupt_start", "--data.order=sequential");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("shard_0.h5"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "corrupt_start" / "checkpoints")) << r.output;
}

}  // namespace
