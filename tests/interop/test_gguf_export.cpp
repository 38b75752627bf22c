// GGUF export without llama.cpp (docs/interop.md): what is refused, with exit 2, the option or
// key named and nothing written -- a checkpoint without a tokenizer (and how --data attaches
// one), an unknown dtype, an existing output without --force, a tokenizer pattern llama.cpp has
// no pre-tokenizer for, MoE with model.attention = mha, groups ranked by their best score -- that
// the offline tokenizer kinds (tiktoken, tokenizer.json) are written with the pre-tokenizer their
// pattern implies, and DeepSeek's router keys with the router kept f32 in a bf16 file.
// The runs in llama.cpp itself: test_llama_cpp.cpp and test_llama_cpp_tokenizers.cpp.
// ctest: labels=interop timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include <algorithm>
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <map>
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

// A GGUF file's metadata numbers (u32, f32, bool as doubles) and its tensors' ggml types, read
// from the layout (little-endian: magic, version, counts, key/values, tensor infos).
struct GgufHeader {
    std::map<std::string, double> numbers;
    std::map<std::string, uint32_t> tensor_type;
};
GgufHeader read_gguf_header(const fs::path& p) {
    const std::string b = read_file(p);
    size_t at = 0;
    auto take = [&](size_t n) {
        const char* q = b.data() + at;
        at += n;
        return q;
    };
    auto u32 = [&] { uint32_t v; std::memcpy(&v, take(4), 4); return v; };
    auto u64 = [&] { uint64_t v; std::memcpy(&v, take(8), 8); return v; };
    auto str = [&] { const uint64_t n = u64(); return std::string(take(n), n); };
    const size_t size_of[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    GgufHeader h;
    EXPECT_EQ(std::string(take(4), 4), "GGUF");
    u32();
    const uint64_t tensors = u64(), kvs = u64();
    for (uint64_t i = 0; i < kvs; ++i) {
        const std::string key = str();
        const uint32_t type = u32();
        if (type == 8) {
            str();
        } else if (type == 9) {
            const uint32_t t = u32();
            const uint64_t n = u64();
            for (uint64_t j = 0; j < n; ++j) t == 8 ? (void)str() : (void)take(size_of[t]);
        } else if (type == 4) {
            h.numbers[key] = u32();
        } else if (type == 6) {
            float f;
            std::memcpy(&f, take(4), 4);
            h.numbers[key] = f;
        } else if (type == 7) {
            h.numbers[key] = *take(1);
        } else {
            take(size_of[type]);
        }
    }
    for (uint64_t i = 0; i < tensors; ++i) {
        const std::string name = str();
        const uint32_t dims = u32();
        for (uint32_t d = 0; d < dims; ++d) u64();
        h.tensor_type[name] = u32();
        u64();
    }
    return h;
}

// DeepSeek's router in llama.cpp's keys (docs/interop.md): the gating function, the weights'
// scale and renormalisation, the groups; the router and its bias stay f32 in a bf16 file; and a
// rule llama.cpp does not compute (groups ranked by their best score) is refused.
TEST_F(GgufExport, DeepSeekRouterKeysAndAnF32Router) {
    const std::string mla = "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=2 --model.kv_lora_rank=16 "
                            "--model.qk_nope_dim=8 --model.qk_rope_dim=8 --model.v_head_dim=8 --moe.experts=8 "
                            "--moe.top_k=2 --moe.ffn_dim=16 --moe.layers=1 --moe.groups=4 --moe.group_top_k=2 ";
    std::string ckpt = checkpoint("v3", "--tokenizer bpe --vocab-size 300",
                                  mla + "--moe.scoring=sigmoid --moe.topk_method=noaux_tc --moe.routed_scaling=2.5 "
                                        "--moe.balance=aux_free");
    auto r = export_gguf(ckpt, dir / "v3.gguf", "--dtype bf16");
    ASSERT_EQ(r.status, 0) << r.output;
    const GgufHeader h = read_gguf_header(dir / "v3.gguf");
    EXPECT_EQ(h.numbers.at("deepseek2.expert_gating_func"), 2.0);  // sigmoid
    EXPECT_FLOAT_EQ(float(h.numbers.at("deepseek2.expert_weights_scale")), 2.5f);
    EXPECT_EQ(h.numbers.at("deepseek2.expert_weights_norm"), 1.0);
    EXPECT_EQ(h.numbers.at("deepseek2.expert_group_count"), 4.0);
    EXPECT_EQ(h.numbers.at("deepseek2.expert_group_used_count"), 2.0);
    EXPECT_EQ(h.tensor_type.at("blk.1.ffn_gate_inp.weight"), 0u);  // F32
    EXPECT_EQ(h.tensor_type.at("blk.1.exp_probs_b.bias"), 0u);
    EXPECT_EQ(h.tensor_type.at("blk.1.ffn_gate_exps.weight"), 30u);  // BF16
    ckpt = checkpoint("v2", "--tokenizer bpe --vocab-size 300", mla + "--moe.topk_method=group_limited_greedy");
    r = export_gguf(ckpt, dir / "v2.gguf");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("moe.topk_method = group_limited_greedy"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "v2.gguf"));
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
