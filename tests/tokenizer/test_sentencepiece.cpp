// spm:FILE against Debian's python3-sentencepiece, token for token: tests/tokenizer/spm_reference.py
// trains a unigram, a BPE (byte fallback) and a Llama-2-style BPE model on the mixed corpus and
// writes the ids Python gets; `quintet tokenize --tokenizer spm:MODEL` must print the same, line by
// line and whole, and decode them back to what the library decodes. Invalid UTF-8 must not crash; a file that is no
// model is exit 2 naming it. Skipped (with a message) without python3-sentencepiece.
// ctest: labels=tokenizer_reference timeout=600 launches_mpirun skip_regex=SKIPPED
#include <gtest/gtest.h>

#include <filesystem>
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

TEST(SentencePiece, EqualsTheLibraryTokenForToken) {
    const fs::path dir = quintet::testing::scratch_dir("tokenizer_spm");
    const fs::path corpus = kSource / "tests/tokenizer/data/mixed_corpus.txt";
    const auto ref = run_shell("/usr/bin/python3 '" + (kSource / "tests/tokenizer/spm_reference.py").string() + "' '" +
                               corpus.string() + "' '" + dir.string() + "' 2>&1");
    if (ref.status == 77 || ref.output.find("SKIPPED") != std::string::npos) GTEST_SKIP() << ref.output;
    ASSERT_EQ(ref.status, 0) << ref.output;
    const fs::path out = dir / "out.txt";
    auto tokenize = [&](const std::string& args, const fs::path& input) {
        // { } so that stderr (the test's output) stays out of the ids file.
        const auto r = run_shell("{ OMP_NUM_THREADS=2 '" + kBinary.string() + "' tokenize " + args + " < '" +
                                 input.string() + "' > '" + out.string() + "'; }");
        EXPECT_EQ(r.status, 0) << args << ": " << r.output;
        return read_file(out);
    };
    for (const char* name : {"spm_unigram", "spm_bpe", "spm_bpe_llama2"}) {
        const std::string spec = "--tokenizer spm:" + (dir / (std::string(name) + ".model")).string();
        const std::vector<std::string> want = split_lines(read_file(dir / (std::string(name) + ".lines")));
        const std::vector<std::string> got = split_lines(tokenize(spec, corpus));
        ASSERT_EQ(got.size(), want.size()) << name;
        size_t equal = 0;
        for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_EQ(got[i], want[i]) << name << ", corpus line " << i + 1;
            equal += got[i] == want[i];
        }
        const std::string whole = tokenize(spec + " --whole", corpus);
        EXPECT_EQ(whole, read_file(dir / (std::string(name) + ".whole"))) << name;
        std::printf("[ reference ] %-12s %zu/%zu lines and the whole corpus (%s) equal\n", name, equal, want.size(),
                    whole == read_file(dir / (std::string(name) + ".whole")) ? "yes" : "NO");
        // Invalid UTF-8: no crash, some ids.
        quintet::testing::write_file(dir / "invalid.txt", "ok \xff\xfe bad \xc3\x28 \xe2\x82 end");
        EXPECT_FALSE(tokenize(spec + " --whole", dir / "invalid.txt").empty());
    }
    // Not a model: exit 2 naming the file.
    quintet::testing::write_file(dir / "bogus.model", "this is not a protobuf");
    const auto r = run_shell("echo hi | '" + kBinary.string() + "' tokenize --tokenizer spm:" +
                             (dir / "bogus.model").string() + " 2>&1");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("not a SentencePiece model"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("bogus.model"), std::string::npos) << r.output;
}

}  // namespace
