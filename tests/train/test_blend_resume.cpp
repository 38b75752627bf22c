// A blend whose weights change on resume (docs/data.md, "Blends on resume"): the steps before the
// change are the unbroken run's, and after it every source continues from the sample it had
// reached -- its count never goes back -- while the new weights hold over the samples since the
// change to within one sample; the log says so and every run prints its blend.
// ctest: labels=mpi timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

TEST(BlendResume, ChangedWeightsContinueEachSource) {
    const fs::path dir = scratch_dir("blend_resume");
    for (const char* name : {"prose", "code"}) {
        std::string text;
        for (int i = 0; i < 3000; ++i) text += std::string(name) + " " + std::to_string(i * 7919 % 1000) + "\n";
        write_file(dir / (std::string(name) + ".txt"), text);
        ASSERT_EQ(run_quintet(0, "prepare --input " + (dir / (std::string(name) + ".txt")).string() +
                                     " --tokenizer byte --shard-tokens 20000 --output " + (dir / name).string()).status, 0);
    }
    write_file(dir / "t.deck", "[model]\nd_model = 16\nn_layers = 1\nn_heads = 2\nn_kv_heads = 2\nffn_dim = 32\n"
                               "[data]\nseq_len = 16\nmicro_batch_size = 2\norder = shuffle\n[train]\nsteps = 12\n"
                               "[parallel]\nmicrobatches = 2\n[checkpoint]\nevery = 6\n[output]\nlog_every = 1\n");
    auto train = [&](const std::string& run, const std::string& weights, const std::string& extra) {
        return run_quintet(2, "train " + (dir / "t.deck").string() + " '--data.path=" + weights.substr(0, 3) + " " +
                                  (dir / "prose").string() + "/, " + weights.substr(4) + " " + (dir / "code").string() +
                                  "/' --output.run_dir=" + (dir / run).string() + " " + extra);
    };
    RunResult r = train("unbroken", "0.7 0.3", "");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("data: 2 source(s), 12 steps x 8 samples"), std::string::npos) << r.output;
    r = train("changed", "0.7 0.3", "--train.exit_after=6");
    ASSERT_EQ(r.status, 0) << r.output;
    r = train("changed", "0.2 0.8", "");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("each source continues from the sample it had reached"), std::string::npos) << r.output;
    const auto a = metrics_column(dir / "unbroken", "/data/source_samples");
    const auto b = metrics_column(dir / "changed", "/data/source_samples");  // [step, source]
    ASSERT_EQ(a.size(), 24u);
    ASSERT_EQ(b.size(), 24u);
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(a[i], b[i]) << "before the change, row " << i / 2;
    for (size_t s = 6; s < 12; ++s)
        for (size_t k = 0; k < 2; ++k) EXPECT_GE(b[2 * s + k], b[2 * (s - 1) + k]) << "a count went back at step " << s + 1;
    // Since the change: 48 samples at 0.2 / 0.8, each within one sample.
    EXPECT_LE(std::abs((b[22] - b[10]) - 0.2 * 48), 1.0) << b[22] << " " << b[10];
    EXPECT_LE(std::abs((b[23] - b[11]) - 0.8 * 48), 1.0) << b[23] << " " << b[11];
    EXPECT_EQ(b[22] + b[23], 96);
    // `quintet data stats` on the run's deck gives the same counts: it reads the run's blend.
    const RunResult st = run_quintet(0, "data stats " + (dir / "t.deck").string() + " '--data.path=0.2 " +
                                            (dir / "prose").string() + "/, 0.8 " + (dir / "code").string() +
                                            "/' --output.run_dir=" + (dir / "changed").string() + " --world 2");
    ASSERT_EQ(st.status, 0) << st.output;
    EXPECT_NE(st.output.find("2 segment(s)"), std::string::npos) << st.output;
    for (const auto& [name, col] : {std::pair{"\nprose", 22}, std::pair{"\ncode", 23}}) {
        std::istringstream in(st.output.substr(st.output.find(name) + 1));
        std::string n, docs;
        double w = 0, samples = 0;
        long long tokens = 0;
        in >> n >> w >> tokens >> docs >> samples;
        EXPECT_EQ(samples, b[size_t(col)]) << n << "\n" << st.output;
    }
}
