// A [laws] study run for real (local submission): each (budget, shape) trained on D = C / (6N)
// tokens with train.steps from D and the global batch and the schedule ending with the run;
// study.h5's N (three counts), D, C, exact FLOPs and final losses; `quintet laws` on it; a run
// that fails is listed in study.h5 and left out of the fit; bad [laws] sections exit 2.
// ctest: labels=mpi,study timeout=600 launches_mpirun
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kBase = R"([model]
d_model = 32
n_layers = 2
n_heads = 4
ffn_dim = 64
[data]
seq_len = 32
micro_batch_size = 4
val_fraction = 0.1
[train]
lr = 1e-2
lr_min = 1e-3
warmup = 2
[eval]
every = 0
batches = 2
[checkpoint]
every = 0
[output]
log_every = 50
)";

double attr(hid_t g, const char* name) {
    double v = std::nan("");
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    if (a >= 0) H5Aread(a, H5T_NATIVE_DOUBLE, &v), H5Aclose(a);
    return v;
}

std::string attr_str(hid_t g, const char* name) {
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    if (a < 0) return "";
    hid_t t = H5Aget_type(a);
    std::string out(H5Tget_size(t), '\0');
    H5Aread(a, t, out.data());
    H5Tclose(t), H5Aclose(a);
    return out.c_str();
}

struct LawsStudy : ::testing::Test {
    fs::path dir, data;
    void SetUp() override {
        dir = scratch_dir(std::string("laws_study_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
        data = dir / "data.h5";
        make_token_file(data, 30000, 64, 5);
        write_file(dir / "base.deck", std::string(kBase) + "[data]\npath = " + data.string() + "\n");
    }
    fs::path study(const std::string& name, const std::string& laws, const std::string& extra = "") {
        fs::path p = dir / (name + ".deck");
        write_file(p, "[study]\nbase = base.deck\ndir = " + (dir / name).string() + "\n" + extra + "[laws]\n" + laws);
        return p;
    }
};

}  // namespace

TEST_F(LawsStudy, RunsByBudgetGathersAndFits) {
    const std::string laws = "budgets = 1e8, 3e8\nfamily = widths=16,24,32 aspect=16 head_dim=8\nparams = non_embedding\n"
                             "warmup_fraction = 0.1\n";
    const fs::path s = study("a", laws);
    // The dry run lists every (budget, shape) with N, D and steps, and runs nothing.
    const RunResult dry = run_quintet(0, "study " + s.string() + " --dry-run");
    ASSERT_EQ(dry.status, 0) << dry.output;
    EXPECT_NE(dry.output.find("6 run(s)"), std::string::npos) << dry.output;
    EXPECT_NE(dry.output.find("C1e8_d16_l1"), std::string::npos) << dry.output;
    EXPECT_NE(dry.output.find("C3e8_d32_l2"), std::string::npos) << dry.output;
    EXPECT_FALSE(fs::exists(dir / "a" / "runs"));

    const RunResult r = run_quintet(0, "study " + s.string());
    ASSERT_EQ(r.status, 0) << r.output;
    hid_t f = H5Fopen((dir / "a" / "study.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0) << r.output;
    EXPECT_EQ(attr_str(f, "kind"), "laws");
    EXPECT_EQ(attr_str(f, "laws_params"), "non_embedding");
    EXPECT_EQ(attr_str(f, "laws_family"), "widths=16,24,32 aspect=16 head_dim=8");
    const double tokens_per_step = 4 * 32;  // the base deck's global batch x seq_len
    for (const char* name : {"C1e8_d16_l1", "C1e8_d24_l2", "C1e8_d32_l2", "C3e8_d16_l1", "C3e8_d24_l2", "C3e8_d32_l2"}) {
        SCOPED_TRACE(name);
        hid_t g = H5Gopen2(f, (std::string("/runs/") + name).c_str(), H5P_DEFAULT);
        ASSERT_GE(g, 0);
        EXPECT_EQ(attr_str(g, "status"), "done");
        const double C = attr(g, "budget"), N = attr(g, "N"), D = attr(g, "D"), steps = attr(g, "steps");
        EXPECT_EQ(N, attr(g, "N_non_embedding"));
        EXPECT_GT(attr(g, "N_total"), attr(g, "N_active"));  // the embedding: in the total, not multiplied
        EXPECT_GT(attr(g, "N_active"), N);                   // the LM head: multiplied, not non-embedding
        // D = C / 6N in whole steps: within half a step of it.
        EXPECT_EQ(D, steps * tokens_per_step);
        EXPECT_LE(std::fabs(D - C / (6 * N)), 0.5 * tokens_per_step + 1e-9);
        EXPECT_DOUBLE_EQ(attr(g, "C"), 6 * N * D);
        EXPECT_GT(attr(g, "flops"), 6 * attr(g, "N_active") * D);  // attention counted too
        EXPECT_TRUE(std::isfinite(attr(g, "val_loss")));
        EXPECT_GT(attr(g, "val_loss"), 0);
        EXPECT_TRUE(std::isfinite(attr(g, "train_loss_smoothed")));
        // The run trained exactly its steps, its schedule ended with it, and it evaluated at the end.
        const fs::path run = dir / "a" / "runs" / name;
        EXPECT_EQ(metrics_column(run, "/train/step").size(), size_t(steps));
        const auto lr = metrics_column(run, "/train/lr");
        ASSERT_FALSE(lr.empty());
        // The cosine of a schedule whose train.steps is the run's: at its last step s = S-1 (warm-up
        // W = 10% of S) lr = lr_min + (lr - lr_min)(1 + cos(pi (S-1-W)/(S-W)))/2, one step from lr_min.
        const double S = steps, W = std::floor(0.1 * S);
        const double want = 1e-3 + 0.5 * (1e-2 - 1e-3) * (1 + std::cos(M_PI * (S - 1 - W) / (S - W)));
        EXPECT_NEAR(lr.back(), want, 1e-6 * want) << "the schedule does not end with the run";
        const auto eval_steps = metrics_column(run, "/eval/step");
        ASSERT_FALSE(eval_steps.empty());
        EXPECT_EQ(eval_steps.back(), steps);
        EXPECT_NEAR(metrics_column(run, "/eval/loss").back(), attr(g, "val_loss"), 1e-12);
        H5Gclose(g);
    }
    H5Fclose(f);
    // quintet laws reads the study folder: 6 points, N as the study counted it.
    const RunResult j = run_shell("(" + std::string(QUINTET_BINARY) + " laws " + (dir / "a").string() + " --bootstrap 20 --json 2>/dev/null)");
    ASSERT_EQ(j.status, 0) << j.output;
    const auto law = nlohmann::json::parse(j.output);
    EXPECT_EQ(law["points"].size(), 6u);
    EXPECT_EQ(law["params"], "non_embedding");
    EXPECT_EQ(law["family"], "widths=16,24,32 aspect=16 head_dim=8");
    // The study as CSV (scripts/laws_csv.py, where Debian's python3-h5py is installed) fits the same law.
    if (run_shell("/usr/bin/python3 -c 'import h5py'").status == 0) {
        const fs::path csv = dir / "a.csv";
        const RunResult c = run_shell("/usr/bin/python3 " + std::string(QUINTET_SOURCE_DIR) + "/scripts/laws_csv.py " +
                                      (dir / "a").string() + " " + csv.string());
        ASSERT_EQ(c.status, 0) << c.output;
        auto fit = [&](const std::string& in) {
            const RunResult r = run_shell("(" + std::string(QUINTET_BINARY) + " laws " + in + " --bootstrap 0 --json 2>/dev/null)");
            EXPECT_EQ(r.status, 0) << r.output;
            return nlohmann::json::parse(r.output);
        };
        const auto from_h5 = fit((dir / "a").string()), from_csv = fit(csv.string());
        for (const char* k : {"E", "A", "B", "alpha", "beta"}) {
            const double a = from_h5[k]["value"].get<double>(), b = from_csv[k]["value"].get<double>();
            EXPECT_NEAR(a, b, 1e-6 * std::fabs(a)) << k;
        }
    }
    // Another count on request.
    const RunResult t = run_quintet(0, "laws " + (dir / "a").string() + " --bootstrap 0 --params total --loss train");
    ASSERT_EQ(t.status, 0) << t.output;
    EXPECT_NE(t.output.find("N = total parameters, loss = smoothed final training loss"), std::string::npos) << t.output;
}

TEST_F(LawsStudy, AFailedRunIsListedAndLeftOut) {
    // Every run longer than 40 steps diverges (an injected NaN): the small shapes at the larger
    // budget fail with exit 3, the others finish.
    const fs::path s = study("f", "budgets = 1e8, 6e8\nshapes = d_model=16 n_layers=1 n_heads=2; d_model=24 n_layers=2 n_heads=3; "
                                  "d_model=32 n_layers=2 n_heads=4\nwarmup_fraction = 0.1\n");
    const RunResult r = run_shell("QUINTET_INJECT_FAULT=rank=0,step=40,mode=nan " + std::string(QUINTET_BINARY) + " study " + s.string());
    EXPECT_EQ(r.status, 4) << r.output;  // some runs failed
    EXPECT_NE(r.output.find("FAILED with exit status 3"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("failed)"), std::string::npos) << r.output;  // "(N failed)" in the collect line
    hid_t f = H5Fopen((dir / "f" / "study.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t g = H5Gopen2(f, "/runs/C6e8_d16_l1_h2", H5P_DEFAULT);
    ASSERT_GE(g, 0) << r.output;
    EXPECT_EQ(attr_str(g, "status"), "failed");
    H5Gclose(g), H5Fclose(f);
    const RunResult l = run_quintet(0, "laws " + (dir / "f").string() + " --bootstrap 0");
    EXPECT_NE(l.output.find("left out: C6e8_d16_l1_h2: failed (exit status 3)"), std::string::npos) << l.output;
    // Re-running the study retries the failed runs only (without the fault they finish).
    const RunResult again = run_quintet(0, "study " + s.string());
    EXPECT_EQ(again.status, 0) << again.output;
    EXPECT_NE(again.output.find("run(s) finished before: skipped"), std::string::npos) << again.output;
}

TEST_F(LawsStudy, BadLawsSectionsExitTwo) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"budgets = 1e8\n", "exactly one of shapes"},
        {"budgets = 1e8\nshapes = d_model=16\nfamily = widths=16\n", "exactly one of shapes"},
        {"shapes = d_model=16\n", "needs budgets"},
        {"budgets = 1e8, -3\nshapes = d_model=16\n", "'-3': expected a positive number"},
        {"budgets = 1e8\nshapes = d_model=16\nparams = some\n", "expected total, non_embedding or active"},
        {"budgets = 1e8\nshapes = colour=red\n", "'colour' is not a deck key"},
        {"budgets = 1e8\nshapes = d_model=-4\n", "model.d_model"},
        {"budgets = 1e8\nfamily = widths=20 head_dim=8\n", "not a multiple of head_dim = 8"},
        {"budgets = 1e8\nfamily = depth=3\n", "'depth' is not a family key"},
        {"budgets = 1e8\nfamily = aspect=16\n", "needs widths="},
        {"budgets = 1e8\nshapes = d_model=16\nspeed = fast\n", "'laws.speed' is not known"},
    };
    int i = 0;
    for (const auto& [laws, expect] : cases) {
        SCOPED_TRACE(laws);
        const RunResult r = run_quintet(0, "study " + study("bad" + std::to_string(i++), laws).string() + " --dry-run");
        EXPECT_EQ(r.status, 2) << r.output;
        EXPECT_NE(r.output.find(expect), std::string::npos) << r.output;
    }
    const RunResult w = run_quintet(0, "study " + study("w", "budgets = 1e8\nshapes = d_model=16\n", "worlds = 1, 2\n").string());
    EXPECT_EQ(w.status, 2);
    EXPECT_NE(w.output.find("study.worlds"), std::string::npos) << w.output;
    const RunResult v = run_quintet(0, "study " + study("v", "budgets = 1e8\nshapes = d_model=16\n[vary]\ntrain.lr = 1e-3, 1e-2\n").string());
    EXPECT_EQ(v.status, 2);
    EXPECT_NE(v.output.find("[vary] with [laws]"), std::string::npos) << v.output;
    const RunResult p = run_quintet(0, "study " + study("p", "budgets = 1e8\nshapes = d_model=16\n").string() + " --parity");
    EXPECT_EQ(p.status, 2);
    EXPECT_FALSE(fs::exists(dir / "p" / "runs")) << "nothing is run or written for a bad study";
    // A budget too small for a shape: that run is skipped with the reason, the others run.
    const RunResult small = run_quintet(0, "study " + study("s", "budgets = 2e7\nshapes = d_model=16 n_layers=1; d_model=64\n").string() +
                                                " --dry-run");
    EXPECT_EQ(small.status, 0) << small.output;
    EXPECT_NE(small.output.find("skipped: budget 2e+07"), std::string::npos) << small.output;
}
