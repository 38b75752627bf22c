// `quintet study` run for real (local submission: mpirun per case): study.h5's groups and
// attributes, parity against the single-rank run, re-running skips finished runs, an interrupted
// study finishes only what is missing, a second study reproduces every loss curve bit for bit,
// plots, --help, --dry-run and bad study decks. (The Slurm job-array path: tests/jobs/test_slurm.sh.)
// ctest: labels=mpi,study timeout=900 launches_mpirun
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kBase = R"([model]
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
[data]
seq_len = 32
micro_batch_size = 2
[train]
steps = 6
lr = 1e-2
[eval]
every = 0
[checkpoint]
every = 0
[output]
log_every = 3
)";

double attr_f64(hid_t g, const char* name) {
    double v = std::nan("");
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    if (a >= 0) {
        H5Aread(a, H5T_NATIVE_DOUBLE, &v);
        H5Aclose(a);
    }
    return v;
}

std::string attr_str(hid_t g, const char* name) {
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    if (a < 0) return "";
    hid_t t = H5Aget_type(a);
    std::string out;
    if (H5Tis_variable_str(t) > 0) {
        char* s = nullptr;
        H5Aread(a, t, &s);
        out = s ? s : "";
        H5free_memory(s);
    } else {
        out.resize(H5Tget_size(t));
        H5Aread(a, t, out.data());
        out = out.c_str();
    }
    H5Tclose(t);
    H5Aclose(a);
    return out;
}

std::vector<double> dataset(hid_t f, const std::string& path) {
    std::vector<double> v;
    hid_t d = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
    if (d < 0) return v;
    hid_t s = H5Dget_space(d);
    v.resize(size_t(H5Sget_simple_extent_npoints(s)));
    H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(s);
    H5Dclose(d);
    return v;
}

struct StudyTest : ::testing::Test {
    fs::path dir, data;
    void SetUp() override {
        dir = scratch_dir(std::string("study_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
        data = dir / "data.h5";
        make_token_file(data, 4000, 64, 5);
        write_file(dir / "base.deck", std::string(kBase) + "[data]\npath = " + data.string() + "\n");
    }
    fs::path study(const std::string& name, const std::string& body) {
        fs::path p = dir / (name + ".deck");
        write_file(p, "[study]\nbase = base.deck\ndir = " + (dir / name).string() + "\n" + body);
        return p;
    }
    int run_lines(const std::string& out) {
        int n = 0;
        for (size_t at = out.find("\n["); at != std::string::npos; at = out.find("\n[", at + 1)) ++n;
        return n;
    }
};

TEST_F(StudyTest, LocalStudyParityResumeAndReproducibility) {
    const std::string body = "worlds = 1, 2\nlayouts = tp=1; tp=2; pp=2\nscaling = strong\nglobal_batch = 4\n";
    fs::path s = study("a", body);
    RunResult r = run_quintet(0, "study " + s.string() + " --parity");
    ASSERT_EQ(r.status, 0) << r.output;
    // w1 with tp2/pp2 cannot run: listed with the reason; 4 runs and 1 reference.
    EXPECT_NE(r.output.find("w1_tp2_t1_s1234 skipped: tp x cp x pp = 2 does not divide the world size 1"), std::string::npos) << r.output;
    EXPECT_EQ(run_lines(r.output), 5) << r.output;
    EXPECT_NE(r.output.find("ETA"), std::string::npos);
    const fs::path h5 = dir / "a" / "study.h5";
    ASSERT_TRUE(fs::exists(h5)) << r.output;
    hid_t f = H5Fopen(h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    EXPECT_EQ(attr_str(f, "scaling"), "strong");
    for (const char* name : {"w1_tp1_t1_s1234", "w2_tp1_t1_s1234", "w2_tp2_t1_s1234", "w2_pp2_t1_s1234"}) {
        SCOPED_TRACE(name);
        hid_t g = H5Gopen2(f, (std::string("/runs/") + name).c_str(), H5P_DEFAULT);
        ASSERT_GE(g, 0);
        EXPECT_EQ(attr_str(g, "status"), "done");
        EXPECT_NE(attr_str(g, "deck").find("[model]"), std::string::npos);
        EXPECT_FALSE(attr_str(g, "commit").empty());
        EXPECT_GT(attr_f64(g, "tokens_per_s"), 0);
        EXPECT_GT(attr_f64(g, "mfu"), 0);
        EXPECT_GT(attr_f64(g, "predicted_tokens_per_s"), 0);
        EXPECT_GT(attr_f64(g, "predicted_peak_rss_bytes"), 0);
        EXPECT_GT(attr_f64(g, "peak_rss_bytes"), 0);
        EXPECT_GE(attr_f64(g, "time_compute_s"), 0);
        const double step = attr_f64(g, "step_time_s");
        double parts = 0;
        for (const char* k : {"time_compute_s", "time_tp_s", "time_cp_s", "time_dp_s", "time_ep_s", "time_bubble_s"})
            parts += attr_f64(g, k);
        EXPECT_NEAR(parts, step, 0.05 * step + 1e-4);
        EXPECT_EQ(dataset(f, std::string("/runs/") + name + "/loss").size(), 6u);
        EXPECT_EQ(dataset(f, std::string("/runs/") + name + "/memory_bytes").size(),
                  size_t(std::string(name).rfind("w2", 0) == 0 ? 12 : 6));
        H5Gclose(g);
        if (std::string(name) != "w1_tp1_t1_s1234") {
            hid_t p = H5Gopen2(f, (std::string("/parity/") + name).c_str(), H5P_DEFAULT);
            ASSERT_GE(p, 0);
            EXPECT_LE(attr_f64(p, "loss_rel"), 1e-5);
            EXPECT_LE(attr_f64(p, "grad_norm_rel"), 1e-5);
            H5Gclose(p);
        }
    }
    // tp2 and pp2 need 2 ranks: their groups say so.
    const std::vector<double> loss_a = dataset(f, "/runs/w2_tp2_t1_s1234/loss");
    H5Fclose(f);
    for (const char* png : {"throughput", "efficiency", "mfu", "comm_fraction", "predicted", "loss", "parity"})
        EXPECT_TRUE(fs::exists(dir / "a" / "plots" / (std::string(png) + ".png"))) << png;

    // Re-running the finished study runs nothing.
    RunResult again = run_quintet(0, "study " + s.string() + " --parity");
    ASSERT_EQ(again.status, 0) << again.output;
    EXPECT_NE(again.output.find("5 run(s) finished before: skipped"), std::string::npos) << again.output;
    EXPECT_EQ(run_lines(again.output), 0) << again.output;
    // An interrupted study (one run never finished) runs only that one.
    fs::remove_all(dir / "a" / "runs" / "w2_pp2_t1_s1234");
    RunResult rest = run_quintet(0, "study " + s.string());
    ASSERT_EQ(rest.status, 0) << rest.output;
    EXPECT_EQ(run_lines(rest.output), 1) << rest.output;
    EXPECT_NE(rest.output.find("[1/1] w2_pp2_t1_s1234"), std::string::npos) << rest.output;

    // The same study deck elsewhere reproduces every curve bit for bit.
    fs::path s2 = study("b", body);
    RunResult b = run_quintet(0, "study " + s2.string());
    ASSERT_EQ(b.status, 0) << b.output;
    hid_t fa = H5Fopen((dir / "a" / "study.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t fb = H5Fopen((dir / "b" / "study.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    for (const char* name : {"w1_tp1_t1_s1234", "w2_tp1_t1_s1234", "w2_tp2_t1_s1234", "w2_pp2_t1_s1234"}) {
        const auto la = dataset(fa, std::string("/runs/") + name + "/loss"), lb = dataset(fb, std::string("/runs/") + name + "/loss");
        ASSERT_EQ(la.size(), 6u) << name;
        EXPECT_EQ(la, lb) << name;
        const auto ga = dataset(fa, std::string("/runs/") + name + "/grad_norm"), gb = dataset(fb, std::string("/runs/") + name + "/grad_norm");
        EXPECT_EQ(ga, gb) << name;
    }
    EXPECT_EQ(dataset(fa, "/runs/w2_tp2_t1_s1234/loss"), loss_a);
    H5Fclose(fa);
    H5Fclose(fb);
    // --collect regathers from the folder alone.
    RunResult c = run_quintet(0, "study --collect " + (dir / "b").string());
    ASSERT_EQ(c.status, 0) << c.output;
    EXPECT_NE(c.output.find("4 run(s) collected"), std::string::npos) << c.output;
}

TEST_F(StudyTest, MoeExpertParallelParityAndVary) {
    // A one-value [vary] key applies to every run without naming it; a list makes a grid.
    fs::path s = study("moe", "worlds = 2\nlayouts = ep=2\nseeds = 7\n[vary]\nmoe.experts = 4\nmoe.top_k = 1, 2\n");
    RunResult r = run_quintet(0, "study " + s.string() + " --parity");
    ASSERT_EQ(r.status, 0) << r.output;
    hid_t f = H5Fopen((dir / "moe" / "study.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (const char* name : {"/parity/w2_ep2_t1_s7_top_k1", "/parity/w2_ep2_t1_s7_top_k2"}) {
        hid_t p = H5Gopen2(f, name, H5P_DEFAULT);
        ASSERT_GE(p, 0) << name << "\n" << r.output;
        EXPECT_LE(attr_f64(p, "loss_rel"), 1e-5) << name;
        EXPECT_LE(attr_f64(p, "expert_load_rel"), 1e-12) << name;  // loads are counts: equal exactly
        H5Gclose(p);
    }
    H5Fclose(f);
}

TEST_F(StudyTest, PlotSkipsAPython3WithoutMatplotlibFirstOnPath) {
    // A run to plot, and a python3 first on PATH that cannot import matplotlib (a virtualenv).
    RunResult t = run_quintet(0, "train " + (dir / "base.deck").string() + " --output.run_dir=" + (dir / "r").string());
    ASSERT_EQ(t.status, 0) << t.output;
    fs::create_directories(dir / "fakebin");
    write_file(dir / "fakebin" / "python3", "#!/bin/sh\necho 'No module named matplotlib' >&2\nexit 1\n");
    fs::permissions(dir / "fakebin" / "python3", fs::perms::owner_all);
    const std::string env = "PATH=" + (dir / "fakebin").string() + ":$PATH ";
    RunResult p = run_shell(env + QUINTET_BINARY + std::string(" plot ") + (dir / "r").string());
    ASSERT_EQ(p.status, 0) << p.output;
    EXPECT_TRUE(fs::exists(dir / "r" / "metrics.png")) << p.output;
    EXPECT_GT(fs::file_size(dir / "r" / "metrics.png"), 5000u);
    // Two runs overlaid into a named file; a missing run folder is exit 2 with its path.
    RunResult two = run_quintet(0, "plot " + (dir / "r").string() + " " + (dir / "r").string() + " -o " + (dir / "two.png").string());
    EXPECT_EQ(two.status, 0) << two.output;
    EXPECT_TRUE(fs::exists(dir / "two.png"));
    RunResult missing = run_quintet(0, "plot " + (dir / "nothing").string());
    EXPECT_EQ(missing.status, 2) << missing.output;
    EXPECT_NE(missing.output.find((dir / "nothing").string()), std::string::npos) << missing.output;
    // QUINTET_PYTHON naming an interpreter without matplotlib is skipped the same way.
    RunResult bad_env = run_shell("QUINTET_PYTHON=" + (dir / "fakebin" / "python3").string() + " " + QUINTET_BINARY +
                                  std::string(" plot ") + (dir / "r").string() + " -o " + (dir / "env.png").string());
    EXPECT_EQ(bad_env.status, 0) << bad_env.output;
    EXPECT_TRUE(fs::exists(dir / "env.png"));
    RunResult help = run_quintet(0, "plot --help");
    EXPECT_EQ(help.status, 0);
}

TEST_F(StudyTest, HelpDryRunAndBadDecks) {
    RunResult h = run_quintet(0, "study --help");
    EXPECT_EQ(h.status, 0);
    for (const char* k : {"--submit local", "--submit slurm", "--collect DIR", "--parity", "base = DECK", "worlds",
                          "layouts", "threads", "seeds", "scaling = strong|weak|none", "[vary]"})
        EXPECT_NE(h.output.find(k), std::string::npos) << k;
    RunResult d = run_quintet(0, "study " + study("dry", "worlds = 2\nlayouts = tp=2\n").string() + " --dry-run");
    EXPECT_EQ(d.status, 0) << d.output;
    EXPECT_NE(d.output.find("mpirun"), std::string::npos) << d.output;
    EXPECT_NE(d.output.find("--parallel.tp=2"), std::string::npos) << d.output;
    EXPECT_FALSE(fs::exists(dir / "dry" / "runs")) << "a dry run creates nothing";
    RunResult u = run_quintet(0, "study " + study("bad1", "worlds = 2\ncolour = red\n").string());
    EXPECT_EQ(u.status, 2);
    EXPECT_NE(u.output.find("'study.colour' is not known"), std::string::npos) << u.output;
    RunResult l = run_quintet(0, "study " + study("bad2", "layouts = tensor=2\n").string());
    EXPECT_EQ(l.status, 2);
    EXPECT_NE(l.output.find("tensor=2"), std::string::npos) << l.output;
    RunResult w = run_quintet(0, "study " + study("bad3", "worlds = 0\n").string());
    EXPECT_EQ(w.status, 2);
    EXPECT_NE(w.output.find("study.worlds"), std::string::npos) << w.output;
    RunResult v = run_quintet(0, "study " + study("bad4", "[vary]\ntrain.precision = fp32, fp8\n").string());
    EXPECT_EQ(v.status, 2);
    EXPECT_NE(v.output.find("train.precision"), std::string::npos) << v.output;
    RunResult sub = run_quintet(0, "study " + study("bad5", "").string() + " --submit pbs");
    EXPECT_EQ(sub.status, 2);
    EXPECT_NE(sub.output.find("expected local or slurm"), std::string::npos) << sub.output;
    RunResult none = run_quintet(0, "study " + study("bad6", "worlds = 3\nlayouts = tp=2\n").string());
    EXPECT_EQ(none.status, 2);
    EXPECT_NE(none.output.find("no case"), std::string::npos) << none.output;
}

}  // namespace
