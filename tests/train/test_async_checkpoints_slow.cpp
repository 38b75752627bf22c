// Background checkpoints under many SIGKILLs (the long form of
// Async.KilledDuringBackgroundWritesLatestAlwaysLoadsAndTheCurveContinues in
// test_async_checkpoints): a checkpoint every step, written in the background, the job killed at
// pseudo-random moments up to 40 times; after every kill `latest` loads, and the run ends on the
// unbroken curve bit for bit. Figures in docs/reliability.md.
// ctest: labels=slow timeout=3600 launches_mpirun
#include <gtest/gtest.h>

#include "support/kill_trials.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 128
[data]
seq_len = 32
micro_batch_size = 2
order = random
val_fraction = 0.1
[train]
steps = 3000
lr = 1e-2
lr_min = 1e-3
warmup = 10
seed = 9
peak_tflops = 0.1
[eval]
every = 100
batches = 2
[checkpoint]
every = 1
keep = 3
async = true
[output]
log_every = 500
)";

struct AsyncSlow : TrainFixture {
    void SetUp() override { prepare("async_slow_", kDeck, 4); }
};

TEST_F(AsyncSlow, FortyKillsDuringBackgroundWritesLoseNothing) {
    auto ref = train(1, "ref", "");
    ASSERT_EQ(ref.status, 0) << ref.output;
    const std::string cmd = std::string(QUINTET_BINARY) + " train " + deck.string() + " --data.path=" + data.string() +
                            " --output.run_dir=" + (dir / "killed").string() + " > " + (dir / "killed.log").string() +
                            " 2>&1";
    const KillTrials t = kill_until_done(cmd, dir / "killed", data, 40, 0.3, 2.0, 2027);
    ASSERT_EQ(t.failure, "") << read_file(dir / "killed.log");
    if (!t.finished) ASSERT_EQ(std::system(("OMP_NUM_THREADS=1 " + cmd).c_str()), 0) << read_file(dir / "killed.log");
    EXPECT_EQ(t.kills, 40) << "the run finished before 40 kills";
    EXPECT_EQ(t.verified + t.before_first, t.kills);
    for (const char* c : {"/train/loss", "/train/grad_norm", "/eval/loss", "/train/step"})
        EXPECT_EQ(metrics_column(dir / "killed", c), metrics_column(dir / "ref", c)) << c;
    std::printf("[ async slow ] %d SIGKILLs, %d inside a background write, latest loaded after every one; the run "
                "ended on the unbroken curve\n", t.kills, t.in_write);
}

}  // namespace
