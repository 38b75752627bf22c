// Passkey retrieval after training the synthetic task (inputs/passkey_task.deck, docs/long-context.md):
// a tiny byte-level model trained at T = 128 on documents with a 5-digit key hidden at depths
// 0 .. 1 must retrieve held-out keys (another seed) exactly, greedily, at least 90% of the time
// at T. What plain RoPE and YaRN (factor 4) keep at 4T is printed (docs/long-context.md records
// it); it is not asserted. Minutes of training on 2 cores: label slow (scripts/test.sh --all).
// ctest: labels=slow timeout=3600 launches_mpirun
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

double retrieval(const std::string& out, int length) {
    const std::string tag = "passkey length=" + std::to_string(length) + " retrieval=";
    const auto at = out.find(tag);
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + tag.size()));
}

TEST(Passkey, TinyModelRetrievesAtItsTrainedLength) {
    const fs::path dir = scratch_dir("passkey");
    const std::string txt = (dir / "passkey.txt").string(), data = (dir / "passkey.h5").string();
    auto c = run_quintet(0, "eval --write-passkey-corpus " + txt + " --passkey 8000 --passkey-lengths 128");
    ASSERT_EQ(c.status, 0) << c.output;
    auto p = run_quintet(0, "prepare --input " + txt + " --tokenizer byte --output " + data);
    ASSERT_EQ(p.status, 0) << p.output;
    const std::string run = (dir / "run").string();
    auto t = run_quintet(2, "train " + std::string(QUINTET_SOURCE_DIR) + "/inputs/passkey_task.deck --data.path=" +
                                data + " --output.run_dir=" + run);  // dp 2 x 16 samples
    ASSERT_EQ(t.status, 0) << t.output;
    const auto loss = metrics_column(run, "/train/loss");
    ASSERT_EQ(loss.size(), 4000u);
    std::printf("passkey training: loss %.4f at step 1, %.4f at step 4000\n", loss.front(), loss.back());
    const std::string ck = run + "/checkpoints/step_00004000.h5";
    auto at_t = run_quintet(1, "eval --checkpoint " + ck + " --data " + data +
                                   " --eval.batches=4 --passkey 50 --passkey-out " + (dir / "t.h5").string());
    ASSERT_EQ(at_t.status, 0) << at_t.output;
    std::printf("%s", at_t.output.c_str());
    EXPECT_GE(retrieval(at_t.output, 128), 0.9) << at_t.output;
    // 4T: plain RoPE (past the trained context), and YaRN x4 over the trained 128.
    for (const char* rope : {"", "--rope.scaling=yarn --rope.factor=4 --rope.original_max_position=128"}) {
        auto e = run_quintet(1, "eval --checkpoint " + ck + " --data " + data +
                                    " --eval.batches=1 --data.seq_len=512 --passkey 50 --passkey-lengths 512 " + rope);
        ASSERT_EQ(e.status, 0) << e.output;
        std::printf("at 512 with %s: retrieval %.3f\n", *rope ? "YaRN x4" : "plain RoPE", retrieval(e.output, 512));
        EXPECT_GE(retrieval(e.output, 512), 0.0) << e.output;
    }
}

}  // namespace
