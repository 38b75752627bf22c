// GGUF export proven in llama.cpp's own runtime: small models are trained, exported with
// `quintet export --format gguf`, and run by llama.cpp through the npm package node-llama-cpp
// (pinned 3.21.1: its prebuilt CPU build, no compiler; tests/interop/llama_cpp_reference.mjs),
// with an F32 KV cache and flash attention off. For each model:
//   - llama.cpp's tokenization of every line of the test corpus equals `quintet tokenize`;
//   - the next-token probabilities after every token of a text are within 1e-4 of quintet's own
//     forward (`quintet generate --probs`);
//   - the greedy continuation of 32 tokens equals `quintet generate --temperature 0`.
// Models: dense GQA (untied; tied with YaRN, evaluated past the trained length) as `llama`, and
// MLA + MoE with a shared expert, a dense first layer and the aux-free bias as `deepseek2`
// (q_lora_rank 0 and > 0). Each model is also exported with --dtype f16 and bf16, whose
// probabilities must stay within the bounds measured for them (kHalfBound); and the YaRN model's
// GGUF with its rope.scaling keys hidden (renamed, so llama.cpp runs it without YaRN) must give
// different probabilities past the original context: the control that shows the keys are used.
// Needs Node >= 20 and the npm registry (the package goes to
// <build>/npm); skipped with a message where either is missing.
// ctest: labels=llama_cpp timeout=900 launches_mpirun skip_regex=SKIPPED
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "node_support.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using quintet::testing::read_file;
using quintet::testing::run_quintet;
using quintet::testing::run_shell;
using quintet::testing::write_file;
using quintet::testing::node::json_string;
using quintet::testing::node::lines_of;

namespace {

const fs::path kSource = QUINTET_SOURCE_DIR;
const fs::path kBinary = QUINTET_BINARY;
constexpr int kVocab = 512;

std::vector<int> ids_of(const std::string& line) {
    std::vector<int> v;
    std::istringstream in(line);
    for (int x; in >> x;) v.push_back(x);
    return v;
}

std::string join(const std::vector<int>& v, const char* sep = " ") {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
    return s;
}

std::vector<float> read_f32(const fs::path& p) {
    const std::string b = read_file(p);
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

const char* kDeck = R"([model]
d_model = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 128
[data]
seq_len = 64
micro_batch_size = 4
[train]
steps = 250
lr = 1e-2
lr_min = 1e-3
warmup = 10
[eval]
every = 0
[output]
log_every = 50
)";

// max |p - p_quintet| of the f16 and bf16 GGUF files (matrices rounded; quintet's forward is f32),
// about twice the largest measured over the four models (docs/interop.md).
constexpr double kHalfBound[2] = {2.5e-3, 1.25e-2};  // f16, bf16
const char* kHalfTypes[2] = {"f16", "bf16"};

// Renames every metadata key "A.rope.scaling.*" of a GGUF file to "A.rope.scalinX.*" (same length:
// the layout is unchanged), so that llama.cpp reads the model as having no RoPE scaling.
void hide_rope_scaling(const fs::path& from, const fs::path& to) {
    std::string b = read_file(from);
    const std::string key = ".rope.scaling.", hidden = ".rope.scalinX.";
    size_t n = 0;
    for (size_t at = b.find(key); at != std::string::npos && at < (1u << 20); at = b.find(key, at + 1)) {
        b.replace(at, key.size(), hidden);
        ++n;
    }
    EXPECT_GE(n, 4u) << "no rope.scaling keys found in " << from;
    write_file(to, b);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, size_t from = 0) {
    double m = 0;
    for (size_t i = from; i < a.size() && i < b.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
}

struct Model {
    const char* name;
    const char* overrides;  // deck overrides on top of kDeck
    int positions;          // tokens whose next-token probabilities are compared
};

const Model kModels[] = {
    {"gqa_untied", "", 64},
    // Trained at 64 tokens with YaRN (factor 4 over an original 32), evaluated at 160.
    {"gqa_tied_yarn", "--model.tie_embeddings=true --rope.scaling=yarn --rope.factor=4 --rope.original_max_position=32",
     160},
    {"mla_moe", "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=3 --model.kv_lora_rank=32 --model.qk_nope_dim=16 "
                "--model.qk_rope_dim=8 --model.v_head_dim=16 --moe.experts=4 --moe.top_k=2 --moe.shared_experts=1 "
                "--moe.ffn_dim=32 --moe.layers=1-2 --moe.balance=aux_free --moe.bias_rate=0.01",
     64},
    {"mla_qlora_moe", "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=2 --model.q_lora_rank=24 --model.kv_lora_rank=16 "
                      "--model.qk_nope_dim=8 --model.qk_rope_dim=8 --model.v_head_dim=12 --moe.experts=4 "
                      "--moe.top_k=2 --moe.shared_experts=2 --moe.ffn_dim=24 --moe.layers=1 --moe.norm_topk=false "
                      "--moe.balance=aux_free --moe.bias_rate=0.01 --model.tie_embeddings=true",
     64},
    // DeepSeek-V3's router (docs/math.md §9): sigmoid scores, the aux-free bias in the choice, 2 of 4
    // groups by their two best scores, renormalised and scaled by 2.5; q compression, a dense
    // first layer, a shared expert.
    {"v3_like", "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=3 --model.q_lora_rank=24 --model.kv_lora_rank=16 "
                "--model.qk_nope_dim=8 --model.qk_rope_dim=8 --model.v_head_dim=12 --moe.experts=8 --moe.top_k=2 "
                "--moe.shared_experts=1 --moe.ffn_dim=16 --moe.layers=1-2 --moe.scoring=sigmoid --moe.topk_method=noaux_tc "
                "--moe.groups=4 --moe.group_top_k=2 --moe.routed_scaling=2.5 --moe.balance=aux_free --moe.bias_rate=0.01",
     64},
    // DeepSeek-V2-Lite's shape: no q compression, softmax scores, YaRN with mscale = mscale_all_dim
    // = 0.707 (trained at 64 tokens, factor 4 over an original 32, evaluated at 160).
    {"v2lite_like", "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=2 --model.kv_lora_rank=32 "
                    "--model.qk_nope_dim=16 --model.qk_rope_dim=8 --model.v_head_dim=16 --moe.experts=4 --moe.top_k=2 "
                    "--moe.shared_experts=1 --moe.ffn_dim=32 --moe.layers=1 --moe.norm_topk=false --moe.routed_scaling=1.5 "
                    "--rope.scaling=yarn --rope.factor=4 --rope.original_max_position=32 --rope.mscale=0.707 "
                    "--rope.mscale_all_dim=0.707",
     160},
};

class LlamaCpp : public ::testing::TestWithParam<Model> {
protected:
    static fs::path dir, npm;
    static std::string skip;
    static std::vector<std::string> corpus_lines;

    static void SetUpTestSuite() {
        npm = kBinary.parent_path() / "npm";
        skip = quintet::testing::node::ensure_packages(npm, "node-llama-cpp@3.21.1", {"node-llama-cpp/package.json"});
        if (!skip.empty()) return;
        dir = quintet::testing::scratch_dir("llama_cpp");
        // The model learns the test corpus by heart: its greedy continuations are the corpus's
        // text, far from ties, and every line is a tokenization case.
        const std::string corpus = read_file(kSource / "tests/tokenizer/data/mixed_corpus.txt");
        corpus_lines = lines_of(corpus);
        std::string text;
        for (int i = 0; i < 40; ++i) text += corpus;
        write_file(dir / "corpus.txt", text);
        write_file(dir / "model.deck", kDeck);
        const auto r = run_quintet(0, "prepare --input " + (dir / "corpus.txt").string() +
                                          " --tokenizer bpe --vocab-size " + std::to_string(kVocab) +
                                          " --output " + (dir / "tokens.h5").string());
        ASSERT_EQ(r.status, 0) << r.output;
    }
    void SetUp() override {
        if (!skip.empty()) GTEST_SKIP() << "SKIPPED: " << skip;
    }
    static fs::path run_node(const fs::path& work, const std::string& job) {
        write_file(work / "job.json", job);
        const auto r = run_shell("node '" + (kSource / "tests/interop/llama_cpp_reference.mjs").string() + "' '" +
                                 (npm / "node_modules").string() + "' '" + (work / "job.json").string() + "' '" +
                                 work.string() + "'");
        EXPECT_EQ(r.status, 0) << r.output;
        return work;
    }
};
fs::path LlamaCpp::dir, LlamaCpp::npm;
std::string LlamaCpp::skip;
std::vector<std::string> LlamaCpp::corpus_lines;

TEST_P(LlamaCpp, ExportedGgufRunsInLlamaCppAsInQuintet) {
    const Model& m = GetParam();
    const fs::path work = dir / m.name;
    fs::create_directories(work);
    auto r = run_quintet(0, "train " + (dir / "model.deck").string() + " --data.path=" + (dir / "tokens.h5").string() +
                                " --output.run_dir=" + (work / "run").string() + " " + m.overrides);
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string ckpt = (work / "run/checkpoints/step_00000250.h5").string();
    const fs::path gguf = work / "model.gguf";
    r = run_quintet(0, "export --checkpoint " + ckpt + " --format gguf --output " + gguf.string());
    ASSERT_EQ(r.status, 0) << r.output;

    // quintet's tokens: every corpus line, and the corpus whole for the texts to evaluate.
    r = run_shell("'" + kBinary.string() + "' tokenize --checkpoint " + ckpt + " < '" +
                  (kSource / "tests/tokenizer/data/mixed_corpus.txt").string() + "' 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.output;
    const std::vector<std::string> want = lines_of(r.output);
    ASSERT_EQ(want.size(), corpus_lines.size());
    r = run_shell("'" + kBinary.string() + "' tokenize --whole --checkpoint " + ckpt + " < '" +
                  (dir / "corpus.txt").string() + "' 2>/dev/null | tail -1");
    const std::vector<int> all = ids_of(r.output);
    ASSERT_GE(all.size(), size_t(m.positions));
    // The text: `positions` tokens from the corpus's second line on; the greedy prompt its first 40.
    const std::vector<int> ids(all.begin() + 20, all.begin() + 20 + m.positions);

    std::string job = "{\"gguf\": " + json_string(gguf.string()) + ", \"vocab\": " + std::to_string(kVocab) +
                      ", \"context\": 256, \"greedy\": 32, \"ids\": [" + join(ids, ", ") + "], \"texts\": [";
    for (size_t i = 0; i < corpus_lines.size(); ++i) job += (i ? ", " : "") + json_string(corpus_lines[i]);
    job += "]}";
    run_node(work, job);

    // (a) tokenization, line by line.
    const std::vector<std::string> got = lines_of(read_file(work / "tokens.txt"));
    ASSERT_EQ(got.size(), want.size());
    size_t equal = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i], want[i]) << m.name << ": corpus line " << i + 1 << ": " << corpus_lines[i];
        equal += got[i] == want[i];
    }

    // (b) probabilities at every position, against quintet's forward with the same ids.
    r = run_quintet(0, "generate --checkpoint " + ckpt + " --prompt-ids '" + join(ids) +
                           "' --tokens 32 --temperature 0 --print-ids --probs " + (work / "quintet.f32").string());
    ASSERT_EQ(r.status, 0) << r.output;
    const std::vector<float> want_p = read_f32(work / "quintet.f32"), got_p = read_f32(work / "probs.f32");
    ASSERT_EQ(got_p.size(), size_t(m.positions) * kVocab);
    ASSERT_GE(want_p.size(), got_p.size());
    double max_diff = 0;
    for (size_t i = 0; i < got_p.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(got_p[i] - want_p[i])));
    EXPECT_LE(max_diff, 1e-4) << m.name;

    // (c) the greedy continuation of the same text.
    std::vector<std::string> out = lines_of(r.output);
    std::vector<int> quintet_ids;
    for (auto it = out.rbegin(); it != out.rend(); ++it)
        if (!it->empty() && it->find_first_not_of("0123456789 ") == std::string::npos) {
            quintet_ids = ids_of(*it);
            break;
        }
    ASSERT_EQ(quintet_ids.size(), ids.size() + 32) << r.output;
    const std::vector<int> quintet_greedy(quintet_ids.begin() + long(ids.size()), quintet_ids.end());
    const std::vector<int> llama_greedy = ids_of(read_file(work / "greedy.txt"));
    EXPECT_EQ(join(llama_greedy), join(quintet_greedy)) << m.name;
    // Without --probs, generate takes the prompt in one forward (Decoder::prefill): the same tokens.
    const auto batched = run_quintet(0, "generate --checkpoint " + ckpt + " --prompt-ids '" + join(ids) +
                                            "' --tokens 32 --temperature 0 --print-ids");
    ASSERT_EQ(batched.status, 0) << batched.output;
    EXPECT_NE(batched.output.find(join(quintet_ids)), std::string::npos) << m.name << ": generate without --probs";
    size_t distinct = 0;
    for (size_t i = 0; i < quintet_greedy.size(); ++i)
        distinct += std::find(quintet_greedy.begin(), quintet_greedy.begin() + long(i), quintet_greedy[i]) ==
                    quintet_greedy.begin() + long(i);
    std::printf("[ llama.cpp ] %-14s tokenization %zu/%zu lines equal; %d positions, max |p - p_quintet| = %.3g; "
                "greedy 32 tokens (%zu distinct) %s\n",
                m.name, equal, want.size(), m.positions, max_diff, distinct,
                llama_greedy == quintet_greedy ? "equal" : "DIFFER");

    // (d) f16 and bf16 matrices: the same text, against quintet's f32 forward.
    const std::string probs_job = "{\"gguf\": %GGUF%, \"vocab\": " + std::to_string(kVocab) +
                                  ", \"context\": 256, \"greedy\": 0, \"ids\": [" + join(ids, ", ") + "], \"texts\": []}";
    auto probs_of = [&](const fs::path& file, const std::string& sub) {
        const fs::path w = work / sub;
        fs::create_directories(w);
        std::string j = probs_job;
        j.replace(j.find("%GGUF%"), 6, json_string(file.string()));
        run_node(w, j);
        return read_f32(w / "probs.f32");
    };
    for (int h = 0; h < 2; ++h) {
        const fs::path half = work / (std::string("model.") + kHalfTypes[h] + ".gguf");
        r = run_quintet(0, "export --checkpoint " + ckpt + " --format gguf --dtype " + kHalfTypes[h] + " --output " +
                               half.string());
        ASSERT_EQ(r.status, 0) << r.output;
        const std::vector<float> half_p = probs_of(half, kHalfTypes[h]);
        const double d = max_abs_diff(half_p, want_p);
        // The positions past the bound. MoE models may have one, isolated (the router is f32, but
        // an expert choice near a tie can still flip under the rounded layers before it: the
        // V2-Lite-like model's f16 file, at its position of smallest router margin, 4.3e-5;
        // docs/interop.md); dense models none.
        size_t over = 0;
        for (size_t t = 0; t < size_t(m.positions); ++t) {
            const std::vector<float> a(half_p.begin() + long(t * kVocab), half_p.begin() + long((t + 1) * kVocab));
            const std::vector<float> b(want_p.begin() + long(t * kVocab), want_p.begin() + long((t + 1) * kVocab));
            over += max_abs_diff(a, b) > kHalfBound[h];
        }
        const bool moe = std::string(m.overrides).find("moe.experts") != std::string::npos;
        EXPECT_LE(over, moe ? 1u : 0u) << m.name << " " << kHalfTypes[h] << ": positions past the bound";
        EXPECT_LE(d, moe ? 0.1 : kHalfBound[h]) << m.name << " " << kHalfTypes[h];
        std::printf("[ llama.cpp ] %-14s %-4s GGUF: max |p - p_quintet| = %.3g (bound %.3g; %zu of %d positions past it)\n",
                    m.name, kHalfTypes[h], d, kHalfBound[h], over, m.positions);
    }

    // (e) The YaRN control: the same GGUF without its rope.scaling keys differs past the original context.
    if (std::string(m.overrides).find("yarn") != std::string::npos) {
        const fs::path plain = work / "model.no_yarn.gguf";
        hide_rope_scaling(gguf, plain);
        const std::vector<float> p = probs_of(plain, "no_yarn");
        const size_t original = 32;  // --rope.original_max_position
        const double before = max_abs_diff(std::vector<float>(p.begin(), p.begin() + original * kVocab), want_p);
        const double past = max_abs_diff(p, want_p, original * kVocab);
        EXPECT_GE(past, 100 * 1e-4) << "without the YaRN keys llama.cpp should differ past the original context";
        std::printf("[ llama.cpp ] %-14s without the rope.scaling keys: max |p - p_quintet| = %.3g before position %zu, "
                    "%.3g from it on\n", m.name, before, original, past);
    }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaCpp, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<Model>& i) { return std::string(i.param.name); });

}  // namespace
