// train.trace_steps and `quintet trace` (docs/observability.md): real runs' per-rank timelines
// merged and read back by an independent Trace Event parser (npm @tracerbench/trace-model,
// installed into the build tree; skipped without Node >= 20 or a registry): every rank present
// and named with its host and grid coordinates, every thread's events nested and in order, each
// traced step's compute and waits adding up to the step (and to /ranks/* in metrics.h5), and the
// schedules' shapes (1F1B: stage 0's first backward after pp forwards; zb_h1: B and W apart).
// Bad input is refused before any work with exit status 2.
// ctest: labels=mpi timeout=900 launches_mpirun
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <set>
#include <unistd.h>

#include "interop/node_support.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;
using nlohmann::json;

namespace {

const fs::path kSource = QUINTET_SOURCE_DIR;
const fs::path kBinary = QUINTET_BINARY;

const char* kDeck = R"([model]
d_model = 64
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_dim = 128
[data]
seq_len = 32
micro_batch_size = 2
[train]
steps = 6
lr = 1e-3
warmup = 2
peak_tflops = 0.1
[parallel]
microbatches = 4
[checkpoint]
every = 0
[output]
log_every = 1
)";

std::string host() {
    char h[256] = {0};
    gethostname(h, sizeof h - 1);
    return h;
}

struct Timeline : TrainFixture {
    static std::string skip;
    static fs::path modules;
    static void SetUpTestSuite() {
        const fs::path prefix = kBinary.parent_path() / "npm" / "trace";
        skip = node::ensure_packages(prefix, "@tracerbench/trace-model@8.0.0", {"@tracerbench/trace-model/package.json"});
        modules = prefix / "node_modules";
    }
    void SetUp() override { prepare("timeline_", kDeck, 7); }

    // `quintet trace RUN` and the parser's reading of it (asserting on failure).
    json merged_and_checked(const std::string& run) {
        const RunResult t = run_quintet(0, "trace " + (dir / run).string());
        EXPECT_EQ(t.status, 0) << t.output;
        EXPECT_NE(t.output.find("wrote " + (dir / run / "trace.json").string()), std::string::npos) << t.output;
        if (!skip.empty()) return json();
        const RunResult r = run_shell("node '" + (kSource / "tests/train/trace_check.cjs").string() + "' '" +
                                      modules.string() + "' '" + (dir / run / "trace.json").string() + "'");
        EXPECT_EQ(r.status, 0) << r.output;
        const auto lines = node::lines_of(r.output);
        return lines.empty() ? json() : json::parse(lines.back(), nullptr, false);
    }
};
std::string Timeline::skip;
fs::path Timeline::modules;

}  // namespace

// A 4-rank pp x tp trace: every rank, its name, nesting and order, the steps' sums, 1F1B's shape.
TEST_F(Timeline, MergedTracePartsAddUpToTheSteps) {
    const RunResult r = train(4, "pptp", "--parallel.pp=2 --parallel.tp=2 --train.trace_steps=3-4");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("trace: recording steps 3-4 on every rank"), std::string::npos) << r.output;
    for (int k = 0; k < 4; ++k) EXPECT_TRUE(fs::exists(dir / "pptp/trace" / ("rank" + std::to_string(k) + ".json")));
    const json out = merged_and_checked("pptp");
    if (!skip.empty()) GTEST_SKIP() << "SKIPPED (the Trace Event parser): " << skip;
    ASSERT_TRUE(out.is_object());
    // Every rank, named with its host and coordinates (rank = tp + 2 pp), with its activities.
    ASSERT_EQ(out["processes"].size(), 4u);
    for (const json& p : out["processes"]) {
        const int rank = p["rank"];
        const std::string want = "rank " + std::to_string(rank) + " (" + host() + ", pp stage " +
                                 std::to_string(rank / 2) + ", tp " + std::to_string(rank % 2) + ")";
        EXPECT_EQ(p["name"], want);
        std::set<std::string> threads(p["threads"].begin(), p["threads"].end());
        for (const char* t : {"step", "compute", "tp", "pp"}) EXPECT_TRUE(threads.count(t)) << want << " has no " << t;
    }
    EXPECT_EQ(out["nesting_violations"], 0);
    EXPECT_EQ(out["order_violations"], 0);
    // Each traced step: compute (less the waits inside) + the waits = the step, within 5% (the
    // few untimed instructions between events); and the step is the one metrics.h5 measured.
    const std::vector<double> step_time = metrics_column(dir / "pptp", "/ranks/step_time_s");
    const std::vector<double> compute = metrics_column(dir / "pptp", "/ranks/compute_s");
    ASSERT_EQ(step_time.size(), 6u * 4);
    ASSERT_EQ(out["steps"].size(), 2u * 4);
    for (const json& s : out["steps"]) {
        const int rank = s["rank"], step = s["step"];
        const double dur = s["dur"].get<double>() * 1e-6, parts = (s["compute"].get<double>() + s["waits"].get<double>()) * 1e-6;
        EXPECT_NEAR(parts, dur, 0.05 * dur + 2e-4) << "rank " << rank << " step " << step;
        const size_t row = size_t(step - 1) * 4 + size_t(rank);
        EXPECT_NEAR(dur, step_time[row], 0.02 * dur + 5e-4) << "rank " << rank << " step " << step;
        EXPECT_NEAR(s["compute"].get<double>() * 1e-6, compute[row], 0.05 * dur + 5e-4) << "rank " << rank;
    }
    // 1F1B on 2 stages, 4 microbatches: stage 0 runs pp = 2 forwards before its first backward,
    // the last stage alternates from the start.
    const std::vector<std::string> s0 = out["schedule"]["0"], s1 = out["schedule"]["2"];
    EXPECT_EQ(s0, (std::vector<std::string>{"F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"}));
    EXPECT_EQ(s1, (std::vector<std::string>{"F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"}));
}

// pp = 4: stage 0's first backward after 4 forwards; zb_h1: every backward in two parts, B and W.
TEST_F(Timeline, SchedulesShowTheirShape) {
    ASSERT_EQ(train(4, "pp4", "--parallel.pp=4 --parallel.microbatches=8 --train.trace_steps=2").status, 0);
    ASSERT_EQ(train(2, "zb", "--parallel.pp=2 --parallel.schedule=zb_h1 --train.trace_steps=2-3").status, 0);
    const json pp4 = merged_and_checked("pp4");
    const json zb = merged_and_checked("zb");
    if (!skip.empty()) GTEST_SKIP() << "SKIPPED (the Trace Event parser): " << skip;
    const std::vector<std::string> s0 = pp4["schedule"]["0"];
    ASSERT_EQ(s0.size(), 16u);
    size_t forwards = 0;
    while (forwards < s0.size() && s0[forwards][0] == 'F') ++forwards;
    EXPECT_EQ(forwards, 4u) << "stage 0's first backward comes after pp forwards";
    const std::vector<std::string> last = pp4["schedule"]["3"];
    EXPECT_EQ(last[0], "F0");
    EXPECT_EQ(last[1], "B0");
    for (const char* r : {"0", "1"}) {
        const std::vector<std::string> s = zb["schedule"][r];
        int b = 0, w = 0, whole = 0;
        for (const std::string& a : s) b += a.rfind("Bi", 0) == 0, w += a[0] == 'W', whole += a[0] == 'B' && a[1] != 'i';
        EXPECT_EQ(b, 4) << "rank " << r;
        EXPECT_EQ(w, 4) << "rank " << r;
        EXPECT_EQ(whole, 0) << "rank " << r;
    }
    EXPECT_EQ(zb["nesting_violations"], 0);
}

// Bad input: before any work (nothing written in run_dir), exit status 2, the key named.
TEST_F(Timeline, BadInputIsRefusedBeforeAnyWork) {
    struct Case {
        std::string extra, needle;
    };
    const std::vector<Case> cases = {
        {"--train.trace_steps=5-7", "train.trace_steps"},    // past train.steps = 6
        {"--train.trace_steps=0-3", "train.trace_steps"},    // steps count from 1
        {"--train.trace_steps=4-2", "train.trace_steps"},    // backwards
        {"--train.trace_steps=3-x", "train.trace_steps"},    // not a range
        {"--train.straggler_ratio=1", "train.straggler_ratio"},
        {"--train.straggler_ratio=0.5", "train.straggler_ratio"},
    };
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::string run = "bad" + std::to_string(i);
        const RunResult r = train(2, run, cases[i].extra);
        EXPECT_EQ(r.status, 2) << cases[i].extra << "\n" << r.output;
        EXPECT_NE(r.output.find(cases[i].needle), std::string::npos) << r.output;
        EXPECT_FALSE(fs::exists(dir / run / "metrics.h5")) << cases[i].extra;
    }
    // A trace folder that cannot be made: a file in its way, left as it was.
    fs::create_directories(dir / "blocked");
    write_file(dir / "blocked/trace", "mine");
    const RunResult r = train(2, "blocked", "--train.trace_steps=2-3");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("train.trace_steps"), std::string::npos) << r.output;
    EXPECT_EQ(read_file(dir / "blocked/trace"), "mine");
    EXPECT_FALSE(fs::exists(dir / "blocked/metrics.h5"));
    // quintet trace: no timeline, a torn rank file, an output folder that does not exist.
    EXPECT_EQ(run_quintet(0, "trace " + (dir / "bad0").string()).status, 2);
    ASSERT_EQ(train(2, "torn", "--train.steps=2 --train.trace_steps=1-2").status, 0);
    EXPECT_EQ(run_quintet(0, "trace " + (dir / "torn").string() + " -o " + (dir / "nowhere/x.json").string()).status, 2);
    write_file(dir / "torn/trace/rank1.json", "{\"traceEvents\":[");
    const RunResult t = run_quintet(0, "trace " + (dir / "torn").string());
    EXPECT_EQ(t.status, 2) << t.output;
    EXPECT_NE(t.output.find("rank1.json"), std::string::npos) << t.output;
}
