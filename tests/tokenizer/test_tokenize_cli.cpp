// The tokenizers as users meet them, through the real binary: `quintet tokenize` (the script
// contract), `quintet prepare` with each kind of SPEC, --bos/--eos and documents, on 1 and 2
// ranks (the same file), bad input (exit 2 naming the file, line, JSON path or pattern offset,
// before any work), and the tokenizer travelling in checkpoints: generate and tokenize without
// the token file, eval and train refusing a token file of another tokenizer (unless
// --allow-tokenizer-change), old checkpoints without a tokenizer still used. The tokenizer files
// are small ones made here (offline); tests/tokenizer/test_reference.cpp has the real ones.
// ctest: labels=mpi timeout=900 launches_mpirun
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/io/token_data.hpp"
#include "quintet/io/tokenizer_store.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"
#include "support/run_support.hpp"
#include "tokenizer/small_tokenizers.hpp"

namespace fs = std::filesystem;
using quintet::testing::read_file;
using quintet::testing::run_quintet;
using quintet::testing::run_shell;
using quintet::testing::write_file;

namespace {

const fs::path kBinary = QUINTET_BINARY;
using namespace quintet::testing::small;

std::string english(size_t bytes, uint32_t seed) {
    const char* words[] = {"the", "and", "is", "it", "there", "another", "thing", "in", "an", "order", "reading",
                           "Then", "Another", "Is", "at", "on", "rest", "tent", "1984", "42"};
    std::string out;
    uint32_t x = seed;
    while (out.size() < bytes) {
        x = x * 1103515245u + 12345u;
        out += words[(x >> 16) % 20];
        out += (x >> 8) % 11 == 0 ? ".\n" : (x >> 8) % 13 == 0 ? ",  " : " ";
    }
    return out;
}

class TokenizeCli : public ::testing::Test {
protected:
    fs::path dir;
    void SetUp() override {
        dir = quintet::testing::scratch_dir(std::string("tokenize_cli_") +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        write_file(dir / "small.tiktoken", small_tiktoken());
        write_file(dir / "small.json", small_tokenizer_json());
    }
    // `quintet tokenize ARGS` on `input`: {status, stdout}; stderr into `err`.
    std::pair<int, std::string> tokenize(const std::string& args, const std::string& input, std::string* err = nullptr,
                                         int threads = 1) {
        write_file(dir / "in.txt", input);
        const auto r = run_shell("{ OMP_NUM_THREADS=" + std::to_string(threads) + " '" + kBinary.string() +
                                 "' tokenize " + args + " < '" + (dir / "in.txt").string() + "' > '" +
                                 (dir / "out.txt").string() + "'; }");
        if (err) *err = r.output;
        return {r.status, read_file(dir / "out.txt")};
    }
    std::string tt() const { return "--tokenizer tiktoken:" + (dir / "small.tiktoken").string() + " --tokenizer-pattern gpt2"; }
    std::string hf() const { return "--tokenizer hf:" + (dir / "small.json").string(); }
};

TEST_F(TokenizeCli, LinesWholeDecodeAndSpecials) {
    // One output line per input line; --whole: one line; the last line is the ids.
    auto [st, out] = tokenize(tt(), "the and\nthe\n");
    ASSERT_EQ(st, 0);
    EXPECT_EQ(out, "258 264\n258\n");  // "the", " and" / "the"
    std::tie(st, out) = tokenize(tt() + " --whole", "the and\nthe\n");
    EXPECT_EQ(out, "258 264 10 258 10\n");
    std::tie(st, out) = tokenize(tt() + " --decode", "258 264\n258\n");
    EXPECT_EQ(out, "the and\nthe\n");
    std::tie(st, out) = tokenize(tt() + " --decode --whole", "258 264 10 258 10");
    EXPECT_EQ(out, "the and\nthe\n");
    // The same merges through a tokenizer.json give the same ids.
    std::tie(st, out) = tokenize(hf(), "the and\nthe\n");
    EXPECT_EQ(out, "258 264\n258\n");
    // Special-token text is ordinary text unless --special.
    std::tie(st, out) = tokenize(hf(), "<|endoftext|>");
    EXPECT_NE(out, "276\n");
    std::tie(st, out) = tokenize(hf() + " --special", "the<|endoftext|>the");
    EXPECT_EQ(out, "258 276 258\n");
    std::tie(st, out) = tokenize(tt() + " --tokenizer-specials '<|endoftext|>=300' --special", "the<|endoftext|>");
    EXPECT_EQ(out, "258 300\n");
    // A decoded id outside the vocabulary is exit 2 naming it.
    std::string err;
    std::tie(st, out) = tokenize(tt() + " --decode", "5 99999\n", &err);
    EXPECT_EQ(st, 2);
    EXPECT_NE(err.find("99999"), std::string::npos) << err;
}

// Exit 2 before any work, naming the file and where in it.
TEST_F(TokenizeCli, BadTokenizersAreExit2WithWhere) {
    struct Bad {
        std::string args, file_text, expect;
    };
    write_file(dir / "bad_line.tiktoken", small_tiktoken() + "dGhl\n");
    write_file(dir / "bad_b64.tiktoken", "!!!! 0\n");
    write_file(dir / "bad.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, ");
    std::string json = small_tokenizer_json();
    json.replace(json.find("\"merges\":[") + 10, 0, "\"zz qq\",");
    write_file(dir / "bad_merge.json", json);
    const std::vector<Bad> cases = {
        {"--tokenizer tiktoken:" + (dir / "bad_line.tiktoken").string() + " --tokenizer-pattern gpt2", "", "line 277"},
        {"--tokenizer tiktoken:" + (dir / "bad_b64.tiktoken").string() + " --tokenizer-pattern gpt2", "", "not base64"},
        {"--tokenizer tiktoken:" + (dir / "small.tiktoken").string(), "", "--tokenizer-pattern"},
        {"--tokenizer tiktoken:" + (dir / "small.tiktoken").string() + " --tokenizer-pattern '(a'", "",
         "at offset 2"},
        {"--tokenizer hf:" + (dir / "bad.json").string(), "", "syntax error at byte"},
        {"--tokenizer hf:" + (dir / "bad_merge.json").string(), "", "/model/merges/0"},
        {"--tokenizer hf:" + (dir / "missing.json").string(), "", "does not exist"},
        {"--tokenizer sentencepiece:x", "", "valid: byte, bpe"},
        {"--tokenizer bpe", "", "--data FILE"},
    };
    for (const auto& c : cases) {
        std::string err;
        const auto [st, out] = tokenize(c.args, "hello", &err);
        EXPECT_EQ(st, 2) << c.args << ": " << err;
        EXPECT_NE(err.find(c.expect), std::string::npos) << c.args << ": " << err;
        EXPECT_TRUE(out.empty()) << c.args;
    }
}

// prepare's /tokens are tokenize --whole's ids; documents get --bos/--eos; 2 ranks write the same
// file as 1.
TEST_F(TokenizeCli, PrepareEqualsTokenizeAndSharesOverRanks) {
    const std::string text = english(2500000, 3);  // > 2 MB: cut into parts
    write_file(dir / "a.txt", text);
    write_file(dir / "b.txt", english(3000, 5));
    for (const std::string& spec : {tt(), hf(), std::string("--tokenizer byte")}) {
        const auto [st, ids] = tokenize(spec + " --whole", text, nullptr, 2);
        ASSERT_EQ(st, 0) << spec;
        const std::string args = "prepare --input " + (dir / "a.txt").string() + " " + spec;
        auto r = run_quintet(0, args + " --force --output " + (dir / "one.h5").string());  // one file per SPEC
        ASSERT_EQ(r.status, 0) << r.output;
        const quintet::TokenFile one = quintet::token_file_read((dir / "one.h5").string());
        std::ostringstream joined;
        for (size_t i = 0; i < one.tokens.size(); ++i) joined << (i ? " " : "") << one.tokens[i];
        EXPECT_EQ(joined.str() + "\n", ids) << spec;
        EXPECT_EQ(one.eos_id, -1);
        r = run_quintet(2, args + " --force --output " + (dir / "two.h5").string());
        ASSERT_EQ(r.status, 0) << r.output;
        EXPECT_EQ(quintet::token_file_read((dir / "two.h5").string()).tokens, one.tokens) << spec;
        EXPECT_EQ(quintet::token_file_read((dir / "two.h5").string()).tokenizer.fingerprint(), one.tokenizer.fingerprint());
    }
    // Documents: [bos] a [eos] [bos] b [eos], by name and by id.
    auto r = run_quintet(2, "prepare --input " + (dir / "b.txt").string() + " --input " + (dir / "b.txt").string() +
                                " " + tt() + " --tokenizer-specials '<s>=300,</s>=301' --bos '<s>' --eos 301 --output " +
                                (dir / "docs.h5").string());
    ASSERT_EQ(r.status, 0) << r.output;
    const quintet::TokenFile docs = quintet::token_file_read((dir / "docs.h5").string());
    EXPECT_EQ(docs.bos_id, 300);
    EXPECT_EQ(docs.eos_id, 301);
    const auto [st, b_ids] = tokenize(tt() + " --whole", english(3000, 5));
    const size_t n = std::count(b_ids.begin(), b_ids.end(), ' ') + 1;
    ASSERT_EQ(docs.tokens.size(), 2 * (n + 2));
    EXPECT_EQ(docs.tokens[0], 300u);
    EXPECT_EQ(docs.tokens[n + 1], 301u);
    EXPECT_EQ(docs.tokens[n + 2], 300u);
    EXPECT_EQ(docs.tokens.back(), 301u);
    // Documents without --eos take the tokenizer's <|endoftext|>; an unknown one is exit 2.
    r = run_quintet(0, "prepare --input " + (dir / "b.txt").string() + " --input " + (dir / "b.txt").string() + " " +
                           hf() + " --output " + (dir / "docs2.h5").string());
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(quintet::token_file_read((dir / "docs2.h5").string()).eos_id, 276);
    r = run_quintet(0, "prepare --input " + (dir / "b.txt").string() + " " + hf() + " --eos '<|nope|>' --output " +
                           (dir / "x.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("<|nope|>"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("<|endoftext|>"), std::string::npos) << r.output;  // what is valid
    EXPECT_FALSE(fs::exists(dir / "x.h5"));
    r = run_quintet(0, "prepare --input " + (dir / "b.txt").string() + " --input " + (dir / "b.txt").string() + " " +
                           tt() + " --tokenizer-specials none --output " + (dir / "x.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--eos"), std::string::npos) << r.output;
}

const char* kDeck = R"([model]
d_model = 32
n_layers = 1
n_heads = 2
ffn_dim = 64
[data]
seq_len = 32
micro_batch_size = 2
val_fraction = 0.1
[train]
steps = 2
lr = 1e-3
warmup = 1
seed = 3
[eval]
every = 0
batches = 1
[checkpoint]
resume = none
)";

// Writes `tok` into a checkpoint as the trainer stores it (group /tokenizer), unless it has one.
void store_tokenizer(const fs::path& ckpt, const quintet::Tokenizer& tok) {
    const hid_t f = H5Fopen(ckpt.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    if (H5Lexists(f, "tokenizer", H5P_DEFAULT) <= 0) quintet::tokenizer_store_write(f, "tokenizer", tok.state());
    H5Fclose(f);
}

TEST_F(TokenizeCli, TheTokenizerTravelsWithTheCheckpoint) {
    // Two token files with tokenizers of the same vocabulary size (different merges).
    write_file(dir / "a.txt", english(60000, 1));
    write_file(dir / "b.txt", std::string(20000, 'z') + english(20000, 9) + "qqqq xxxx yyyy jjjj kkkk");
    write_file(dir / "tiny.deck", kDeck);
    for (const char* n : {"a", "b"}) {
        const auto r = run_quintet(0, std::string("prepare --tokenizer bpe --vocab-size 300 --input ") +
                                          (dir / n).string() + ".txt --output " + (dir / n).string() + ".h5");
        ASSERT_EQ(r.status, 0) << r.output;
    }
    const quintet::Tokenizer ta = quintet::token_file_read_tokenizer((dir / "a.h5").string());
    ASSERT_EQ(ta.vocab_size(), quintet::token_file_read_tokenizer((dir / "b.h5").string()).vocab_size());
    auto train = [&](const std::string& data, const std::string& run, const std::string& extra) {
        return run_quintet(1, "train " + (dir / "tiny.deck").string() + " --data.path=" + data +
                                  " --output.run_dir=" + (dir / run).string() + " " + extra);
    };
    auto r = train((dir / "a.h5").string(), "run", "");
    ASSERT_EQ(r.status, 0) << r.output;
    const fs::path ckpt = dir / "run/checkpoints/step_00000002.h5";
    const fs::path old = dir / "old.h5";  // a checkpoint from before: no tokenizer
    fs::copy_file(ckpt, old);
    {
        const hid_t f = H5Fopen(old.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        if (H5Lexists(f, "tokenizer", H5P_DEFAULT) > 0) H5Ldelete(f, "tokenizer", H5P_DEFAULT);
        H5Fclose(f);
    }
    store_tokenizer(ckpt, ta);  // as the trainer stores it (a no-op where it already has)

    // tokenize and generate need no token file.
    const auto [st, want] = tokenize("--data " + (dir / "a.h5").string(), "the thing and another");
    fs::rename(dir / "a.h5", dir / "a_moved.h5");
    std::string err;
    const auto [st2, got] = tokenize("--checkpoint " + ckpt.string(), "the thing and another", &err);
    EXPECT_EQ(st2, 0) << err;
    EXPECT_EQ(got, want);
    r = run_quintet(0, "generate --checkpoint " + ckpt.string() + " --prompt 'the thing' --tokens 5 --temperature 0");
    EXPECT_EQ(r.status, 0) << r.output;
    // An old checkpoint without its token file: the error names the token file it looked for.
    r = run_quintet(0, "generate --checkpoint " + old.string() + " --prompt 'the' --tokens 2");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("a.h5"), std::string::npos) << r.output;
    fs::rename(dir / "a_moved.h5", dir / "a.h5");
    r = run_quintet(0, "generate --checkpoint " + old.string() + " --prompt 'the' --tokens 2");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("has no tokenizer"), std::string::npos) << r.output;

    // Another tokenizer's data: eval, generate --data and train (init_from, resume) refuse it.
    r = run_quintet(1, "eval --checkpoint " + ckpt.string() + " --data " + (dir / "b.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("is not the checkpoint's"), std::string::npos) << r.output;
    r = run_quintet(1, "eval --checkpoint " + ckpt.string() + " --data " + (dir / "a.h5").string());
    EXPECT_EQ(r.status, 0) << r.output;
    r = run_quintet(0, "generate --checkpoint " + ckpt.string() + " --data " + (dir / "b.h5").string() +
                           " --prompt the --tokens 2");
    EXPECT_EQ(r.status, 2) << r.output;
    r = train((dir / "b.h5").string(), "init", "--checkpoint.init_from=" + ckpt.string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--allow-tokenizer-change"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "init/checkpoints"));
    r = train((dir / "b.h5").string(), "init", "--checkpoint.init_from=" + ckpt.string() + " --allow-tokenizer-change");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("allow_tokenizer_change = true"), std::string::npos) << r.output;
    r = train((dir / "a.h5").string(), "init_a", "--checkpoint.init_from=" + ckpt.string());
    EXPECT_EQ(r.status, 0) << r.output;
    // A byte token file (another vocabulary size): refused even when allowed, naming both sizes.
    quintet::testing::make_token_file(dir / "bytes.h5", 5000, 256, 1);
    r = train((dir / "bytes.h5").string(), "init_bytes",
              "--checkpoint.init_from=" + ckpt.string() + " --allow-tokenizer-change");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("vocabulary 256 against the checkpoint's 300"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("would shrink"), std::string::npos) << r.output;
    // A vocabulary extension: the same text's bpe with more merges keeps ids 0 .. 299.
    r = run_quintet(0, "prepare --tokenizer bpe --vocab-size 320 --input " + (dir / "a.txt").string() + " --output " +
                           (dir / "a320.h5").string());
    ASSERT_EQ(r.status, 0) << r.output;
    const size_t V = size_t(quintet::token_file_read_tokenizer((dir / "a320.h5").string()).vocab_size());
    ASSERT_GT(V, 300u);
    r = train((dir / "a320.h5").string(), "extended", "--checkpoint.init_from=" + ckpt.string());
    EXPECT_EQ(r.status, 2) << r.output;
    r = train((dir / "a320.h5").string(), "extended",
              "--checkpoint.init_from=" + ckpt.string() + " --allow-tokenizer-change --train.steps=0");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("grows from 300 to " + std::to_string(V)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("keep their tokens"), std::string::npos) << r.output;
    {
        // Step 0 of the extended run: rows 0 .. 299 are the checkpoint's, the new ones their mean.
        const auto theirs = quintet::testing::checkpoint_tensors(ckpt.string());
        const auto ours = quintet::testing::checkpoint_tensors((dir / "extended/checkpoints/step_00000000.h5").string());
        auto find = [](const auto& v, const std::string& name) -> const std::vector<float>& {
            for (const auto& [n, t] : v)
                if (n == name) return t;
            static const std::vector<float> none;
            return none;
        };
        const std::vector<float>& a = find(theirs, "params/model.embed_tokens.weight");
        const std::vector<float>& b = find(ours, "params/model.embed_tokens.weight");
        ASSERT_EQ(a.size(), 300u * 32u);
        ASSERT_EQ(b.size(), V * 32u);
        EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
        for (int c = 0; c < 32; ++c) {
            double mean = 0;
            for (int r = 0; r < 300; ++r) mean += a[size_t(r) * 32 + size_t(c)];
            mean /= 300;
            EXPECT_NEAR(b[(V - 1) * 32 + size_t(c)], mean, 1e-6) << c;
        }
    }
    // Resuming into another vocabulary is refused even when allowed.
    r = train((dir / "a320.h5").string(), "run", "--checkpoint.resume=auto --allow-tokenizer-change --train.steps=3");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("keeps its vocabulary"), std::string::npos) << r.output;
    // The old checkpoint: compared by vocabulary size only, and said so.
    r = run_quintet(1, "eval --checkpoint " + old.string() + " --data " + (dir / "bytes.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("vocabulary 256"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("300"), std::string::npos) << r.output;
}

}  // namespace
