// `quintet plan` as users run it for GPU clusters: no token file needed with --vocab-size or
// model.vocab_size, --hardware names and files, --parallel.KEY=V restricting the layouts, --top,
// the JSON's new keys, human units in the table, and bad input ending with exit status 2 before
// any work, naming the option, its value and what is valid; --budget / --target-loss with a law.
// ctest: labels=unit launches_mpirun
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 1024
n_layers = 16
n_heads = 16
n_kv_heads = 8
[data]
path = no_such_file.h5
seq_len = 2048
micro_batch_size = 1
[parallel]
sequence_parallel = true
microbatches = 8
[train]
precision = bf16
)";

struct PlanCmd : ::testing::Test {
    fs::path dir, deck;
    void SetUp() override {
        dir = scratch_dir(std::string("plan_cmd_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
        deck = dir / "gpu.deck";
        write_file(deck, kDeck);
    }
    RunResult plan(const std::string& args) { return run_quintet(0, "plan " + deck.string() + " " + args); }
};

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
}

}  // namespace

TEST_F(PlanCmd, GpuTableWithoutATokenFile) {
    const RunResult r = plan("--world 64 --hardware h100-sxm --vocab-size 32000 --top 5");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("h100-sxm"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("GiB"), std::string::npos) << r.output;      // human units
    EXPECT_NE(r.output.find("TFLOP/s"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("more valid layout(s) not shown"), std::string::npos) << r.output;
    // The deck key instead of the flag.
    const RunResult k = plan("--world 8 --hardware a100-sxm-80g --model.vocab_size=32000");
    EXPECT_EQ(k.status, 0) << k.output;
}

TEST_F(PlanCmd, JsonHasTheNewKeysAndRestrictions) {
    const RunResult r = plan("--world 64 --hardware h200 --vocab-size 32000 --json --parallel.tp=4");
    ASSERT_EQ(r.status, 0) << r.output;
    ASSERT_EQ(r.output.front(), '[') << r.output;
    for (const char* k : {"\"global_batch\"", "\"params_total\"", "\"params_active\"", "\"flops_per_step\"",
                          "\"tflops_per_device\"", "\"mfu\"", "\"fits\"", "\"links\"", "\"memory_bytes\"", "\"comm_bytes\""})
        EXPECT_NE(r.output.find(k), std::string::npos) << k;
    EXPECT_EQ(count(r.output, "\n {\"tp\": 4,"), count(r.output, "\n {\"tp\": "));  // only tp = 4
    write_file(dir / "plan.json", r.output);
    const RunResult py = run_shell("/usr/bin/python3 -c \"import json; rows=json.load(open('" + (dir / "plan.json").string() +
                                   "')); v=[r for r in rows if r['valid']]; assert v; "
                                   "assert all(r['links']['tp'] == 'nvlink' for r in v); "
                                   "assert all(0 < r['mfu'] < 1 and r['global_batch'] == r['dp'] * 8 for r in v); "
                                   "print(len(rows))\"");
    if (py.status != 127) EXPECT_EQ(py.status, 0) << py.output;
    const RunResult top = plan("--world 64 --hardware h200 --vocab-size 32000 --json --top 3");
    EXPECT_EQ(count(top.output, "\n {\"tp\": "), 3u) << top.output;
}

TEST_F(PlanCmd, HardwareFile) {
    write_file(dir / "mine.hw", "[device]\nbf16_tflops = 500\nfp32_tflops = 50\nmemory_gib = 64\nmemory_gbs = 2000\n"
                                "[node]\ndevices = 4\nlink_gbs = 200\nnetwork_gbs = 25\nnetwork_latency_us = 10\n");
    const RunResult r = plan("--world 16 --vocab-size 32000 --hardware " + (dir / "mine.hw").string());
    EXPECT_EQ(r.status, 0) << r.output;
    write_file(dir / "bad.hw", "[device]\nbf16_tflops = 500\nfp32_tflops = 50\nmemory_gib = 64\n"
                               "[node]\ndevices = 4\nlink_gbs = 200\nnetwork_gbs = -25\nnetwork_latency_us = 10\n");
    const RunResult bad = plan("--world 16 --vocab-size 32000 --hardware " + (dir / "bad.hw").string());
    EXPECT_EQ(bad.status, 2) << bad.output;
    EXPECT_NE(bad.output.find("node.network_gbs"), std::string::npos) << bad.output;
    write_file(dir / "short.hw", "[device]\nbf16_tflops = 500\n");
    const RunResult missing = plan("--world 16 --vocab-size 32000 --hardware " + (dir / "short.hw").string());
    EXPECT_EQ(missing.status, 2) << missing.output;
    EXPECT_NE(missing.output.find("missing key"), std::string::npos) << missing.output;
}

TEST_F(PlanCmd, BadInputExitsTwo) {
    const RunResult name = plan("--world 8 --vocab-size 32000 --hardware b200");
    EXPECT_EQ(name.status, 2);
    EXPECT_NE(name.output.find("a100-sxm-80g, h100-sxm, h200"), std::string::npos) << name.output;
    for (const char* w : {"0", "-4", "abc", "1.5", "08", "99999999999"}) {
        const RunResult r = plan(std::string("--vocab-size 32000 --world ") + w);
        EXPECT_EQ(r.status, 2) << w << ": " << r.output;
        EXPECT_NE(r.output.find("--world"), std::string::npos) << r.output;
    }
    const RunResult novocab = plan("--world 8 --hardware h100-sxm");
    EXPECT_EQ(novocab.status, 2);
    EXPECT_NE(novocab.output.find("no_such_file.h5"), std::string::npos) << novocab.output;
    EXPECT_EQ(plan("--world 8 --vocab-size 32000 --top -1").status, 2);
    EXPECT_EQ(plan("--world 8 --vocab-size 32000 --overlap tp,xp").status, 2);
    EXPECT_EQ(plan("--world 8 --vocab-size 32000 --attention sparse").status, 2);
    EXPECT_EQ(plan("--world 8 --vocab-size 0").status, 2);
    const RunResult gb = plan("--world 8 --vocab-size 32000 --train.global_batch=64 --sweep parallel.microbatches=1,2");
    EXPECT_EQ(gb.status, 2);
    EXPECT_NE(gb.output.find("train.global_batch"), std::string::npos) << gb.output;
}

TEST_F(PlanCmd, SweepsTheMicroBatchSize) {
    // With train.global_batch each (layout, micro-batch size) runs what the batch leaves; a size
    // that does not divide the per-replica batch is an invalid row naming the key.
    const RunResult r = plan("--world 8 --hardware h100-sxm --vocab-size 32000 --train.global_batch=32 "
                             "--parallel.tp=2 --parallel.pp=1 --parallel.cp=1 --sweep data.micro_batch_size=1,2,3 --json");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(count(r.output, "\"micro_batch_size\": 1,"), 1u) << r.output;
    EXPECT_EQ(count(r.output, "\"micro_batch_size\": 2,"), 1u) << r.output;
    EXPECT_EQ(count(r.output, "\"micro_batch_size\": 3,"), 1u) << r.output;
    EXPECT_NE(r.output.find("\"micro_batch_size\": 2, \"microbatches\": 4,"), std::string::npos) << r.output;  // 32 / (4 x 2)
    EXPECT_NE(r.output.find("must be a multiple of dp x data.micro_batch_size = 4 x 3"), std::string::npos) << r.output;
    const RunResult t = plan("--world 8 --hardware h100-sxm --vocab-size 32000 --sweep data.micro_batch_size=1,2 --top 2");
    ASSERT_EQ(t.status, 0) << t.output;
    EXPECT_NE(t.output.find(" mbs "), std::string::npos) << t.output;
    const RunResult bad = plan("--world 8 --vocab-size 32000 --sweep data.micro_batch_size=0");
    EXPECT_EQ(bad.status, 2) << bad.output;
    EXPECT_NE(bad.output.find("data.micro_batch_size"), std::string::npos) << bad.output;
}

// No layout of the world size at all (a --parallel.KEY=V that does not divide it), or none that
// is valid: exit 2 with the reason, not an empty table and exit 0.
TEST_F(PlanCmd, NoValidLayoutIsExitTwoWithTheReason) {
    RunResult r = plan("--world 8 --hardware h100-sxm --vocab-size 32000 --parallel.tp=3");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("plan: no layout of 8 ranks has parallel.tp = 3: tp x cp x pp x dp must be 8 (each a "
                            "divisor of it: 1, 2, 4, 8)"), std::string::npos) << r.output;
    r = plan("--world 8 --hardware h100-sxm --vocab-size 32000 --parallel.tp=2 --parallel.pp=2 --parallel.dp=4");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("has parallel.tp = 2, parallel.pp = 2, parallel.dp = 4"), std::string::npos) << r.output;
    // Every layout of 3 ranks is invalid for 16 heads split 3 ways or 16 layers in 3 stages,
    // except dp 3 and cp 3 -- which global_batch = 8 rules out (not a multiple of 3).
    r = plan("--world 3 --hardware h100-sxm --vocab-size 32000 --train.global_batch=8");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("invalid layout(s):"), std::string::npos) << r.output;  // the reasons, then the error
    EXPECT_NE(r.output.find("plan: none of the 4 layouts of 3 ranks is valid for this deck (the reasons are listed "
                            "above)"), std::string::npos) << r.output;
    r = plan("--world 3 --hardware h100-sxm --vocab-size 32000 --train.global_batch=8 --json");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(r.output.front(), '[') << r.output;
    EXPECT_NE(r.output.find("each row's reason is in the JSON"), std::string::npos) << r.output;
}

// Rows predicted within the planner's validated error of the fastest are marked as ties: in the
// table ("tie", and a line saying what it means) and as "tie" in the JSON.
TEST_F(PlanCmd, RowsWithinThePlannersErrorAreTies) {
    // The 70 B example of docs/planner.md §9: its three fastest layouts are within 0.7%.
    deck = fs::path(QUINTET_SOURCE_DIR) / "inputs/plan_70b.deck";
    const RunResult j = plan("--world 1024 --hardware h100-sxm --json");
    ASSERT_EQ(j.status, 0) << j.output;
    write_file(dir / "plan.json", j.output);
    const RunResult py = run_shell(
        "/usr/bin/python3 -c \"import json; rows=json.load(open('" + (dir / "plan.json").string() +
        "')); best=rows[0]; assert best['valid'] and best['fits'] and best['tie']; "
        "assert all((r['tie'] is None) == (not r['valid']) for r in rows); "
        "v=[r for r in rows if r['valid'] and r['fits']]; "
        "assert all(r['tie'] == (r['tokens_per_s'] * 1.125 >= best['tokens_per_s']) for r in v); "
        "n=sum(1 for r in v if r['tie']); assert 1 < n < len(v), (n, len(v)); print(n)\"");
    if (py.status == 127) GTEST_SKIP() << "no python3";
    ASSERT_EQ(py.status, 0) << py.output;
    const size_t ties = std::stoul(py.output);
    const RunResult t = plan("--world 1024 --hardware h100-sxm --top 0");
    ASSERT_EQ(t.status, 0) << t.output;
    EXPECT_EQ(count(t.output, "%  tie\n"), ties) << t.output;
    EXPECT_NE(t.output.find("tie: " + std::to_string(ties) + " layouts are predicted within 12.5% of the fastest, the "
                            "planner's validated error"), std::string::npos) << t.output;
}

TEST_F(PlanCmd, BudgetFromALaw) {
    // A law file as quintet laws --json writes it (Hoffmann et al.'s law, two bootstrap fits).
    const fs::path law = dir / "law.json";
    write_file(law, R"({"E": {"value": 1.69, "ci_low": 1.6, "ci_high": 1.8}, "A": {"value": 406.4, "ci_low": null, "ci_high": null},
 "B": {"value": 410.7}, "alpha": {"value": 0.34}, "beta": {"value": 0.28}, "a": {"value": 0.4516}, "b": {"value": 0.5484},
 "points": [], "params": "active", "fit": {"confidence": 0.95},
 "bootstrap_samples": [[1.65, 400.0, 400.0, 0.33, 0.27], [1.72, 410.0, 420.0, 0.35, 0.29], [1.70, 406.0, 410.0, 0.34, 0.28]]})");
    const std::string base = "--world 64 --hardware h100-sxm --vocab-size 32000 --law " + law.string();
    const RunResult t = plan(base + " --budget 1e21 --family aspect=64 --top 3");
    ASSERT_EQ(t.status, 0) << t.output;
    for (const char* s : {"compute-optimal: N = ", "95% interval", "nearest shape of --family aspect=64", "wall clock", "days"})
        EXPECT_NE(t.output.find(s), std::string::npos) << s << "\n" << t.output;
    const RunResult j = plan(base + " --budget 1e21 --json");
    ASSERT_EQ(j.status, 0) << j.output;
    const auto doc = nlohmann::json::parse(j.output);
    const auto& b = doc["budget"];
    EXPECT_DOUBLE_EQ(b["flops"].get<double>(), 1e21);
    // The law's own allocation: N = G (C/6)^(beta/(alpha+beta)), D = C / 6N.
    const double G = std::pow(0.34 * 406.4 / (0.28 * 410.7), 1 / 0.62), N = G * std::pow(1e21 / 6, 0.28 / 0.62);
    EXPECT_NEAR(b["N"].get<double>(), N, 1e-9 * N);
    EXPECT_NEAR(b["D"].get<double>(), 1e21 / (6 * N), 1e-9 * 1e21 / (6 * N));
    const double loss = 1.69 + 406.4 / std::pow(N, 0.34) + 410.7 / std::pow(1e21 / (6 * N), 0.28);
    EXPECT_NEAR(b["loss"].get<double>(), loss, 1e-9);
    ASSERT_EQ(b["loss_ci"].size(), 2u);
    EXPECT_LT(b["loss_ci"][0].get<double>(), b["loss_ci"][1].get<double>());
    // The deck's shape ratios (d_model 1024 over 16 layers, 16 heads of 64, 8 kv heads) at the nearest width.
    const auto& shape = b["shape"];
    const int d = shape["model.d_model"].get<int>();
    EXPECT_EQ(shape["model.n_layers"].get<int>(), int(std::lround(d / 64.0)));
    EXPECT_EQ(shape["model.n_heads"].get<int>(), d / 64);
    EXPECT_EQ(shape["model.n_kv_heads"].get<int>(), d / 128);
    EXPECT_LT(std::fabs(std::log(b["shape_N"].get<double>() / N)), 0.3) << "the nearest shape is far from N_opt";
    ASSERT_GT(doc["layouts"].size(), 0u);
    for (const auto& row : doc["layouts"]) {
        ASSERT_TRUE(row.contains("days"));
        if (row["valid"].get<bool>())
            EXPECT_NEAR(row["days"].get<double>(), b["shape_D"].get<double>() / row["tokens_per_s"].get<double>() / 86400, 1e-9 * row["days"].get<double>());
    }
    // --target-loss: the smallest budget whose optimum reaches it.
    const RunResult tl = plan(base + " --target-loss 2.2 --json");
    ASSERT_EQ(tl.status, 0) << tl.output;
    EXPECT_NEAR(nlohmann::json::parse(tl.output)["budget"]["loss"].get<double>(), 2.2, 1e-9);
    // Bad input: exit 2, naming it.
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"--budget 1e21", "--budget needs --law"},
        {"--budget -5 --law " + law.string(), "--budget = '-5'"},
        {"--budget 1e21 --target-loss 2 --law " + law.string(), "give one"},
        {"--target-loss 1.5 --law " + law.string(), "irreducible loss E"},
        {"--budget 1e21 --law " + (dir / "none.json").string(), "cannot read it"},
        {"--budget 1e21 --law " + law.string() + " --family depth=3", "'depth' is not a family key"},
        {"--law " + law.string(), "--law is used with --budget"},
    };
    for (const auto& [args, expect] : bad) {
        const RunResult r = plan("--world 64 --hardware h100-sxm --vocab-size 32000 " + args);
        EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
        EXPECT_NE(r.output.find(expect), std::string::npos) << args << "\n" << r.output;
    }
    write_file(dir / "partial.json", R"({"E": {"value": 1.69}, "A": {"value": 406.4}})");
    const RunResult partial = plan("--world 64 --hardware h100-sxm --vocab-size 32000 --budget 1e21 --law " + (dir / "partial.json").string());
    EXPECT_EQ(partial.status, 2);
    EXPECT_NE(partial.output.find("no number at B.value"), std::string::npos) << partial.output;
}
