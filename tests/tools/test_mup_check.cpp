// `quintet mup-check` as a user runs it: the coordinate check of µP. Three widths, a few steps at
// one (large) learning rate held constant: under the standard parametrisation the attention and
// feed-forward outputs and the residual stream grow with the width (slope of log RMS against log
// width well above 1 by the last step), under µP they do not (|slope| small); the --json output
// has one {"width", "step", "kind", "rms"} per width, step and kind; the PNG is written; bad
// input ends with exit status 2 before any run.
// ctest: labels=mpi launches_mpirun timeout=600
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

// Head dim 8, two query heads per kv head: widths 32, 64, 128 have 4, 8, 16 heads.
const char* kDeck = R"([model]
d_model = 64
n_layers = 2
n_heads = 8
n_kv_heads = 4
ffn_dim = 192
[data]
seq_len = 64
micro_batch_size = 4
[train]
lr = 1e-2
seed = 3
peak_tflops = 0.1
)";

struct MupCheck : TrainFixture {
    void SetUp() override { prepare("mup_check_", kDeck, 5); }
    RunResult check(const std::string& args) {
        return run_quintet(0, "mup-check " + deck.string() + " --data.path=" + data.string() + " " + args);
    }
    // The slope of log RMS against log width of `kind` at `step`.
    static double slope(const nlohmann::json& pts, const std::string& kind, int step) {
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        int n = 0;
        for (const auto& p : pts)
            if (p["kind"] == kind && p["step"] == step) {
                const double x = std::log(p["width"].get<double>()), y = std::log(p["rms"].get<double>());
                sx += x, sy += y, sxx += x * x, sxy += x * y, ++n;
            }
        return (n * sxy - sx * sy) / (n * sxx - sx * sx);
    }
};

}  // namespace

TEST_F(MupCheck, StandardGrowsWithWidthMupStaysFlat) {
    std::map<std::string, nlohmann::json> out;
    for (const char* scheme : {"standard", "mup"}) {
        const RunResult r = check(std::string("--widths 32,64,128 --steps 4 --json --scheme ") + scheme);
        ASSERT_EQ(r.status, 0) << r.output;
        // (the progress lines go to stderr, which run_quintet captures with stdout: the JSON is the list)
        const size_t at = r.output.find('[');
        ASSERT_NE(at, std::string::npos) << r.output;
        out[scheme] = nlohmann::json::parse(r.output.substr(at));
        ASSERT_EQ(out[scheme].size(), 3u * 4u * 6u) << scheme;
        for (const auto& p : out[scheme]) {
            for (const char* key : {"width", "step", "kind", "rms"}) ASSERT_TRUE(p.contains(key)) << p.dump();
            EXPECT_GT(p["rms"].get<double>(), 0.0) << p.dump();
        }
    }
    for (const char* kind : {"attn_out", "ffn_out", "residual", "attn_logits"}) {
        const double s = slope(out["standard"], kind, 4), m = slope(out["mup"], kind, 4);
        EXPECT_GT(s, 1.0) << kind << ": the standard parametrisation should grow with width";
        EXPECT_LT(std::abs(m), 0.6) << kind << ": µP should stay flat";
    }
    // The embedding is the same rule in both (its RMS does not depend on width at all).
    EXPECT_LT(std::abs(slope(out["standard"], "embedding", 4)), 0.1);
}

TEST_F(MupCheck, TablePlotAndBadInput) {
    const fs::path png = dir / "check.png";
    const RunResult r = check("--widths 32,64 --steps 2 --scheme mup -o " + png.string());
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* piece : {"coordinate check", "attn_logits", "output_logits", "growth", "width 64"})
        EXPECT_NE(r.output.find(piece), std::string::npos) << piece << "\n" << r.output;
    EXPECT_TRUE(fs::exists(png));
    EXPECT_FALSE(fs::exists(png.string() + ".tmp.png"));
    for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
             {"--steps 2", "--widths is required"},
             {"--widths 64", "two or more positive integers"},
             {"--widths 32,36", "not a multiple of the deck's head dim"},
             {"--widths 32,32", "listed twice"},
             {"--widths 32,64 --steps 0", "--steps"},
             {"--widths 32,64 --scheme sp", "--scheme"},
             {"--widths 32,64 --model.n_layers=0", "model.n_layers"},
             {"--widths 32,64 -o /no/such/dir/x.png", "does not exist"}}) {
        const RunResult b = check(args);
        EXPECT_EQ(b.status, 2) << args << "\n" << b.output;
        EXPECT_NE(b.output.find(says), std::string::npos) << args << "\n" << b.output;
    }
}
