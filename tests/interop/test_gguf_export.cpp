// GGUF export without llama.cpp (docs/interop.md): what is refused, with exit 2, the option or
// key named and nothing written -- a checkpoint without a tokenizer (and how --data attaches
// one), an unknown dtype, an existing output without --force, a tokenizer pattern llama.cpp has
// no pre-tokenizer for, MoE with model.attention = mha -- and that the offline tokenizer kinds
// (tiktoken, tokenizer.json) are written with the pre-tokenizer their pattern implies.
// The runs in llama.cpp itself: test_llama_cpp.cpp and test_llama_cpp_tokenizers.cpp.
// ctest: labels=interop timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include <algorithm>
#include <hdf5.h>

#include <filesystem>
#include <string>

#include "../tokenizer/small_tokenizers.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using quintet::testing::read_file;
using quintet::testing::run_quintet;
using quintet::testing::run_shell;
using quintet::testing::write_file;

namespace {

const char* kDeck = R"([model]
d_model = 16
n_layers = 1
n_heads = 2
ffn_dim = 32
[data]
seq_len = 16
micro_batch_size = 1
[train]
steps = 1
warmup = 0
[eval]
every = 0
[output]
log_every = 1
)";

class GgufExport : public ::testing::Test {
protected:
    fs::path dir;
    void SetUp() override {
        dir = quintet::testing::scratch_dir(std::string("gguf_") +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        write_file(dir / "model.deck", kDeck);
        std::string text;
        for (int i = 0; i < 200; ++i) text += "the cat and the dog sat in the sun; it is on the mat.\n";
        write_file(dir / "text.txt", text);
    }
    // A one-step checkpoint trained on text.txt prepared with `tokenizer_args`.
    std::string checkpoint(const std::string& name, const std::string& tokenizer_args, const std::string& extra = "") {
        auto r = run_quintet(0, "prepare --input " + (dir / "text.txt").string() + " " + tokenizer_args + " --output " +
                                    (dir / (name + ".h5")).string());
        EXPECT_EQ(r.status, 0) << r.output;
        r = run_quintet(0, "train " + (dir / "model.deck").string() + " --data.path=" + (dir / (name + ".h5")).string() +
                               " --output.run_dir=" + (dir / name).string() + " " + extra);
        EXPECT_EQ(r.status, 0) << r.output;
        return (dir / name / "checkpoints/step_00000001.h5").string();
    }
    quintet::testing::RunResult export_gguf(const std::string& ckpt, const fs::path& out, const std::string& more = "") {
        return run_quintet(0, "export --checkpoint " + ckpt + " --format gguf --output " + out.string() + " " + more);
    }
};

TEST_F(GgufExport, CheckpointWithoutTokenizerNamesDataAndWritesNothing) {
    const std::string ckpt = checkpoint("run", "--tokenizer bpe --vocab-size 300");
    // A checkpoint from before the stored tokenizer: the same file without its /tokenizer group.
    const fs::path old = dir / "old.h5";
    fs::copy_file(ckpt, old);
    const hid_t f = H5Fopen(old.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    ASSERT_GE(H5Ldelete(f, "/tokenizer", H5P_DEFAULT), 0);
    H5Fclose(f);
    const fs::path out = dir / "old.gguf";
    auto r = export_gguf(old.string(), out);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("has no tokenizer"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--data"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
    // --data attaches the token file's tokenizer; the same file as from the original checkpoint.
    r = export_gguf(old.string(), out, "--data " + (dir / "run.h5").string());
    ASSERT_EQ(r.status, 0) << r.output;
    ASSERT_EQ(export_gguf(ckpt, dir / "new.gguf").status, 0);
    EXPECT_TRUE(read_file(out) == read_file(dir / "new.gguf"));
}

TEST_F(GgufExport, BadOptionsAreExit2AndWriteNothing) {
    const std::string ckpt = checkpoint("run", "--tokenizer bpe --vocab-size 300");
    const fs::path out = dir / "m.gguf";
    auto r = export_gguf(ckpt, out, "--dtype q4_0");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--dtype = 'q4_0'"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("f32 | f16 | bf16"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out));
    write_file(out, "precious");
    r = export_gguf(ckpt, out);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
    EXPECT_EQ(read_file(out), "precious");
    // --force replaces only a GGUF quintet wrote (docs/interop.md, "Where the output goes").
    r = export_gguf(ckpt, out, "--force");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("it is not a GGUF file"), std::string::npos) << r.output;
    EXPECT_EQ(read_file(out), "precious");
    fs::remove(out);
    ASSERT_EQ(export_gguf(ckpt, out).status, 0);
    ASSERT_EQ(export_gguf(ckpt, out, "--force --dtype f16").status, 0);
    EXPECT_EQ(read_file(out).substr(0, 4), "GGUF");
}

TEST_F(GgufExport, UnwritableModelsAreExit2) {
    write_file(dir / "small.tiktoken", quintet::testing::small::small_tiktoken());
    const std::string spec = "--tokenizer tiktoken:" + (dir / "small.tiktoken").string();
    // A pattern that is none of llama.cpp's pre-tokenizers.
    std::string ckpt = checkpoint("words", spec + " --tokenizer-pattern '\\S+|\\s+' --tokenizer-specials none");
    auto r = export_gguf(ckpt, dir / "words.gguf");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("\\S+|\\s+"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("cl100k_base"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "words.gguf"));
    // MoE needs MLA (deepseek2).
    ckpt = checkpoint("moe", "--tokenizer bpe --vocab-size 300", "--moe.experts=2 --moe.top_k=1");
    r = export_gguf(ckpt, dir / "moe.gguf");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("model.attention = mha with moe.experts = 2"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "moe.gguf"));
}

// The offline kinds: tiktoken with the gpt2 pattern and a GPT-2-style tokenizer.json are written
// as `gpt2` with pre `gpt-2`, their merges included.
TEST_F(GgufExport, TiktokenAndTokenizerJsonAreWritten) {
    write_file(dir / "small.tiktoken", quintet::testing::small::small_tiktoken());
    write_file(dir / "small.json", quintet::testing::small::small_tokenizer_json());
    for (const std::string& spec : {"--tokenizer tiktoken:" + (dir / "small.tiktoken").string() +
                                        " --tokenizer-pattern gpt2 --tokenizer-specials '<|endoftext|>=276'",
                                    "--tokenizer hf:" + (dir / "small.json").string()}) {
        const std::string name = spec.find("tiktoken") != std::string::npos ? "tiktoken" : "hf";
        const std::string ckpt = checkpoint(name, spec);
        const fs::path out = dir / (name + ".gguf");
        const auto r = export_gguf(ckpt, out);
        ASSERT_EQ(r.status, 0) << r.output;
        EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
        const std::string b = read_file(out);
        EXPECT_NE(b.find("tokenizer.ggml.merges"), std::string::npos) << name;
        const std::string pre = std::string("tokenizer.ggml.pre") + '\x08' + std::string(3, '\0') + '\x05' +
                                std::string(7, '\0') + "gpt-2";
        EXPECT_NE(b.find(pre), std::string::npos) << name << ": pre is not gpt-2";
        // "the" = "th" + "e" and "t" + "he": both splits are merges (tiktoken's ranks).
        if (name == "tiktoken") {
            EXPECT_NE(b.find("th e"), std::string::npos);
            EXPECT_NE(b.find("t he"), std::string::npos);
        }
    }
}

// A tiktoken checkpoint exported as a Hugging Face directory: its tokenizer.json (Split + ByteLevel,
// merges derived from the ranks, ignore_merges) tokenizes every line as the tiktoken ranks do,
// for the gpt2 and the cl100k_base patterns.
TEST_F(GgufExport, TiktokenBecomesATokenizerJsonThatTokenizesAlike) {
    write_file(dir / "small.tiktoken", quintet::testing::small::small_tiktoken());
    std::string text = "the cat and the dog sat in the sun; it is on the mat.\n  The  THE 12345 don't we'll\n"
                       "the\tmat\r\n\n\nthe cat's 2024 mats!!  \n\u00e9t\u00e9 the \xe6\x97\xa5 end\n";
    write_file(dir / "probe.txt", text);
    for (const std::string pattern : {"gpt2", "cl100k_base"}) {
        const std::string ckpt = checkpoint("tt_" + pattern, "--tokenizer tiktoken:" + (dir / "small.tiktoken").string() +
                                                                 " --tokenizer-pattern " + pattern +
                                                                 " --tokenizer-specials '<|endoftext|>=276'");
        const fs::path hf = dir / ("hf_" + pattern);
        auto r = run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string());
        ASSERT_EQ(r.status, 0) << r.output;
        const std::string j = read_file(hf / "tokenizer.json");
        EXPECT_NE(j.find("\"ignore_merges\":true"), std::string::npos);
        EXPECT_NE(j.find("\"Split\""), std::string::npos);
        auto ids = [&](const std::string& how) {
            const auto t = run_shell("'" + std::string(QUINTET_BINARY) + "' tokenize " + how + " < '" +
                                     (dir / "probe.txt").string() + "' 2>&1");
            EXPECT_EQ(t.status, 0) << t.output;
            return t.output;
        };
        const std::string want = ids("--checkpoint " + ckpt);
        EXPECT_GT(std::count(want.begin(), want.end(), '\n'), 3) << want;
        EXPECT_EQ(ids("--tokenizer hf:" + (hf / "tokenizer.json").string()), want) << pattern;
    }
}

}  // namespace
