// Hugging Face export and import (docs/interop.md): import(export(checkpoint)) has the same
// parameters bit for bit in f32, export(import(dir)) the same safetensors bytes, the imported
// checkpoint evaluates to the same loss and starts a run with checkpoint.init_from; for a dense
// GQA model and an MLA + MoE one (DeepSeek-V3's router: sigmoid scores, groups, scaling, the
// aux-free bias; shared expert, dense first layer, sharded safetensors); a DeepSeek-V2-Lite shape
// (softmax, YaRN mscale 0.707) computes the same model through DeepseekV2ForCausalLM; routers no
// Transformers class computes are refused; the released DeepSeek config.json files import. The exported directories are also read by a reader that is not quintet's:
// tests/interop/hf_reference.py parses the safetensors itself, builds the model config.json
// describes in the repository's PyTorch model (scripts/torch_reference.py) and its next-token
// probabilities must be quintet's (skipped, with a message, without python3-torch); a tied YaRN
// model is read that way too. Bad input is exit 2 with the option or config key named, and
// nothing written.
// ctest: labels=interop timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using quintet::testing::read_file;
using quintet::testing::run_shell;
using quintet::testing::run_quintet;
using quintet::testing::write_file;

namespace {

const char* kDeck = R"([model]
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
[data]
seq_len = 32
micro_batch_size = 2
[train]
steps = 4
lr = 1e-2
warmup = 1
[eval]
every = 0
batches = 2
[output]
log_every = 1
)";

const char* kMla = "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=3 --model.q_lora_rank=16 "
                   "--model.kv_lora_rank=16 --model.qk_nope_dim=8 --model.qk_rope_dim=8 --model.v_head_dim=8 "
                   "--moe.experts=4 --moe.top_k=2 --moe.shared_experts=1 --moe.ffn_dim=16 --moe.layers=1-2 "
                   "--moe.balance=aux_free --moe.bias_rate=0.05 --moe.scoring=sigmoid --moe.topk_method=noaux_tc "
                   "--moe.groups=2 --moe.group_top_k=1 --moe.routed_scaling=2.5";
// DeepSeek-V2-Lite's shape: no query compression, softmax scores, never renormalised, the balance
// loss, YaRN with mscale = mscale_all_dim = 0.707.
const char* kV2Lite = "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=3 --model.q_lora_rank=0 "
                      "--model.kv_lora_rank=16 --model.qk_nope_dim=8 --model.qk_rope_dim=8 --model.v_head_dim=8 "
                      "--moe.experts=4 --moe.top_k=2 --moe.shared_experts=1 --moe.ffn_dim=16 --moe.layers=1-2 "
                      "--moe.norm_topk=false --moe.routed_scaling=1.5 --rope.scaling=yarn --rope.factor=4 "
                      "--rope.original_max_position=16 --rope.mscale=0.707 --rope.mscale_all_dim=0.707";

class HfRoundTrip : public ::testing::Test {
protected:
    fs::path dir;
    void SetUp() override {
        dir = quintet::testing::scratch_dir(std::string("hf_") +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        quintet::testing::make_token_file(dir / "tokens.h5", 20000, 256, 7);
        write_file(dir / "model.deck", kDeck);
    }
    std::string train(const std::string& name, const std::string& extra) {
        const auto r = run_quintet(0, "train " + (dir / "model.deck").string() + " --data.path=" +
                                          (dir / "tokens.h5").string() + " --output.run_dir=" + (dir / name).string() +
                                          " " + extra);
        EXPECT_EQ(r.status, 0) << r.output;
        return (dir / name / "checkpoints/step_00000004.h5").string();
    }
    std::string eval(const std::string& ckpt) {
        // The run's data and eval keys (an imported checkpoint's deck has the defaults).
        const auto r = run_quintet(0, "eval --checkpoint " + ckpt + " --data " + (dir / "tokens.h5").string() +
                                          " --data.seq_len=32 --data.micro_batch_size=2 --eval.batches=2");
        EXPECT_EQ(r.status, 0) << r.output;
        const size_t at = r.output.rfind("val_loss=");
        return at == std::string::npos ? "" : r.output.substr(at, r.output.find(' ', at) - at);
    }
    // The directory read by tests/interop/hf_reference.py (PyTorch): its next-token probabilities
    // after each of `positions` tokens against `quintet generate --probs` on the checkpoint.
    void torch_reads(const std::string& ckpt, const fs::path& hf, int positions, const std::string& what) {
        std::string ids;
        for (int i = 0; i < positions; ++i) ids += (i ? " " : "") + std::to_string((i * 37 + 11) % 256);
        write_file(dir / "ids.txt", ids);
        auto r = run_shell("/usr/bin/python3 '" + std::string(QUINTET_SOURCE_DIR) + "/tests/interop/hf_reference.py' '" +
                           hf.string() + "' '" + (dir / "ids.txt").string() + "' '" + (dir / "torch.f32").string() + "' 2>&1");
        if (r.status == 77 || r.output.find("SKIPPED") != std::string::npos) {
            std::printf("[ hf ] %s: SKIPPED the PyTorch reader: %s", what.c_str(), r.output.c_str());
            return;
        }
        ASSERT_EQ(r.status, 0) << r.output;
        r = run_quintet(0, "generate --checkpoint " + ckpt + " --prompt-ids '" + ids + "' --tokens 1 --temperature 0 --probs " +
                               (dir / "quintet.f32").string());
        ASSERT_EQ(r.status, 0) << r.output;
        const std::string a = read_file(dir / "torch.f32"), b = read_file(dir / "quintet.f32");
        ASSERT_EQ(a.size() % (4 * size_t(positions)), 0u);
        ASSERT_GE(b.size(), a.size());
        std::vector<float> p(a.size() / 4), q(a.size() / 4);
        std::memcpy(p.data(), a.data(), a.size());
        std::memcpy(q.data(), b.data(), a.size());
        // Relative: |ln p - ln p_quintet|, so that a barely trained model's near-uniform p still shows a
        // difference; and how far from uniform p is (the spread of ln p at a position).
        double max_diff = 0, spread = 0;
        const size_t V = p.size() / size_t(positions);
        for (size_t t = 0; t < size_t(positions); ++t) {
            double lo = 1e300, hi = -1e300;
            for (size_t v = 0; v < V; ++v) {
                const size_t i = t * V + v;
                max_diff = std::max(max_diff, std::fabs(std::log(double(p[i])) - std::log(double(q[i]))));
                lo = std::min(lo, std::log(double(q[i])));
                hi = std::max(hi, std::log(double(q[i])));
            }
            spread = std::max(spread, hi - lo);
        }
        EXPECT_LE(max_diff, 1e-4) << what;
        std::printf("[ hf ] %s read by PyTorch (hf_reference.py): %d positions, max |ln p - ln p_quintet| = %.3g "
                    "(ln p spans %.2f)\n", what.c_str(), positions, max_diff, spread);
    }
    void round_trip(const std::string& extra, const std::string& export_args) {
        const std::string ckpt = train("run", extra);
        const fs::path hf = dir / "hf", hf2 = dir / "hf2";
        auto r = run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string() + " " + export_args);
        ASSERT_EQ(r.status, 0) << r.output;
        torch_reads(ckpt, hf, 32, extra.empty() ? "dense GQA" : "MLA + MoE");
        EXPECT_TRUE(fs::exists(hf / "config.json") && fs::exists(hf / "tokenizer.json") &&
                    fs::exists(hf / "generation_config.json"));
        const fs::path imported = dir / "imported.h5";
        r = run_quintet(0, "import --format hf --input " + hf.string() + " --output " + imported.string());
        ASSERT_EQ(r.status, 0) << r.output;
        // Parameters bit for bit.
        const auto a = quintet::testing::checkpoint_tensors(ckpt), b = quintet::testing::checkpoint_tensors(imported.string());
        size_t compared = 0;
        for (const auto& [name, values] : a) {
            if (name.rfind("params/", 0) != 0) continue;
            bool found = false;
            for (const auto& [name2, values2] : b)
                if (name2 == name) {
                    found = true;
                    EXPECT_TRUE(values == values2) << name << " differs after export + import";
                }
            EXPECT_TRUE(found) << name << " is missing from the imported checkpoint";
            ++compared;
        }
        EXPECT_GT(compared, 10u);
        // The same model: the same validation loss, and a run starts from it.
        EXPECT_EQ(eval(imported.string()), eval(ckpt));
        train("continued", extra + " --checkpoint.init_from=" + imported.string());
        // export(import(dir)): the same files' bytes.
        r = run_quintet(0, "export --checkpoint " + imported.string() + " --format hf --output " + hf2.string() + " " +
                               export_args);
        ASSERT_EQ(r.status, 0) << r.output;
        size_t files = 0;
        for (const auto& e : fs::directory_iterator(hf)) {
            if (e.path().extension() != ".safetensors" && e.path().filename() != "model.safetensors.index.json") continue;
            EXPECT_EQ(read_file(e.path()), read_file(hf2 / e.path().filename())) << e.path().filename();
            ++files;
        }
        std::printf("[ hf ] %zu tensors equal bit for bit after export + import; %zu safetensors files equal after "
                    "import + export; %s\n", compared, files, eval(imported.string()).c_str());
    }
};

TEST_F(HfRoundTrip, DenseGqaIsBitIdentical) { round_trip("", ""); }

TEST_F(HfRoundTrip, MlaMoeShardedIsBitIdentical) {
    round_trip(kMla, "--max-shard-mb 0.02");
    EXPECT_TRUE(fs::exists(dir / "hf/model.safetensors.index.json"));
}

// DeepSeek-V3's multi-token prediction module goes out as the layer after the last decoder layer,
// with its copies of the embedding and head (DeepSeek-V3's layout), and comes back bit for bit;
// readers that do not run it (Transformers, the PyTorch reader, generate) see the main model.
TEST_F(HfRoundTrip, MtpModuleRoundTrips) {
    round_trip(std::string(kMla) + " --model.mtp_depth=1", "");
    const auto cfg = nlohmann::ordered_json::parse(read_file(dir / "hf/config.json"));
    EXPECT_EQ(cfg["num_nextn_predict_layers"], 1);
    const std::string index = read_file(dir / "hf/model.safetensors");
    for (const char* n : {"model.layers.3.eh_proj.weight", "model.layers.3.embed_tokens.weight",
                          "model.layers.3.shared_head.head.weight", "model.layers.3.shared_head.norm.weight"})
        EXPECT_NE(index.find(n), std::string::npos) << n;
}

// µP's forward multipliers (logits x 1/m, attention scale x sqrt(base/head dim)) are folded into
// the exported weights (the tied head untied): PyTorch's plain Llama computes the same model.
TEST_F(HfRoundTrip, MupExportComputesTheSameModel) {
    const std::string mup = "--init.scheme=mup --init.base_width=16 --init.base_head_dim=4 ";
    for (const std::string& tied : {std::string("--model.tie_embeddings=true"), std::string(kMla)}) {
        const std::string ckpt = train(tied == kMla ? "mla" : "tied", mup + tied);
        const fs::path hf = dir / (tied == kMla ? "hf_mla" : "hf_tied");
        const auto r = run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string());
        ASSERT_EQ(r.status, 0) << r.output;
        const std::string config = read_file(hf / "config.json");
        EXPECT_NE(config.find("\"tie_word_embeddings\": false"), std::string::npos) << config;
        torch_reads(ckpt, hf, 32, tied == kMla ? "muP MLA + MoE" : "muP tied GQA");
    }
}

// Tied embeddings and YaRN (config.json's rope_scaling), evaluated past the original context.
TEST_F(HfRoundTrip, TiedYarnIsReadByPyTorch) {
    const std::string ckpt =
        train("run", "--model.tie_embeddings=true --rope.scaling=yarn --rope.factor=4 --rope.original_max_position=16");
    const fs::path hf32 = dir / "hf";
    const auto r = run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf32.string());
    ASSERT_EQ(r.status, 0) << r.output;
    torch_reads(ckpt, hf32, 48, "tied GQA, YaRN (factor 4 over 16, 48 positions)");
}

// DeepSeek-V2-Lite's shape goes out as DeepseekV2ForCausalLM (softmax, no renormalisation), whose
// attention has no YaRN softmax factor: m(0.707)^2 is folded into q_proj, and the file's
// rope_scaling keeps the cos/sin factor. PyTorch reads it as Transformers computes it, past the
// original context; imported back, it is the same model (the same loss to fp32 rounding).
TEST_F(HfRoundTrip, V2LiteShapeComputesTheSameModel) {
    const std::string ckpt = train("run", kV2Lite);
    const fs::path hf = dir / "hf";
    auto r = run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string());
    ASSERT_EQ(r.status, 0) << r.output;
    const auto cfg = nlohmann::ordered_json::parse(read_file(hf / "config.json"));
    EXPECT_EQ(cfg["architectures"][0], "DeepseekV2ForCausalLM");
    EXPECT_EQ(cfg["scoring_func"], "softmax");
    EXPECT_EQ(cfg["norm_topk_prob"], false);
    EXPECT_EQ(cfg["routed_scaling_factor"], 1.5);
    EXPECT_EQ(cfg["rope_scaling"]["mscale_all_dim"], 0.0);
    torch_reads(ckpt, hf, 48, "DeepSeek-V2-Lite shape (YaRN mscale 0.707, factor 4 over 16, 48 positions)");
    const fs::path imported = dir / "imported.h5";
    r = run_quintet(0, "import --format hf --input " + hf.string() + " --output " + imported.string());
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string a = eval(ckpt), b = eval(imported.string());
    ASSERT_FALSE(a.empty());
    ASSERT_FALSE(b.empty());
    EXPECT_NEAR(std::stod(a.substr(9)), std::stod(b.substr(9)), 1e-5) << a << " vs " << b;
}

// Routers no Transformers class computes are refused with the reason, and nothing is written.
TEST_F(HfRoundTrip, RoutersNoTransformersClassComputesAreRefused) {
    const std::string mla = "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=2 --model.kv_lora_rank=16 "
                            "--model.qk_nope_dim=8 --model.qk_rope_dim=8 --model.v_head_dim=8 --moe.experts=4 "
                            "--moe.top_k=2 --moe.ffn_dim=16 --moe.layers=1 ";
    struct Case {
        std::string args, says;
    } cases[] = {
        {"", "moe.scoring = softmax with moe.norm_topk = true"},
        {"--moe.norm_topk=false --moe.balance=aux_free", "moe.scoring = softmax with moe.balance = aux_free"},
        {"--moe.scoring=sigmoid --moe.topk_method=group_limited_greedy --moe.groups=2 --moe.group_top_k=1",
         "moe.scoring = sigmoid with moe.topk_method = group_limited_greedy"},
    };
    int k = 0;
    for (const Case& c : cases) {
        const std::string name = "run" + std::to_string(k++);
        const std::string ckpt = train(name, mla + c.args);
        const fs::path hf = dir / (name + "_hf");
        const auto r = run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string());
        EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
        EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("no Transformers class computes this router"), std::string::npos) << r.output;
        EXPECT_FALSE(fs::exists(hf)) << c.args;
    }
}

TEST_F(HfRoundTrip, BadInputIsExit2AndWritesNothing) {
    const std::string ckpt = train("run", "");
    const fs::path hf = dir / "hf";
    auto r = run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string() + " --dtype f16");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--dtype = 'f16'"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(hf));
    r = run_quintet(0, "export --checkpoint " + ckpt + " --format onnx --output " + hf.string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("valid: gguf | hf"), std::string::npos) << r.output;
    ASSERT_EQ(run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string() +
                                 " --max-shard-mb 0.01").status, 0);
    r = run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;

    const fs::path out = dir / "imported.h5";
    auto import = [&](const fs::path& in) { return run_quintet(0, "import --format hf --input " + in.string() + " --output " + out.string()); };
    // A config key quintet cannot honour.
    fs::copy(hf, dir / "gelu", fs::copy_options::recursive);
    std::string cfg = read_file(dir / "gelu/config.json");
    cfg.replace(cfg.find("\"silu\""), 6, "\"gelu\"");
    write_file(dir / "gelu/config.json", cfg);
    r = import(dir / "gelu");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("hidden_act"), std::string::npos) << r.output;
    // A shape that does not match the config.
    fs::copy(hf, dir / "shape", fs::copy_options::recursive);
    cfg = read_file(dir / "shape/config.json");
    cfg.replace(cfg.find("\"intermediate_size\": 64"), 23, "\"intermediate_size\": 96");
    write_file(dir / "shape/config.json", cfg);
    r = import(dir / "shape");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("config.json makes it"), std::string::npos) << r.output;
    // A missing shard.
    fs::copy(hf, dir / "shard", fs::copy_options::recursive);
    ASSERT_TRUE(fs::exists(dir / "shard/model.safetensors.index.json"));
    std::string second;
    for (const auto& e : fs::directory_iterator(dir / "shard"))
        if (e.path().filename().string().rfind("model-00002-of-", 0) == 0) second = e.path().filename().string();
    ASSERT_FALSE(second.empty());
    fs::remove(dir / "shard" / second);
    r = import(dir / "shard");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(second + "', named by"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << "a refused import wrote its output";
    EXPECT_FALSE(fs::exists(out.string() + ".import"));
}

// A copy of the export `hf` as `name` with config.json's `key` set to `value` (JSON text).
fs::path with_config(const fs::path& dir, const fs::path& hf, const std::string& name, const std::string& key,
                     const std::string& value) {
    const fs::path to = dir / name;
    fs::remove_all(to);
    fs::copy(hf, to, fs::copy_options::recursive);
    auto cfg = nlohmann::ordered_json::parse(read_file(to / "config.json"));
    cfg[key] = nlohmann::ordered_json::parse(value);
    write_file(to / "config.json", cfg.dump(2));
    return to;
}

// A safetensors file's header and data, to edit one and write them back.
struct Safetensors {
    nlohmann::ordered_json header;
    std::string data;
    explicit Safetensors(const fs::path& p) {
        const std::string b = read_file(p);
        uint64_t n = 0;
        std::memcpy(&n, b.data(), 8);
        header = nlohmann::ordered_json::parse(b.substr(8, n));
        data = b.substr(8 + n);
    }
    void write(const fs::path& p) const {
        std::string h = header.dump();
        h.resize((h.size() + 7) / 8 * 8, ' ');
        std::string head(8, '\0');
        const uint64_t n = h.size();
        std::memcpy(head.data(), &n, 8);
        write_file(p, head + h + data);
    }
};

// Config values quintet cannot honour are refused at import (exit 2, the config.json key named),
// not later in eval, generate or train: integers beyond 32 bits (read in 64 and range-checked,
// not truncated), a layer count the tensors do not have (at once, without allocating for it),
// and the deck's own checks (an epsilon of 0, a negative RoPE base).
TEST_F(HfRoundTrip, ImportRefusesConfigValuesBeforeAnyWork) {
    const std::string ckpt = train("run", "");
    const fs::path hf = dir / "hf", out = dir / "imported.h5";
    ASSERT_EQ(run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string()).status, 0);
    auto import = [&](const fs::path& in) {
        return run_quintet(0, "import --format hf --input " + in.string() + " --output " + out.string());
    };
    struct Case {
        const char* key;
        const char* value;
        const char* says;
    } cases[] = {
        {"vocab_size", "4294967552", "vocab_size = 4294967552: expected an integer in [1, 2147483647]"},
        {"hidden_size", "1000000000000", "hidden_size = 1000000000000: expected an integer in [1, 2147483647]"},
        {"num_attention_heads", "-4", "num_attention_heads = -4: expected an integer in [1, 2147483647]"},
        {"intermediate_size", "64.5", "intermediate_size = 64.5: expected an integer"},
        {"rms_norm_eps", "\"small\"", "rms_norm_eps = \"small\": expected a finite number"},
        {"num_hidden_layers", "1000000", "num_hidden_layers = 1000000 is not supported (the safetensors hold 2 layers"},
        {"num_hidden_layers", "1000000000", "num_hidden_layers = 1000000000 is not supported (the safetensors hold 2"},
        {"rms_norm_eps", "0", "(rms_norm_eps) makes a model quintet refuses: deck key 'model.norm_eps' = '0'"},
        {"rope_theta", "-5", "(rope_theta) makes a model quintet refuses: deck key 'rope.theta' = '-5'"},
    };
    for (const Case& c : cases) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto r = import(with_config(dir, hf, "bad", c.key, c.value));
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(r.status, 2) << c.key << " = " << c.value << "\n" << r.output;
        EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
        EXPECT_LT(s, 20.0) << c.key << " = " << c.value << " took " << s << " s";
        EXPECT_FALSE(fs::exists(out)) << c.key << " = " << c.value << ": a refused import wrote its output";
    }
}

// A tensor holding NaN or an infinity, and two tensors whose bytes overlap, are refused naming
// the tensor.
TEST_F(HfRoundTrip, ImportRefusesNonFiniteAndOverlappingTensors) {
    const std::string ckpt = train("run", "");
    const fs::path hf = dir / "hf", out = dir / "imported.h5";
    ASSERT_EQ(run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string()).status, 0);
    auto import = [&](const fs::path& in) {
        return run_quintet(0, "import --format hf --input " + in.string() + " --output " + out.string());
    };
    for (const std::string value : {"nan", "inf"}) {
        const fs::path bad = with_config(dir, hf, "nonfinite", "vocab_size", "256");
        Safetensors st(bad / "model.safetensors");
        const size_t at = st.header["model.layers.1.mlp.up_proj.weight"]["data_offsets"][0].get<size_t>() + 4 * 70;
        const float x = value == "nan" ? NAN : INFINITY;
        std::memcpy(st.data.data() + at, &x, 4);
        st.write(bad / "model.safetensors");
        const auto r = import(bad);
        EXPECT_EQ(r.status, 2) << r.output;
        EXPECT_NE(r.output.find("tensor model.layers.1.mlp.up_proj.weight holds " +
                                std::string(value == "nan" ? "NaN" : "an infinity") + " (element [2, 6])"),
                  std::string::npos) << r.output;
    }
    // model.norm.weight made to share the bytes of layer 0's input norm (same shape).
    const fs::path overlap = with_config(dir, hf, "overlap", "vocab_size", "256");
    Safetensors st(overlap / "model.safetensors");
    st.header["model.norm.weight"]["data_offsets"] = st.header["model.layers.0.input_layernorm.weight"]["data_offsets"];
    st.write(overlap / "model.safetensors");
    const auto r = import(overlap);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("overlaps tensor"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("model.norm.weight"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("model.layers.0.input_layernorm.weight"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out));
}

// The released DeepSeek configurations import as they are: on tiny tensors (16 experts, the
// released dims would be gigabytes), config.json carries each release's router, YaRN and MTP keys
// with their released values (deepseek-ai/DeepSeek-V2, -V2-Lite and -V3 on the Hugging Face Hub),
// and the imported model exports back with the same values (DeepSeek-V3's single MTP layer, absent
// from these files, is no part of quintet's model).
TEST_F(HfRoundTrip, ReleasedDeepSeekConfigsImport) {
    // Two tiny models with the released tensor sets: V3's routers hold the correction bias, V2's not.
    const std::string shape = "--model.attention=mla --model.n_kv_heads=0 --model.n_layers=3 --model.q_lora_rank=16 "
                              "--model.kv_lora_rank=16 --model.qk_nope_dim=8 --model.qk_rope_dim=8 --model.v_head_dim=8 "
                              "--moe.experts=16 --moe.top_k=2 --moe.shared_experts=1 --moe.ffn_dim=8 --moe.layers=1-2 ";
    const fs::path hf_v3 = dir / "hf_v3", hf_v2 = dir / "hf_v2";
    const std::string v3 = train("v3", shape + "--moe.scoring=sigmoid --moe.topk_method=noaux_tc --moe.balance=aux_free");
    ASSERT_EQ(run_quintet(0, "export --checkpoint " + v3 + " --format hf --output " + hf_v3.string()).status, 0);
    const std::string v2 = train("v2", shape + "--moe.norm_topk=false");
    ASSERT_EQ(run_quintet(0, "export --checkpoint " + v2 + " --format hf --output " + hf_v2.string()).status, 0);
    const char* yarn_v2 = R"({"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                              "original_max_position_embeddings": 4096, "type": "yarn"})";
    const char* yarn_v3 = R"({"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                              "original_max_position_embeddings": 4096, "type": "yarn"})";
    struct Release {
        const char* name;
        std::vector<std::pair<std::string, std::string>> keys;
    } releases[] = {
        {"DeepSeek-V2", {{"architectures", R"(["DeepseekV2ForCausalLM"])"}, {"model_type", R"("deepseek_v2")"},
                         {"scoring_func", R"("softmax")"}, {"topk_method", R"("group_limited_greedy")"},
                         {"n_group", "8"}, {"topk_group", "3"}, {"num_experts_per_tok", "6"},
                         {"norm_topk_prob", "false"}, {"routed_scaling_factor", "16.0"}, {"aux_loss_alpha", "0.003"},
                         {"max_position_embeddings", "163840"}, {"rope_scaling", yarn_v2}}},
        {"DeepSeek-V2-Lite", {{"architectures", R"(["DeepseekV2ForCausalLM"])"}, {"model_type", R"("deepseek_v2")"},
                              {"scoring_func", R"("softmax")"}, {"topk_method", R"("greedy")"}, {"n_group", "1"},
                              {"topk_group", "1"}, {"num_experts_per_tok", "6"}, {"norm_topk_prob", "false"},
                              {"routed_scaling_factor", "1.0"}, {"aux_loss_alpha", "0.001"},
                              {"max_position_embeddings", "163840"}, {"rope_scaling", yarn_v2}}},
        {"DeepSeek-V3", {{"architectures", R"(["DeepseekV3ForCausalLM"])"}, {"model_type", R"("deepseek_v3")"},
                         {"scoring_func", R"("sigmoid")"}, {"topk_method", R"("noaux_tc")"}, {"n_group", "8"},
                         {"topk_group", "4"}, {"num_experts_per_tok", "8"}, {"norm_topk_prob", "true"},
                         {"routed_scaling_factor", "2.5"}, {"aux_loss_alpha", "0.001"},
                         {"num_nextn_predict_layers", "1"}, {"max_position_embeddings", "163840"},
                         {"rope_scaling", yarn_v3}}},
    };
    for (const Release& rel : releases) {
        const fs::path in = dir / rel.name;
        fs::remove_all(in);
        fs::copy(std::string(rel.name) == "DeepSeek-V3" ? hf_v3 : hf_v2, in, fs::copy_options::recursive);
        auto cfg = nlohmann::ordered_json::parse(read_file(in / "config.json"));
        for (const auto& [k, v] : rel.keys) cfg[k] = nlohmann::ordered_json::parse(v);
        write_file(in / "config.json", cfg.dump(2));
        const fs::path out = dir / (std::string(rel.name) + ".h5");
        auto r = run_quintet(0, "import --format hf --input " + in.string() + " --output " + out.string());
        ASSERT_EQ(r.status, 0) << rel.name << "\n" << r.output;
        EXPECT_EQ(eval(out.string()).rfind("val_loss=", 0), 0u) << rel.name;
        const fs::path back = dir / (std::string(rel.name) + "_back");
        r = run_quintet(0, "export --checkpoint " + out.string() + " --format hf --output " + back.string());
        ASSERT_EQ(r.status, 0) << rel.name << "\n" << r.output;
        const auto again = nlohmann::ordered_json::parse(read_file(back / "config.json"));
        for (const char* k : {"architectures", "scoring_func", "topk_method", "n_group", "topk_group", "num_experts_per_tok",
                              "norm_topk_prob", "routed_scaling_factor"})
            EXPECT_EQ(again[k], cfg[k]) << rel.name << ": " << k;
        // YaRN: the same cos/sin and softmax factors (V2's class has no softmax factor: folded).
        EXPECT_EQ(again["rope_scaling"]["factor"], 40.0) << rel.name;
        std::printf("[ hf ] %s's config.json imports; exported back: %s\n", rel.name,
                    again["rope_scaling"].dump().c_str());
    }
}

// The deck's checks across keys run at import too: top-k 9 of 4 experts.
TEST_F(HfRoundTrip, ImportRunsTheDecksOwnChecks) {
    const std::string ckpt = train("run", kMla);
    const fs::path hf = dir / "hf", out = dir / "imported.h5";
    ASSERT_EQ(run_quintet(0, "export --checkpoint " + ckpt + " --format hf --output " + hf.string()).status, 0);
    const auto r = run_quintet(0, "import --format hf --input " +
                                      with_config(dir, hf, "topk", "num_experts_per_tok", "9").string() + " --output " +
                                      out.string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("(num_experts_per_tok) makes a model quintet refuses: deck key 'moe.top_k' = '9': must be "
                            "at most moe.experts = 4"),
              std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out));
}

}  // namespace
