// `quintet data` (docs/data.md, "quintet data"): verify passes a fresh corpus and names an altered
// shard (exit 2); stats gives the samples per source that a real run's metrics record; inspect
// decodes the very tokens the trainer reads (sequential order: the file's tokens at N * T).
// ctest: labels=mpi timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "quintet/io/token_data.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

struct DataCmd : ::testing::Test {
    fs::path dir;
    void SetUp() override {
        dir = scratch_dir(std::string("data_cmd_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::mt19937 g(1);
        for (const char* name : {"prose", "code"}) {
            std::string text;
            for (int i = 0; i < 4000; ++i) text += std::string(name) + " line " + std::to_string(g() % 1000) + "\n";
            write_file(dir / (std::string(name) + ".txt"), text);
            const RunResult r = run_quintet(0, "prepare --input " + (dir / (std::string(name) + ".txt")).string() +
                                                   " --tokenizer byte --shard-tokens 9000 --output " + (dir / name).string());
            ASSERT_EQ(r.status, 0) << r.output;
        }
        write_file(dir / "t.deck", "[model]\nd_model = 16\nn_layers = 1\nn_heads = 2\nn_kv_heads = 2\nffn_dim = 32\n"
                                   "[data]\nseq_len = 16\nmicro_batch_size = 2\n[train]\nsteps = 6\n[output]\n"
                                   "log_every = 1\n");
    }
};

TEST_F(DataCmd, VerifyNamesAnAlteredShard) {
    RunResult r = run_quintet(0, "data verify " + (dir / "prose").string());
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("every checksum verified"), std::string::npos) << r.output;
    const fs::path shard = dir / "prose" / "shard_000001.h5";
    const auto h = quintet::token_file_header(shard.string());
    std::string bytes = read_file(shard);
    bytes[size_t(h.file_offset) + 10] ^= 0x02;
    write_file(shard, bytes);
    r = run_quintet(0, "data verify " + (dir / "code").string() + " " + (dir / "prose").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("shard_000001.h5': its tokens do not match the manifest's checksum"), std::string::npos)
        << r.output;
    r = run_quintet(0, "data verify " + dir.string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("no manifest.json"), std::string::npos) << r.output;
}

TEST_F(DataCmd, StatsAndInspectAreWhatTheTrainerDraws) {
    const std::string blend = " '--data.path=0.7 " + (dir / "prose").string() + "/, 0.3 " + (dir / "code").string() + "/'";
    const RunResult t = run_quintet(2, "train " + (dir / "t.deck").string() + blend + " --output.run_dir=" +
                                           (dir / "run").string() + " --parallel.microbatches=2");
    ASSERT_EQ(t.status, 0) << t.output;
    const auto counts = metrics_column(dir / "run", "/data/source_samples");  // [step, source]
    ASSERT_EQ(counts.size(), 12u);
    const RunResult s = run_quintet(0, "data stats " + (dir / "t.deck").string() + blend +
                                           " --world 2 --parallel.microbatches=2");
    ASSERT_EQ(s.status, 0) << s.output;
    // "prose   0.7000   <tokens>   <documents>   <samples>   <epochs>"
    for (const auto& [name, k] : {std::pair{"prose", 0}, std::pair{"code", 1}}) {
        std::istringstream in(s.output.substr(s.output.find(std::string("\n") + name) + 1));
        std::string n, docs;
        double w = 0, samples = 0;
        long long tokens = 0;
        in >> n >> w >> tokens >> docs >> samples;
        EXPECT_EQ(samples, counts[10 + size_t(k)]) << name << "\n" << s.output;
        EXPECT_EQ(docs, "1") << s.output;
    }
    // Sequential order, one source: sample N is the train split's tokens at N * T.
    const auto tokens = quintet::token_file_read((dir / "code" / "shard_000000.h5").string()).tokens;
    const RunResult i = run_quintet(0, "data inspect " + (dir / "t.deck").string() + " --data.path=" +
                                           (dir / "code").string() + " --data.order=sequential --sample 7 --ids");
    ASSERT_EQ(i.status, 0) << i.output;
    std::istringstream ids(i.output.substr(i.output.find('\n') + 1));
    for (size_t k = 0; k < 17; ++k) {
        uint32_t id = 0;
        ids >> id;
        EXPECT_EQ(id, tokens[7 * 16 + k]) << k;
    }
    EXPECT_NE(i.output.find("source code, offset 112"), std::string::npos) << i.output;
    // A step and rank: that rank's samples (2 microbatches of 2 on replica 1 of 2: j = 4 .. 7).
    const RunResult r = run_quintet(0, "data inspect " + (dir / "t.deck").string() + blend +
                                           " --parallel.microbatches=2 --step 3 --rank 1 --world 2");
    ASSERT_EQ(r.status, 0) << r.output;
    for (int j = 4; j < 8; ++j)
        EXPECT_NE(r.output.find("(step 3, j " + std::to_string(j) + ")"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("(step 3, j 3)"), std::string::npos) << r.output;
}

}  // namespace
