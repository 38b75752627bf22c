// `quintet prepare` at corpus scale (docs/data.md): a directory of JSON Lines (one gzip-compressed,
// one in a subdirectory) into shards whose tokens do not depend on the number of ranks, nor on
// large files being cut into units of work (QUINTET_PREPARE_UNIT_BYTES makes them small); plain
// text the same tokens in corpus mode as in the one-file mode; a malformed line named by file and
// line with exit status 2 and no shard left behind; a directory that already holds shards refused.
// ctest: labels=mpi timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "quintet/io/token_data.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

std::vector<std::string> words() {
    return {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "then", "some", "more",
            "words", "with", "\"quotes\"", "tabs\tand", "unicode é ü", "lines\nbreaks"};
}

std::string document(std::mt19937& g) {
    const auto w = words();
    std::string s;
    for (int i = 0, n = 5 + int(g() % 60); i < n; ++i) s += (i ? " " : "") + w[g() % w.size()];
    return s;
}

std::string json_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\', o += c;
        else if (c == '\n') o += "\\n";
        else if (c == '\t') o += "\\t";
        else o += c;
    }
    return o;
}

std::vector<uint32_t> all_tokens(const fs::path& dir) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".h5" && e.path().filename() != "tokenizer.h5") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::vector<uint32_t> out;
    for (const auto& f : files) {
        const auto t = quintet::token_file_read(f.string()).tokens;
        out.insert(out.end(), t.begin(), t.end());
    }
    return out;
}

struct PrepareCorpus : ::testing::Test {
    fs::path dir;
    void SetUp() override {
        dir = scratch_dir(std::string("prepare_corpus_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir / "in" / "sub");
        std::mt19937 g(3);
        for (const char* name : {"in/a.jsonl", "in/b.jsonl", "in/sub/c.jsonl"}) {
            std::string text;
            for (int d = 0; d < 150; ++d) text += "{\"id\": " + std::to_string(d) + ", \"text\": \"" + json_escape(document(g)) + "\"}\n";
            write_file(dir / name, text);
        }
        ASSERT_EQ(run_shell("gzip " + (dir / "in" / "b.jsonl").string()).status, 0);
    }
};

TEST_F(PrepareCorpus, ShardsDoNotDependOnRanks) {
    const std::string common = " --jsonl-key text --tokenizer bpe --vocab-size 300 --shard-tokens 5000";
    std::vector<uint32_t> ref;
    std::vector<std::string> names;
    for (int ranks : {1, 2, 3}) {
        const std::string out = (dir / ("out" + std::to_string(ranks))).string();
        if (ranks == 3) setenv("QUINTET_PREPARE_UNIT_BYTES", "4096", 1);  // each file in several units
        const RunResult r = run_quintet(ranks, "prepare --input " + (dir / "in").string() + common + " --output " + out);
        unsetenv("QUINTET_PREPARE_UNIT_BYTES");
        ASSERT_EQ(r.status, 0) << r.output;
        EXPECT_NE(r.output.find("450 document(s)"), std::string::npos) << r.output;
        std::vector<std::string> here;
        for (const auto& e : fs::directory_iterator(out)) here.push_back(e.path().filename().string());
        std::sort(here.begin(), here.end());
        const auto t = all_tokens(out);
        if (ranks == 1) {
            ref = t, names = here;
            EXPECT_GT(names.size(), 3u);
            EXPECT_EQ(quintet::token_file_info(out + "/shard_000000.h5").n_tokens, 5000);
            EXPECT_TRUE(std::count(names.begin(), names.end(), "manifest.json")) << "no manifest";
            continue;
        }
        EXPECT_EQ(here, names) << ranks << " ranks";  // no temporary files left either
        EXPECT_EQ(t, ref) << ranks << " ranks";
    }
    // The same inputs named by globs, in the same order, give the same tokens.
    const std::string out = (dir / "glob").string();
    const RunResult r = run_quintet(2, "prepare --input '" + (dir / "in" / "*.jsonl*").string() + "' --input '" +
                                           (dir / "in" / "sub" / "*").string() + "'" + common + " --output " + out);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(all_tokens(out), ref);
    // An output directory that already holds shards is refused.
    const RunResult again = run_quintet(0, "prepare --input " + (dir / "in").string() + common + " --output " + out);
    EXPECT_EQ(again.status, 2) << again.output;
    EXPECT_NE(again.output.find("already holds a complete corpus"), std::string::npos) << again.output;
}

TEST_F(PrepareCorpus, PlainTextAsInOneFileMode) {
    std::mt19937 g(5);
    std::string text;
    while (text.size() < (size_t(9) << 20)) text += document(g) + "\nAnd " + document(g) + "\n";  // past one 8 MB part
    write_file(dir / "big.txt", text);
    const RunResult a = run_quintet(0, "prepare --input " + (dir / "big.txt").string() +
                                           " --tokenizer bpe --vocab-size 300 --output " + (dir / "one.h5").string());
    ASSERT_EQ(a.status, 0) << a.output;
    const RunResult b = run_quintet(2, "prepare --input " + (dir / "big.txt").string() +
                                           " --tokenizer bpe --vocab-size 300 --shard-tokens 1000000 --output " +
                                           (dir / "shards").string());
    ASSERT_EQ(b.status, 0) << b.output;
    const auto one = quintet::token_file_read((dir / "one.h5").string()).tokens;
    EXPECT_EQ(all_tokens(dir / "shards"), one);
    // The one file cut into units of 1 MB shared by 3 ranks: the same ids (with an end-of-text
    // token after the one document only when asked, so none here).
    setenv("QUINTET_PREPARE_UNIT_BYTES", "1000000", 1);
    const RunResult c = run_quintet(3, "prepare --input " + (dir / "big.txt").string() +
                                           " --tokenizer bpe --vocab-size 300 --shard-tokens 1000000 --output " +
                                           (dir / "units").string());
    unsetenv("QUINTET_PREPARE_UNIT_BYTES");
    ASSERT_EQ(c.status, 0) << c.output;
    EXPECT_EQ(all_tokens(dir / "units"), one);
}

TEST_F(PrepareCorpus, MalformedLineIsNamed) {
    write_file(dir / "in" / "sub" / "d.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"fine\"}\n{\"text\": 3}\n");
    const std::string out = (dir / "bad").string();
    RunResult r = run_quintet(2, "prepare --input " + (dir / "in").string() +
                                     " --jsonl-key text --tokenizer byte --shard-tokens 5000 --output " + out);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("d.jsonl' line 3"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("\"text\""), std::string::npos) << r.output;
    for (const auto& e : fs::recursive_directory_iterator(out)) ADD_FAILURE() << "left behind: " << e.path();
    write_file(dir / "in" / "sub" / "d.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"fine\"}\n{\"text\": \"broken\n");
    setenv("QUINTET_PREPARE_UNIT_BYTES", "20", 1);  // the bad line in the file's third unit: still line 3
    r = run_quintet(2, "prepare --input " + (dir / "in").string() +
                           " --jsonl-key text --tokenizer byte --shard-tokens 5000 --output " + out);
    unsetenv("QUINTET_PREPARE_UNIT_BYTES");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("d.jsonl' line 3: not JSON"), std::string::npos) << r.output;
    r = run_quintet(0, "prepare --input '" + (dir / "nothing" / "*.jsonl").string() +
                           "' --jsonl-key text --tokenizer byte --output " + (dir / "x.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("matches no files"), std::string::npos) << r.output;
}

}  // namespace

namespace {

// Under mpirun each rank encodes on its share of the node's cores (not every core each), unless
// told: OMP_NUM_THREADS or --threads.
TEST_F(PrepareCorpus, RanksUseTheirShareOfTheCores) {
    const int cores = int(std::thread::hardware_concurrency());
    const std::string base = std::string("env -u OMP_NUM_THREADS ") + QUINTET_MPIEXEC +
                             " --oversubscribe --allow-run-as-root --bind-to none -n 2 " + QUINTET_BINARY +
                             " prepare --input " + (dir / "in").string() + " --jsonl-key text --tokenizer byte " +
                             "--shard-tokens 5000 --output ";
    RunResult r = run_shell(base + (dir / "share").string());
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("2 rank(s) x " + std::to_string(std::max(1, cores / 2)) + " thread(s)"), std::string::npos)
        << r.output;
    r = run_shell(base + (dir / "three").string() + " --threads 3");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("2 rank(s) x 3 thread(s)"), std::string::npos) << r.output;
}

}  // namespace
