// `quintet metrics`: a run's metrics.h5 as CSV and JSON Lines, every group, against the HDF5
// datasets themselves; python's csv and json modules read the output (as a dashboard would).
// ctest: labels=mpi timeout=600 launches_mpirun
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
ffn_dim = 64
[moe]
experts = 4
top_k = 2
layers = 1
[data]
seq_len = 32
micro_batch_size = 2
[train]
steps = 4
lr = 1e-2
warmup = 1
peak_tflops = 0.1
[eval]
every = 2
batches = 2
[checkpoint]
every = 0
[output]
log_every = 2
)";

struct MetricsCmd : TrainFixture {
    void SetUp() override { prepare("metrics_", kDeck, 3); }
    std::vector<std::string> lines(const std::string& text) {
        std::vector<std::string> out;
        std::istringstream in(text);
        for (std::string l; std::getline(in, l);) out.push_back(l);
        return out;
    }
};

TEST_F(MetricsCmd, CsvAndJsonLinesOfEveryGroup) {
    ASSERT_EQ(train(2, "run", "--parallel.microbatches=1").status, 0);
    const fs::path run = dir / "run";
    RunResult csv = run_quintet(0, "metrics " + run.string());
    ASSERT_EQ(csv.status, 0) << csv.output;
    auto l = lines(csv.output);
    ASSERT_EQ(l.size(), 5u) << csv.output;  // header + 4 steps
    EXPECT_EQ(l[0].rfind("step,", 0), 0u) << l[0];
    EXPECT_NE(l[0].find(",loss,"), std::string::npos) << l[0];
    // The loss of step 3 as HDF5 holds it, to the printed precision.
    const auto loss = metrics_column(run, "/train/loss");
    std::istringstream row(l[3]);
    std::vector<std::string> cells;
    for (std::string c; std::getline(row, c, ',');) cells.push_back(c);
    std::istringstream head(l[0]);
    size_t at = 0, k = 0;
    for (std::string c; std::getline(head, c, ','); ++k)
        if (c == "loss") at = k;
    EXPECT_NEAR(std::stod(cells[at]), loss[2], 1e-9 * std::abs(loss[2]));
    RunResult ev = run_quintet(0, "metrics " + run.string() + " --group eval --jsonl");
    ASSERT_EQ(ev.status, 0) << ev.output;
    EXPECT_EQ(lines(ev.output).size(), 2u) << ev.output;  // steps 2 and 4
    EXPECT_EQ(ev.output.rfind("{\"step\": 2, \"loss\": ", 0), 0u) << ev.output;
    RunResult moe = run_quintet(0, "metrics " + run.string() + " --group moe");
    ASSERT_EQ(moe.status, 0) << moe.output;
    EXPECT_NE(moe.output.find("expert_load.1.3"), std::string::npos) << moe.output;  // layer 1, expert 3
    RunResult mem = run_quintet(0, "metrics " + run.string() + " --group memory");
    ASSERT_EQ(mem.status, 0) << mem.output;
    EXPECT_NE(mem.output.find("activations_bytes.1"), std::string::npos) << mem.output;  // rank 1
    // What a dashboard does: python's csv and json modules read it.
    write_file(dir / "m.csv", csv.output);
    write_file(dir / "m.jsonl", ev.output);
    RunResult py = run_shell("/usr/bin/python3 -c \"import csv, json; r = list(csv.DictReader(open('" + (dir / "m.csv").string() +
                             "'))); j = [json.loads(x) for x in open('" + (dir / "m.jsonl").string() +
                             "')]; print(len(r), float(r[0]['loss']) > 0, j[-1]['step'])\"");
    if (py.status == 0) EXPECT_EQ(py.output, "4 True 4\n");
    // Bad input: exit 2 with the reason.
    RunResult bad = run_quintet(0, "metrics " + run.string() + " --group weights");
    EXPECT_EQ(bad.status, 2);
    EXPECT_NE(bad.output.find("valid are train, eval"), std::string::npos) << bad.output;
    RunResult missing = run_quintet(0, "metrics " + (dir / "nothing").string());
    EXPECT_EQ(missing.status, 2);
}

// --group data labels each training source's column with the name the file stores for it
// (/data/source_samples' "sources"), not its index.
TEST_F(MetricsCmd, DataColumnsAreNamedByTheirSources) {
    make_token_file(dir / "prose.h5", 6000, 256, 11);
    make_token_file(dir / "code.h5", 6000, 256, 12);
    const RunResult r = train(1, "blend", "--parallel.microbatches=1 --moe.experts=0 '--data.path=0.7 " +
                                              (dir / "prose.h5").string() + ", 0.3 " + (dir / "code.h5").string() + "'");
    ASSERT_EQ(r.status, 0) << r.output;
    RunResult csv = run_quintet(0, "metrics " + (dir / "blend").string() + " --group data");
    ASSERT_EQ(csv.status, 0) << csv.output;
    auto l = lines(csv.output);
    ASSERT_EQ(l.size(), 5u) << csv.output;
    EXPECT_EQ(l[0], "step,source_samples.prose,source_samples.code") << csv.output;
    RunResult js = run_quintet(0, "metrics " + (dir / "blend").string() + " --group data --jsonl");
    ASSERT_EQ(js.status, 0) << js.output;
    EXPECT_NE(js.output.find("\"source_samples.prose\": "), std::string::npos) << js.output;
    EXPECT_NE(js.output.find("\"source_samples.code\": "), std::string::npos) << js.output;
}

}  // namespace
