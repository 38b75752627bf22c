// Faults, injected for real (docs/reliability.md): non-finite gradients (stop with status 3,
// the transient case re-run and continued on the unbroken curve, skip and its limit); SIGKILL of
// the whole job at pseudo-random moments (checkpoint writes included) with resume to the unbroken
// curve bit for bit, metrics included; a truncated `latest`, a checkpoint with a flipped value;
// an unreadable metrics.h5; two runs in one run_dir and a stale lock; a disk that fills during a
// checkpoint (a tmpfs the test mounts, where it may).
// ctest: labels=mpi timeout=1500 launches_mpirun
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
[data]
seq_len = 32
micro_batch_size = 2
order = random
val_fraction = 0.1
[train]
steps = 12
lr = 1e-2
lr_min = 1e-3
warmup = 2
seed = 5
peak_tflops = 0.1
[eval]
every = 4
batches = 2
[checkpoint]
every = 2
keep = 0
[output]
log_every = 4
)";

struct Faults : TrainFixture {
    void SetUp() override { prepare("faults_", kDeck, 3); }
    void TearDown() override { unsetenv("QUINTET_INJECT_FAULT"); }
    RunResult faulty(int ranks, const std::string& name, const char* fault, const std::string& extra = "") {
        setenv("QUINTET_INJECT_FAULT", fault, 1);
        RunResult r = train(ranks, name, extra);
        unsetenv("QUINTET_INJECT_FAULT");
        return r;
    }
    std::vector<std::string> checkpoints(const std::string& name) {
        std::vector<std::string> v;
        for (auto& e : fs::directory_iterator(dir / name / "checkpoints"))
            if (e.path().extension() == ".h5") v.push_back(e.path().string());
        std::sort(v.begin(), v.end());
        return v;
    }
};

bool all_finite(const std::string& ckpt) {
    for (const auto& [name, v] : checkpoint_tensors(ckpt))
        for (float x : v)
            if (!std::isfinite(x)) return false;
    return true;
}

TEST_F(Faults, NonFiniteGradientStopsWithStatus3NamingRankAndTensor) {
    // dp2: rank 1 poisons its gradient in step 6 (0-based 5) every time it runs.
    auto r = faulty(2, "nan", "rank=1,step=5,mode=nan", "--parallel.microbatches=2");
    EXPECT_EQ(r.status, 3) << r.output;
    EXPECT_NE(r.output.find("step 6: the gradient norm is not finite, also when the step is re-run"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("rank 1, gradient of model.embed_tokens.weight"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("the last good one is"), std::string::npos) << r.output;
    EXPECT_NE(read_file(dir / "nan" / "fault").find("kind=diverged step=6 rank=1"), std::string::npos);
    // Checkpoints of steps 2 and 4 -- finite -- and none after.
    const auto ck = checkpoints("nan");
    ASSERT_EQ(ck.size(), 2u);
    EXPECT_NE(ck.back().find("step_00000004.h5"), std::string::npos);
    for (const auto& c : ck) EXPECT_TRUE(all_finite(c)) << c;
    EXPECT_EQ(read_file(dir / "nan" / "checkpoints" / "latest"), "step_00000004.h5\n");
}

TEST_F(Faults, TransientNonFiniteIsRerunAndTheCurveIsUnbroken) {
    auto ref = train(2, "ref", "--parallel.microbatches=2");
    ASSERT_EQ(ref.status, 0) << ref.output;
    auto r = faulty(2, "once", "rank=0,step=5,mode=nan_once", "--parallel.microbatches=2");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("a transient fault"), std::string::npos) << r.output;
    EXPECT_EQ(metrics_column(dir / "once", "/train/loss"), metrics_column(dir / "ref", "/train/loss"));
    EXPECT_EQ(metrics_column(dir / "once", "/train/grad_norm"), metrics_column(dir / "ref", "/train/grad_norm"));
}

TEST_F(Faults, SkipDropsTheUpdateCountsAndStopsAfterMaxSkips) {
    auto r = faulty(1, "skip", "rank=0,step=5,mode=nan", "--train.on_nonfinite=skip");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto sk = metrics_column(dir / "skip", "/train/skipped");
    ASSERT_EQ(sk.size(), 12u);
    for (size_t i = 0; i < sk.size(); ++i) EXPECT_EQ(sk[i], i == 5 ? 1.0 : 0.0) << i;
    EXPECT_TRUE(std::isfinite(metrics_column(dir / "skip", "/train/loss").back()));
    // Three poisoned steps in a row with max_skips = 3: two skipped, the third stops.
    auto s = faulty(1, "skip3", "rank=0,step=5,mode=nan,until=7", "--train.on_nonfinite=skip --train.max_skips=3");
    EXPECT_EQ(s.status, 3) << s.output;
    EXPECT_NE(s.output.find("3 steps in a row skipped (train.max_skips)"), std::string::npos) << s.output;
    EXPECT_EQ(metrics_column(dir / "skip3", "/train/skipped").size(), 7u);  // steps 1..7; 8 stopped
}

// SIGKILL of the whole job at pseudo-random moments until it completes: every restart resumes
// from a complete checkpoint, and the loss, grad-norm and eval curves in metrics.h5 equal an
// unbroken run's bit for bit.
TEST_F(Faults, KilledAtRandomMomentsTheRunEndsOnTheUnbrokenCurve) {
    // The kill window is in seconds, so the run's length must be too: a fixed step count let a
    // fast host (Zen 4, own GEMM) finish after 4 kills. An unbroken run of 150 steps is timed
    // first and the run made long enough (a multiple of 150 steps) that kKills kills, each ending
    // a run at most kLatest s after its start, cannot finish it, with 25% to spare for noise in
    // the timing. After kMaxKills kills one run goes to the end unkilled, so the test ends.
    constexpr int kKills = 5, kMaxKills = 12;
    constexpr double kEarliest = 0.15, kLatest = 0.95;
    const auto direct = [&](const std::string& run, const std::string& a) {
        return std::string(QUINTET_BINARY) + " train " + deck.string() + " --data.path=" +
               data.string() + " --output.run_dir=" + (dir / run).string() + " " + a + " > " +
               (dir / (run + ".log")).string() + " 2>&1";
    };
    const std::string per_step = " --checkpoint.every=1 --checkpoint.keep=3 --eval.every=10";
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(std::system(("OMP_NUM_THREADS=1 " + direct("timing", "--train.steps=150" + per_step)).c_str()), 0) << read_file(dir / "timing.log");
    const double d150 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int steps = 150 * std::max(1, int(std::ceil(1.25 * kKills * kLatest / d150)));
    const std::string args = "--train.steps=" + std::to_string(steps) + per_step;
    auto ref = train(1, "ref", args);
    ASSERT_EQ(ref.status, 0) << ref.output;
    std::mt19937 g(2026);
    int kills = 0;
    bool finished = false;
    while (!finished && kills < kMaxKills) {
        // kEarliest .. kLatest s: start-up, resume, steps, checkpoint and metrics writes are all hit.
        const double after = kEarliest + double(g() % 1000) * 1e-3 * (kLatest - kEarliest);
        char t[32];
        std::snprintf(t, sizeof t, "%.3f", after);
        // One thread, as train() runs the reference (mpirun -x OMP_NUM_THREADS=1).
        const std::string cmd = std::string("OMP_NUM_THREADS=1 timeout -s KILL ") + t + " " + direct("killed", args);
        const int st = std::system(cmd.c_str());
        finished = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!finished) {
            ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 137) << "status " << st << "\n" << read_file(dir / "killed.log");
            ++kills;
        }
    }
    EXPECT_GE(kills, kKills) << "the run ended before the kills it was sized for (150 steps took " << d150 << " s)";
    if (!finished)
        ASSERT_EQ(std::system(("OMP_NUM_THREADS=1 " + direct("killed", args)).c_str()), 0) << read_file(dir / "killed.log");
    for (const char* c : {"/train/loss", "/train/grad_norm", "/eval/loss", "/train/step"})
        EXPECT_EQ(metrics_column(dir / "killed", c), metrics_column(dir / "ref", c)) << c << " after " << kills << " kills";
    std::printf("[ faults ] %d SIGKILLs over %d steps (150 steps took %.2f s), the run ended on the unbroken curve\n",
                kills, steps, d150);
}

TEST_F(Faults, TruncatedLatestFallsBackAndCorruptValuesAreRefused) {
    auto ref = train(1, "ref", "");
    ASSERT_EQ(ref.status, 0) << ref.output;
    auto a = train(1, "tr", "--train.exit_after=7");
    ASSERT_EQ(a.status, 0) << a.output;
    // `latest` names step 7; cut it short, then resume.
    const fs::path seven = dir / "tr/checkpoints/step_00000007.h5";
    fs::resize_file(seven, fs::file_size(seven) / 2);
    auto b = train(1, "tr", "");
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("step_00000007.h5: not a readable HDF5 file"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("falling back to"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("resumed from " + (dir / "tr/checkpoints/step_00000006.h5").string()), std::string::npos) << b.output;
    EXPECT_TRUE(fs::exists(seven.string() + ".corrupt"));
    EXPECT_EQ(metrics_column(dir / "tr", "/train/loss"), metrics_column(dir / "ref", "/train/loss"));
    // One value changed in a tensor: the checksum refuses it by name, for eval and for a resume.
    const std::string ck = (dir / "tr/checkpoints/step_00000012.h5").string();
    hid_t f = H5Fopen(ck.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t d = H5Dopen2(f, "/params/model.norm.weight", H5P_DEFAULT);
    std::vector<float> w(32);
    H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.data());
    w[3] = std::nextafter(w[3], 2.0f);
    H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.data());
    H5Dclose(d);
    H5Fclose(f);
    auto e = run_quintet(0, "eval --checkpoint " + ck + " --data " + data.string());
    EXPECT_EQ(e.status, 2) << e.output;
    EXPECT_NE(e.output.find("tensor /params/model.norm.weight does not match its checksum"), std::string::npos) << e.output;
    auto r = train(1, "tr", "--train.steps=14");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("does not match its checksum"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("resumed from " + (dir / "tr/checkpoints/step_00000010.h5").string()), std::string::npos) << r.output;
}

TEST_F(Faults, UnreadableMetricsAreKeptAsideAndRebuilt) {
    auto a = train(1, "m", "--train.exit_after=6");
    ASSERT_EQ(a.status, 0) << a.output;
    write_file(dir / "m/metrics.h5", "this is not HDF5 any more");
    auto b = train(1, "m", "");
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("metrics.h5 is unreadable"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("rebuilt from"), std::string::npos) << b.output;
    bool kept = false;
    for (auto& e : fs::directory_iterator(dir / "m"))
        kept = kept || e.path().filename().string().rfind("metrics.h5.unreadable-", 0) == 0;
    EXPECT_TRUE(kept);
    auto ref = train(1, "ref", "");
    ASSERT_EQ(ref.status, 0) << ref.output;
    EXPECT_EQ(metrics_column(dir / "m", "/train/loss"), metrics_column(dir / "ref", "/train/loss"));
}

TEST_F(Faults, OneRunPerRunDirAndStaleLocksAreTakenOver) {
    // A long run holds the lock; a second one in the same folder is refused, naming the holder.
    const std::string cmd = std::string(QUINTET_BINARY) + " train " + deck.string() + " --data.path=" + data.string() +
                            " --output.run_dir=" + (dir / "busy").string() +
                            " --train.steps=100000 --eval.every=0 --checkpoint.every=0 > " + (dir / "busy.log").string() +
                            " 2>&1 & echo $!";
    FILE* p = popen(cmd.c_str(), "r");
    int pid = 0;
    ASSERT_EQ(fscanf(p, "%d", &pid), 1);
    pclose(p);
    for (int i = 0; i < 300 && !fs::exists(dir / "busy" / "metrics.h5"); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto second = train(1, "busy", "");
    kill(pid, SIGTERM);
    for (int i = 0; i < 300 && kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(second.status, 2) << second.output;
    EXPECT_NE(second.output.find("is in use by another run (lock held by host"), std::string::npos) << second.output;
    EXPECT_NE(second.output.find("pid " + std::to_string(pid)), std::string::npos) << second.output;
    EXPECT_FALSE(fs::exists(dir / "busy" / "lock"));  // released at the clean stop
    // A lock left by a killed job on this host (its pid is gone) is taken over.
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    fs::create_directories(dir / "stale");
    write_file(dir / "stale" / "lock", std::string(host) + " 999999 0\n");
    auto third = train(1, "stale", "--train.steps=2");
    EXPECT_EQ(third.status, 0) << third.output;
    EXPECT_NE(third.output.find("took over the stale lock"), std::string::npos) << third.output;
}

// A rank stopped with SIGSTOP (its watchdog thread too) in a dp reduction, a tp all-reduce, a
// pipeline receive and a checkpoint write: the job ends with status 4 within the deadline plus
// 30 s, naming the stopped rank; and a rank killed with SIGKILL ends the job with a message
// within 30 s, after which the last checkpoint loads.
TEST_F(Faults, StoppedOrDyingRankEndsTheJobNamingIt) {
    struct Case {
        std::string fault, layout, expect;
    };
    const Case cases[] = {
        {"rank=0,step=3,mode=stop", "--parallel.microbatches=2", "on the dp"},
        {"rank=0,step=3,mode=stop", "--parallel.tp=2 --parallel.microbatches=4", "on the tp communicator"},
        {"rank=0,step=3,mode=stop", "--parallel.pp=2 --parallel.microbatches=4", "on the pp communicator"},
        {"rank=0,step=3,mode=stop_checkpoint", "--parallel.microbatches=2", "checkpoint write"},
    };
    int k = 0;
    for (const auto& c : cases) {
        const std::string name = "stop" + std::to_string(k++);
        const auto t0 = std::chrono::steady_clock::now();
        auto r = faulty(2, name, c.fault.c_str(), c.layout + " --train.collective_timeout_s=5");
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(r.status, 4) << c.fault << " " << c.layout << "\n" << r.output;
        EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.layout << "\n" << r.output;
        EXPECT_NE(r.output.find("world ranks that did not arrive: 0"), std::string::npos) << c.layout << "\n" << r.output;
        EXPECT_LT(secs, 5 + 30) << c.layout;
        const std::string fault = read_file(dir / name / "fault");
        EXPECT_EQ(fault.rfind("kind=transient step=", 0), 0u) << c.layout << "\n" << fault;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto d = faulty(2, "dying", "rank=1,step=5,mode=kill", "--parallel.microbatches=2");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(d.status, 0) << d.output;
    EXPECT_LT(secs, 30.0);
    std::string latest = read_file(dir / "dying/checkpoints/latest");
    ASSERT_EQ(latest, "step_00000004.h5\n") << d.output;
    auto e = run_quintet(0, "eval --checkpoint " + (dir / "dying/checkpoints/step_00000004.h5").string() + " --data " +
                                data.string());
    EXPECT_EQ(e.status, 0) << e.output;
}

// Disk full during a checkpoint: a 1 MiB tmpfs as run_dir (root and mount permission needed;
// skipped where the container forbids it). The error is clear and the earlier checkpoints load.
TEST_F(Faults, DiskFullDuringACheckpointKeepsTheEarlierOnes) {
    const fs::path mnt = dir / "small";
    fs::create_directories(mnt);
    if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
    struct Unmount {
        fs::path p;
        ~Unmount() { umount(p.c_str()); }
    } unmount{mnt};
    // The checkpoint (~0.4 MiB with its moments) fits twice in 1 MiB, not three times.
    auto r = train(1, "small/run", "--train.steps=6 --eval.every=0");
    const auto ck = fs::exists(mnt / "run/checkpoints") ? checkpoints("small/run") : std::vector<std::string>{};
    std::string latest = read_file(mnt / "run/checkpoints/latest");
    EXPECT_EQ(r.status, 4) << r.output;  // an I/O failure: a transient fault (docs/reliability.md)
    EXPECT_NE(r.output.find("checkpoint"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
    ASSERT_FALSE(latest.empty()) << r.output;
    latest.pop_back();
    auto e = run_quintet(0, "eval --checkpoint " + (mnt / "run/checkpoints" / latest).string() + " --data " + data.string());
    EXPECT_EQ(e.status, 0) << e.output;
}

}  // namespace
