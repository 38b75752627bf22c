// `quintet laws` as a user runs it on a CSV: the text table, the JSON's keys (E, A, B, alpha,
// beta, a, b, each {"value", "ci_low", "ci_high"}, and the points), the plot, a D or a C column,
// failed runs listed and left out, --exclude-highest, and every bad input of docs/scaling-laws.md
// ending with exit status 2, a message naming it, and no PNG written.
// ctest: labels=unit launches_mpirun
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

// A law of a CPU study's size: L = 1.2 + 25/N^0.3 + 60/D^0.36.
double law(double N, double D) { return 1.2 + 25.0 / std::pow(N, 0.3) + 60.0 / std::pow(D, 0.36); }

// budgets x shapes rows around each budget's optimum, 0.5% noise; `cols` picks the columns.
std::string csv(const std::vector<double>& budgets, int shapes, const std::string& cols = "N,D,loss,budget") {
    std::mt19937 rng(7);
    std::normal_distribution<double> eps(0, 0.005);
    std::ostringstream o;
    o.precision(17);
    o << cols << "\n";
    for (double C : budgets) {
        const double G = std::pow(0.3 * 25.0 / (0.36 * 60.0), 1 / 0.66), nopt = G * std::pow(C / 6, 0.36 / 0.66);
        for (int k = 0; k < shapes; ++k) {
            const double N = nopt * std::exp(0.5 * (k - (shapes - 1) / 2.0)), D = C / (6 * N);
            const double loss = law(N, D) * std::exp(eps(rng));
            if (cols == "N,D,loss,budget") o << N << "," << D << "," << loss << "," << C << "\n";
            else if (cols == "N,C,loss") o << N << "," << C << "," << loss << "\n";
            else if (cols == "run,N,D,loss,status") o << "r" << k << "_" << C << "," << N << "," << D << "," << loss << ",done\n";
        }
    }
    return o.str();
}

struct LawsCmd : ::testing::Test {
    fs::path dir;
    void SetUp() override {
        dir = scratch_dir(std::string("laws_cmd_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    }
    fs::path file(const std::string& name, const std::string& text) {
        write_file(dir / name, text);
        return dir / name;
    }
    RunResult laws(const std::string& args) { return run_quintet(0, "laws " + args); }
};

}  // namespace

TEST_F(LawsCmd, TableJsonAndPlot) {
    const fs::path in = file("runs.csv", csv({1e11, 3e11, 1e12}, 5));
    const RunResult t = laws(in.string() + " --bootstrap 100");
    ASSERT_EQ(t.status, 0) << t.output;
    for (const char* s : {"15 run(s) in 3 budget(s)", "parametric law", "alpha", "beta", "IsoFLOP profiles", "a (N_opt ~ C^a)",
                          "100 of 100 resamples"})
        EXPECT_NE(t.output.find(s), std::string::npos) << s << "\n" << t.output;
    // JSON on stdout alone (warnings go to stderr).
    const RunResult j = run_shell("(" + std::string(QUINTET_BINARY) + " laws " + in.string() + " --bootstrap 100 --json 2>/dev/null)");
    ASSERT_EQ(j.status, 0) << j.output;
    const auto doc = nlohmann::json::parse(j.output);
    for (const char* k : {"E", "A", "B", "alpha", "beta", "a", "b"}) {
        ASSERT_TRUE(doc.contains(k)) << k;
        for (const char* f : {"value", "ci_low", "ci_high"}) ASSERT_TRUE(doc[k][f].is_number()) << k << "." << f;
        EXPECT_LE(doc[k]["ci_low"].get<double>(), doc[k]["value"].get<double>()) << k;
        EXPECT_GE(doc[k]["ci_high"].get<double>(), doc[k]["value"].get<double>()) << k;
    }
    ASSERT_EQ(doc["points"].size(), 15u);
    for (const char* f : {"N", "D", "C", "loss", "budget", "predicted", "residual"}) EXPECT_TRUE(doc["points"][0].contains(f)) << f;
    EXPECT_EQ(doc["bootstrap_samples"].size(), 100u);
    EXPECT_NEAR(doc["alpha"]["value"].get<double>(), 0.3, 0.1);
    EXPECT_NEAR(doc["a"]["value"].get<double>(), 0.36 / 0.66, 0.1);
    EXPECT_EQ(doc["isoflop"]["budgets"].size(), 3u);
    // The plot: written whole, nothing left beside it.
    const RunResult p = laws(in.string() + " --bootstrap 50 -o " + (dir / "law.png").string());
    ASSERT_EQ(p.status, 0) << p.output;
    ASSERT_TRUE(fs::exists(dir / "law.png")) << p.output;
    EXPECT_GT(fs::file_size(dir / "law.png"), 20000u);
    EXPECT_FALSE(fs::exists(dir / "law.png.tmp.png"));
    EXPECT_FALSE(fs::exists(dir / "law.png.tmp.json"));
    RunResult h = laws("--help");
    EXPECT_EQ(h.status, 0);
    for (const char* k : {"--bootstrap N", "--json", "-o PLOT.png", "--exclude-highest K"}) EXPECT_NE(h.output.find(k), std::string::npos) << k;
}

TEST_F(LawsCmd, CColumnFailedRunsAndHeldOutBudgets) {
    // C instead of D (D = C / 6N), budgets grouped from C.
    const RunResult c = laws(file("c.csv", csv({1e11, 3e11, 1e12}, 5, "N,C,loss")).string() + " --bootstrap 0");
    ASSERT_EQ(c.status, 0) << c.output;
    EXPECT_NE(c.output.find("15 run(s) in 3 budget(s)"), std::string::npos) << c.output;
    // A failed run is listed and left out, not averaged in.
    std::string text = csv({1e11, 3e11, 1e12}, 5, "run,N,D,loss,status");
    text += "broken,1e5,1e6,nan,failed\n";
    const RunResult f = laws(file("f.csv", text).string() + " --bootstrap 0");
    ASSERT_EQ(f.status, 0) << f.output;
    EXPECT_NE(f.output.find("left out: broken: status failed"), std::string::npos) << f.output;
    EXPECT_NE(f.output.find("15 run(s)"), std::string::npos) << f.output;
    // --exclude-highest 1: fitted on two budgets, the third predicted.
    const RunResult x = laws(file("x.csv", csv({1e11, 3e11, 1e12}, 5)).string() + " --bootstrap 0 --exclude-highest 1");
    ASSERT_EQ(x.status, 0) << x.output;
    EXPECT_NE(x.output.find("10 run(s) in 2 budget(s)"), std::string::npos) << x.output;
    EXPECT_NE(x.output.find("held out (--exclude-highest 1)"), std::string::npos) << x.output;
    // One budget: the law is still fitted, the IsoFLOP exponents are not, and it says why.
    const RunResult one = laws(file("one.csv", csv({1e11}, 7)).string() + " --bootstrap 30");
    ASSERT_EQ(one.status, 0) << one.output;
    EXPECT_NE(one.output.find("one budget"), std::string::npos) << one.output;
    EXPECT_NE(one.output.find("laws: warning:"), std::string::npos) << one.output;
}

TEST_F(LawsCmd, BadInputExitsTwoAndWritesNothing) {
    const std::string png = (dir / "bad.png").string();
    struct Case {
        std::string name, text, args, expect;
    };
    const std::string good = csv({1e11, 3e11}, 3);
    const std::vector<Case> cases = {
        {"nocols.csv", "N,loss\n1e5,2.0\n", "", "no column D or C"},
        {"noloss.csv", "N,D\n1e5,1e6\n", "", "no column loss"},
        {"nan.csv", "N,D,loss\n1e5,1e6,nan\n", "", "line 2: loss = 'nan': expected a finite positive number"},
        {"inf.csv", "N,D,loss\n1e5,1e6,inf\n", "", "loss = 'inf'"},
        {"zero.csv", "N,D,loss\n1e5,1e6,0\n", "", "loss = '0'"},
        {"negn.csv", "N,D,loss\n-1e5,1e6,2\n", "", "N = '-1e5'"},
        {"zerod.csv", "N,D,loss\n1e5,0,2\n", "", "D = '0'"},
        {"text.csv", "N,D,loss\n1e5,many,2\n", "", "D = 'many'"},
        {"short.csv", "N,D,loss\n1e5,1e6\n", "", "2 cells, the header has 3"},
        {"few.csv", "N,D,loss\n1e5,1e6,3\n2e5,1e6,2.9\n3e5,1e6,2.8\n4e5,1e6,2.7\n", "", "4 run(s) to fit"},
        {"empty.csv", "", "", "is empty"},
        {"header.csv", "N,D,loss\n", "", "has a header but no rows"},
        {"twice.csv", "N,N,D,loss\n1,1,1,1\n", "", "named twice"},
        {"ok1.csv", good, "--exclude-highest 2", "--exclude-highest 2 leaves no budget"},
        {"ok2.csv", good, "--bootstrap -1", "--bootstrap = '-1'"},
        {"ok3.csv", good, "--loss train", "--loss applies to a study.h5"},
        {"ok4.csv", good, "--frobnicate", "unknown option '--frobnicate'"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        const RunResult r = laws(file(c.name, c.text).string() + " " + c.args + " -o " + png);
        EXPECT_EQ(r.status, 2) << r.output;
        EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
        EXPECT_FALSE(fs::exists(png)) << "a PNG was written for bad input";
    }
    // No such file; an HDF5 file that is not a laws study (a token file).
    RunResult none = laws((dir / "missing.csv").string());
    EXPECT_EQ(none.status, 2);
    EXPECT_NE(none.output.find("no such file"), std::string::npos) << none.output;
    make_token_file(dir / "tokens.h5", 1000, 64, 1);
    RunResult h5 = laws((dir / "tokens.h5").string());
    EXPECT_EQ(h5.status, 2);
    EXPECT_NE(h5.output.find("holds no scaling-law runs"), std::string::npos) << h5.output;
    RunResult noarg = laws("");
    EXPECT_EQ(noarg.status, 2);
    RunResult nodir = laws(file("ok5.csv", good).string() + " -o " + (dir / "nowhere" / "x.png").string());
    EXPECT_EQ(nodir.status, 2);
    EXPECT_NE(nodir.output.find("does not exist"), std::string::npos) << nodir.output;
}
