// `quintet generate --prompts FILE` decodes the file's prompts together (--batch at a time): each
// JSON line equals what `generate --prompt` with that line and the same --seed gives (greedy and
// sampled, MHA and MLA), in the file's order; --stop-id ends a sequence; bad input is exit 2
// before any work.
// ctest: labels=unit timeout=600
#include <gtest/gtest.h>

#include <sstream>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 48
[data]
seq_len = 32
micro_batch_size = 2
[train]
steps = 3
warmup = 0
[eval]
every = 0
[checkpoint]
every = 3
[output]
log_every = 1
)";

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

// The ids of one JSON line ("ids": [a, b, ...]) as text "a b ...".
std::string ids_of(const std::string& json) {
    const size_t at = json.find("\"ids\": [");
    if (at == std::string::npos) return "";
    std::string s = json.substr(at + 8, json.find(']', at) - at - 8);
    std::string out;
    for (char c : s)
        if (c != ',') out += c;
    return out;
}

struct GeneratePrompts : ::testing::Test {
    fs::path dir;
    std::string mha, mla;
    const std::vector<std::string> prompts{"To be, or not to be", "", "What light", "O", "Romeo, Romeo, wherefore"};
    void SetUp() override {
        dir = scratch_dir("generate_prompts");
        write_file(dir / "model.deck", kDeck);
        make_token_file(dir / "tokens.h5", 4000, 256, 5);
        for (const std::string& kind : {"mha", "mla"}) {
            const std::string extra = kind == "mla" ? " --model.attention=mla --model.n_kv_heads=0 --model.kv_lora_rank=8 "
                                                      "--model.qk_nope_dim=4 --model.qk_rope_dim=4 --model.v_head_dim=8"
                                                    : "";
            const auto r = run_quintet(0, "train " + (dir / "model.deck").string() + " --data.path=" +
                                              (dir / "tokens.h5").string() + " --output.run_dir=" +
                                              (dir / kind).string() + extra);
            ASSERT_EQ(r.status, 0) << r.output;
        }
        mha = (dir / "mha/checkpoints/step_00000003.h5").string();
        mla = (dir / "mla/checkpoints/step_00000003.h5").string();
        std::string file;
        for (size_t i = 0; i < prompts.size(); ++i) file += prompts[i] + (i == 2 ? "\r\n" : "\n");  // one CRLF line
        write_file(dir / "prompts.txt", file);
    }
    // stdout of generate (stderr dropped).
    RunResult generate(const std::string& args) {
        return run_shell("( " + std::string(QUINTET_BINARY) + " generate " + args + " 2>/dev/null )");
    }
};

TEST_F(GeneratePrompts, EachLineIsThatPromptAlone) {
    for (const std::string& ck : {mha, mla})
        for (const std::string& sampling : {std::string("--temperature 0"), std::string("--temperature 0.9 --seed 3")}) {
            const auto batch = generate("--checkpoint " + ck + " --prompts " + (dir / "prompts.txt").string() +
                                        " --batch 2 --tokens 12 --print-ids " + sampling);
            ASSERT_EQ(batch.status, 0) << batch.output;
            const auto out = lines(batch.output);
            ASSERT_EQ(out.size(), prompts.size()) << batch.output;
            for (size_t i = 0; i < prompts.size(); ++i) {
                EXPECT_EQ(out[i].rfind("{\"index\": " + std::to_string(i) + ", ", 0), 0u) << out[i];
                EXPECT_NE(out[i].find("\"new_tokens\": 12, \"stop\": \"length\""), std::string::npos) << out[i];
                const auto one = generate("--checkpoint " + ck + " --prompt '" + prompts[i] + "' --tokens 12 --print-ids " +
                                          sampling);
                ASSERT_EQ(one.status, 0) << one.output;
                const auto ol = lines(one.output);
                ASSERT_FALSE(ol.empty());
                EXPECT_EQ(ids_of(out[i]), ol.back()) << ck << " " << sampling << " prompt " << i;
            }
            // The same prompts from standard input.
            const auto piped = generate("--checkpoint " + ck + " --prompts - --batch 2 --tokens 12 --print-ids " + sampling +
                                        " < " + (dir / "prompts.txt").string());
            EXPECT_EQ(piped.output, batch.output) << ck << " " << sampling;
            // Valid JSON, one object per line.
            write_file(dir / "out.jsonl", batch.output);
            const auto js = run_shell("python3 -c \"import json,sys; [json.loads(l) for l in open(sys.argv[1])]\" " +
                                      (dir / "out.jsonl").string());
            EXPECT_EQ(js.status, 0) << js.output;
        }
}

TEST_F(GeneratePrompts, StopIdEndsASequence) {
    // The third new token of prompt 0 alone, greedy, as the stop id.
    const auto one = generate("--checkpoint " + mha + " --prompt '" + prompts[0] + "' --tokens 12 --temperature 0 --print-ids");
    ASSERT_EQ(one.status, 0) << one.output;
    std::istringstream in(lines(one.output).back());
    std::vector<int> ids;
    for (int v; in >> v;) ids.push_back(v);
    ASSERT_GT(ids.size(), 12u) << one.output;
    const size_t plen = ids.size() - 12;
    const int stop = ids[plen + 2];
    size_t first = plen;  // the first new token equal to it
    while (ids[first] != stop) ++first;
    const auto batch = generate("--checkpoint " + mha + " --prompts " + (dir / "prompts.txt").string() +
                                " --tokens 12 --temperature 0 --print-ids --stop-id " + std::to_string(stop));
    ASSERT_EQ(batch.status, 0) << batch.output;
    const auto out = lines(batch.output);
    ASSERT_EQ(out.size(), prompts.size());
    EXPECT_NE(out[0].find("\"new_tokens\": " + std::to_string(first - plen + 1) + ", \"stop\": \"stop_id\""),
              std::string::npos) << out[0];
    std::string want;
    for (size_t i = 0; i <= first; ++i) want += (i ? " " : "") + std::to_string(ids[i]);
    EXPECT_EQ(ids_of(out[0]), want);
    // The single-prompt path stops at the same token.
    const auto single = generate("--checkpoint " + mha + " --prompt '" + prompts[0] +
                                 "' --tokens 12 --temperature 0 --print-ids --stop-id " + std::to_string(stop));
    EXPECT_EQ(lines(single.output).back(), want);
}

TEST_F(GeneratePrompts, BadInputIsRefusedBeforeAnyWork) {
    const std::string base = "generate --checkpoint " + mha + " ";
    const std::string file = (dir / "prompts.txt").string();
    write_file(dir / "empty.txt", "");
    const std::vector<std::pair<std::string, std::string>> cases{
        {"--prompts " + (dir / "missing.txt").string(), "--prompts '" + (dir / "missing.txt").string() + "': cannot read it"},
        {"--prompts " + (dir / "empty.txt").string(), "has no line: give one prompt per line"},
        {"--prompts " + file + " --prompt hi", "leave out --prompt and --prompt-ids"},
        {"--prompts " + file + " --probs " + (dir / "p.f32").string(), "leave out --probs"},
        {"--prompts " + file + " --batch 0", "--batch = 0: must be >= 1"},
        {"--prompts " + file + " --stop-id 256", "--stop-id = 256: a token id (0 to 255) or -1 for none"},
        {"--prompts " + file + " --threads -1", "--threads = -1: 0 (OMP_NUM_THREADS or every core) to 4096"},
    };
    for (const auto& [args, said] : cases) {
        const auto r = run_quintet(0, base + args);
        EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
        EXPECT_NE(r.output.find(said), std::string::npos) << args << "\n" << r.output;
    }
    EXPECT_FALSE(fs::exists(dir / "p.f32"));
}

}  // namespace
