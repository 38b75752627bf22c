// train.profile: the per-operation profile (core/profile.hpp) of real runs. Every named
// operation's seconds and "other" add up to the step time, the GEMMs appear by role and pass,
// communication appears under its axis, and profiling changes no bit of the loss curve.
// ctest: labels=mpi timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include <hdf5.h>

#include <cmath>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 48
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 96
[data]
seq_len = 32
micro_batch_size = 4
[train]
steps = 4
lr = 1e-3
[eval]
every = 0
[checkpoint]
every = 0
[output]
log_every = 1
)";

// The column, or empty where the run never timed that operation.
std::vector<double> column(const fs::path& run, const std::string& path) {
    try {
        return metrics_column(run, path);
    } catch (const std::exception&) {
        return {};
    }
}

// The names of every dataset under /timing/op of a run's metrics.h5.
std::vector<std::string> op_names(const fs::path& run) {
    std::vector<std::string> names;
    hid_t f = H5Fopen((run / "metrics.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return names;
    hid_t g = H5Gopen2(f, "/timing/op", H5P_DEFAULT);
    if (g >= 0) {
        H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr,
                    [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
                        static_cast<std::vector<std::string>*>(out)->push_back(name);
                        return 0;
                    },
                    &names);
        H5Gclose(g);
    }
    H5Fclose(f);
    return names;
}

struct ProfileTest : TrainFixture {
    void SetUp() override { prepare("profile_", kDeck, 3); }
};

TEST_F(ProfileTest, OperationsAddUpAndChangeNothing) {
    for (const auto& [ranks, layout] : std::vector<std::pair<int, std::string>>{
             {1, ""}, {2, "--parallel.tp=2 --parallel.sequence_parallel=true"}, {2, "--parallel.pp=2 --parallel.microbatches=2"},
             {2, "--parallel.cp=2"}, {2, "--moe.experts=4 --parallel.ep=2"}}) {
        SCOPED_TRACE(layout);
        const std::string tag = std::to_string(ranks) + "_" + std::to_string(std::hash<std::string>()(layout) % 10000);
        RunResult plain = train(ranks, "plain" + tag, layout);
        ASSERT_EQ(plain.status, 0) << plain.output;
        RunResult prof = train(ranks, "prof" + tag, layout + " --train.profile=true");
        ASSERT_EQ(prof.status, 0) << prof.output;
        EXPECT_EQ(metrics_column(dir / ("plain" + tag), "/train/loss"), metrics_column(dir / ("prof" + tag), "/train/loss"));
        // The table reads the steady state: 4 steps less the first 2 (as the tokens/s median).
        EXPECT_NE(prof.output.find("profile of rank 0 over 2 steady-state step(s)"), std::string::npos) << prof.output;
        const fs::path run = dir / ("prof" + tag);
        const std::vector<double> step = metrics_column(run, "/train/step_time_s");
        ASSERT_EQ(step.size(), 4u);
        // Every dataset under /timing/op, summed per step, is the step time.
        std::vector<double> sum(step.size(), 0.0);
        int names = 0;
        const std::vector<std::string> all = op_names(run);
        for (const std::string& op : all) {
            const std::vector<double> v = column(run, std::string("/timing/op/") + op);
            ++names;
            ASSERT_EQ(v.size(), step.size()) << op;
            for (size_t i = 0; i < v.size(); ++i) {
                EXPECT_GE(v[i], 0) << op;
                sum[i] += v[i];
            }
        }
        EXPECT_GE(names, 12);
        for (size_t i = 0; i < step.size(); ++i) EXPECT_NEAR(sum[i], step[i], 1e-6 + 1e-6 * step[i]) << "step " << i;
        // Each axis's communication is where it belongs.
        const auto total = [&](const char* op) {
            double t = 0;
            for (double x : column(run, std::string("/timing/op/") + op)) t += x;
            return t;
        };
        if (layout.find("tp=2") != std::string::npos) EXPECT_GT(total("comm.tp"), 0);
        if (layout.find("cp=2") != std::string::npos) EXPECT_GT(total("comm.cp"), 0);
        if (layout.find("ep=2") != std::string::npos) {
            EXPECT_GT(total("comm.ep"), 0);
            EXPECT_GT(total("gemm.experts.fwd"), 0);
            EXPECT_GT(total("gemm.router.fwd"), 0);
        }
        if (layout.find("pp=2") != std::string::npos) EXPECT_GT(total("comm.pp"), 0);
        EXPECT_GT(total("gemm.attn_qkv.fwd"), 0);
        EXPECT_GT(total("attention.bwd"), 0);
    }
}

}  // namespace
