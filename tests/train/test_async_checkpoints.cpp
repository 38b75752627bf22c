// Background checkpoints (checkpoint.async, docs/reliability.md "Asynchronous checkpoints"),
// through the real binary: on dp, tp, pp, ep and ZeRO-3 layouts every checkpoint equals the
// blocking run's bit for bit (tensors, checksums, run state, attributes) and so does the curve,
// under Muon too (its momentum staged and written whole; resumed from a background checkpoint);
// SIGKILL at pseudo-random moments while writes run in the background leaves `latest` loading
// every time and the run ends on the unbroken curve; a disk that fills during a background write
// (a tmpfs the test mounts, filled while the writer is held inside the write) stops the run with
// status 4 naming the file, the earlier checkpoints intact; a writer that hangs meets the
// collective deadline; SIGUSR1 with a write in flight checkpoints and exits 0; a staging copy
// that does not fit the memory (a memory cgroup the test makes) is refused before any work.
// ctest: labels=mpi timeout=1500 launches_mpirun
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "quintet/io/checkpoint.hpp"
#include "quintet/io/h5.hpp"
#include "support/kill_trials.hpp"
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
steps = 10
lr = 1e-2
lr_min = 1e-3
warmup = 2
seed = 5
peak_tflops = 0.1
[eval]
every = 5
batches = 2
[checkpoint]
every = 2
keep = 0
[output]
log_every = 5
)";

constexpr const char* kMoe = " --moe.experts=4 --moe.top_k=2 --moe.ffn_dim=32 --moe.shared_experts=1";

std::vector<std::string> checkpoints_of(const fs::path& run) {
    std::vector<std::string> v;
    for (auto& e : fs::directory_iterator(run / "checkpoints"))
        if (e.path().extension() == ".h5") v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
}

std::string deck_without_async(const fs::path& ckpt) {
    quintet::h5::silence_errors();
    quintet::h5::Handle f = quintet::h5::file(H5Fopen(ckpt.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    std::istringstream in(quintet::h5::read_attr_string(f, "deck"));
    std::string line, out;
    while (std::getline(in, line))
        if (line.find("async") == std::string::npos) out += line + "\n";
    return out;
}

// A child process running `command` through the shell (exec'd: the pid is the command's).
pid_t spawn(const std::string& command) {
    const pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    return pid;
}
int wait_status(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
bool is_stopped(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t p = s.rfind(')');
    return p != std::string::npos && p + 2 < s.size() && s[p + 2] == 'T';
}

struct Async : TrainFixture {
    void SetUp() override { prepare("async_", kDeck, 3); }
    void TearDown() override { unsetenv("QUINTET_INJECT_FAULT"); }
    // quintet train on one rank without mpirun (a pid of its own), output to dir/<run>.log.
    std::string direct(const std::string& run, const std::string& args) {
        return std::string(QUINTET_BINARY) + " train " + deck.string() + " --data.path=" + data.string() +
               " --output.run_dir=" + (dir / run).string() + " " + args + " > " + (dir / (run + ".log")).string() +
               " 2>&1";
    }
};

TEST_F(Async, EveryCheckpointEqualsTheBlockingOneOnEveryLayout) {
    struct L {
        int ranks;
        std::string name, args;
    };
    const L layouts[] = {
        {2, "dp2_zero1", "--parallel.microbatches=2 --parallel.zero=1"},
        {2, "tp2", "--parallel.tp=2 --parallel.microbatches=4"},
        {2, "pp2", "--parallel.pp=2 --parallel.microbatches=4"},
        {2, "ep2", std::string(kMoe) + " --parallel.ep=2 --parallel.microbatches=2"},
        {2, "dp2_zero3", "--parallel.zero=3 --parallel.microbatches=2"},
    };
    for (const L& l : layouts) {
        SCOPED_TRACE(l.name);
        auto b = train(l.ranks, l.name + "_blocking", l.args);
        ASSERT_EQ(b.status, 0) << b.output;
        auto a = train(l.ranks, l.name + "_async", l.args + " --checkpoint.async=true");
        ASSERT_EQ(a.status, 0) << a.output;
        EXPECT_NE(a.output.find("in the background"), std::string::npos) << a.output;
        const auto cb = checkpoints_of(dir / (l.name + "_blocking")), ca = checkpoints_of(dir / (l.name + "_async"));
        ASSERT_EQ(cb.size(), 5u);
        ASSERT_EQ(ca, cb);
        for (const auto& c : cb) {
            const fs::path pb = dir / (l.name + "_blocking") / "checkpoints" / c, pa = dir / (l.name + "_async") / "checkpoints" / c;
            EXPECT_EQ(checkpoint_difference(pb.string(), pa.string(), {"deck"}), "") << c;
            EXPECT_EQ(deck_without_async(pb), deck_without_async(pa)) << c;
        }
        for (const char* col : {"/train/loss", "/train/grad_norm", "/eval/loss"})
            EXPECT_EQ(metrics_column(dir / (l.name + "_async"), col), metrics_column(dir / (l.name + "_blocking"), col)) << col;
        // One /checkpoint row per checkpoint, with its timings.
        EXPECT_EQ(metrics_column(dir / (l.name + "_async"), "/checkpoint/step"), (std::vector<double>{2, 4, 6, 8, 10}));
        for (double x : metrics_column(dir / (l.name + "_async"), "/checkpoint/blocked_s")) EXPECT_GT(x, 0.0);
        for (double x : metrics_column(dir / (l.name + "_async"), "/checkpoint/write_s")) EXPECT_GT(x, 0.0);
    }
}

// train.optimizer = muon: the staging copy holds Muon's momentum of the matrices a rank
// orthogonalises (whole) beside AdamW's moments of the other tensors, and the background write
// lays the file out as the blocking one does -- the same objects, attributes, checksums and bytes
// (/optim/momentum included); a run resumed from a checkpoint written in the background
// continues the blocking run's curve bit for bit and ends on its last checkpoint.
TEST_F(Async, MuonStateIsStagedWrittenAndResumedAsTheBlockingWriterDoes) {
    struct L {
        int ranks;
        std::string name, args;
    };
    const std::string mu = "--train.optimizer=muon ";
    const L layouts[] = {
        {1, "muon1", mu + "--parallel.microbatches=4"},
        {2, "muon_tp2", mu + "--parallel.tp=2 --parallel.microbatches=4"},
        {2, "muon_dp2_zero3", mu + "--parallel.zero=3 --parallel.microbatches=2"},
    };
    for (const L& l : layouts) {
        SCOPED_TRACE(l.name);
        const std::string blocking = l.name + "_blocking", async = l.name + "_async", resumed = l.name + "_resumed";
        auto b = train(l.ranks, blocking, l.args);
        ASSERT_EQ(b.status, 0) << b.output;
        auto a = train(l.ranks, async, l.args + " --checkpoint.async=true");
        ASSERT_EQ(a.status, 0) << a.output;
        EXPECT_NE(a.output.find("in the background"), std::string::npos) << a.output;
        const auto cb = checkpoints_of(dir / blocking), ca = checkpoints_of(dir / async);
        ASSERT_EQ(cb.size(), 5u);
        ASSERT_EQ(ca, cb);
        for (const auto& c : cb) {
            const fs::path pb = dir / blocking / "checkpoints" / c, pa = dir / async / "checkpoints" / c;
            EXPECT_EQ(checkpoint_difference(pb.string(), pa.string(), {"deck"}), "") << c;
            EXPECT_EQ(deck_without_async(pb), deck_without_async(pa)) << c;
        }
        // The momentum is there, whole, under the optimizer attribute (so the comparison above
        // covered it): a hidden matrix has a momentum and no AdamW moments, the embedding the reverse.
        const fs::path first = dir / async / "checkpoints" / ca.front();
        EXPECT_EQ(quintet::checkpoint_read_meta(first.string()).optimizer, "muon");
        const auto t = checkpoint_tensors(first.string());
        auto has = [&](const std::string& n) {
            return std::any_of(t.begin(), t.end(), [&](const auto& x) { return x.first == n; });
        };
        const std::string q = "model.layers.0.self_attn.q_proj.weight", e = "model.embed_tokens.weight";
        EXPECT_TRUE(has("optim/momentum/" + q));
        EXPECT_FALSE(has("optim/exp_avg/" + q));
        EXPECT_TRUE(has("optim/exp_avg/" + e));
        EXPECT_FALSE(has("optim/momentum/" + e));
        for (const char* col : {"/train/loss", "/train/grad_norm", "/eval/loss"})
            EXPECT_EQ(metrics_column(dir / async, col), metrics_column(dir / blocking, col)) << col;
        // Resumed in the background mode from the step-4 checkpoint the background writer wrote.
        auto r = train(l.ranks, resumed, l.args + " --checkpoint.async=true --checkpoint.resume=" +
                                             (dir / async / "checkpoints" / ca[1]).string());
        ASSERT_EQ(r.status, 0) << r.output;
        EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
        const auto lb = metrics_column(dir / blocking, "/train/loss"), lr = metrics_column(dir / resumed, "/train/loss");
        ASSERT_GE(lr.size(), 6u);
        EXPECT_EQ(std::vector<double>(lr.end() - 6, lr.end()), std::vector<double>(lb.end() - 6, lb.end()));
        EXPECT_EQ(checkpoint_difference((dir / blocking / "checkpoints" / cb.back()).string(),
                                        (dir / resumed / "checkpoints" / cb.back()).string(), {"deck"}),
                  "");
    }
}

TEST_F(Async, KilledDuringBackgroundWritesLatestAlwaysLoadsAndTheCurveContinues) {
    // A checkpoint every step: a background write is in flight almost all the time.
    const std::string args = "--train.steps=300 --checkpoint.every=1 --checkpoint.keep=3 --eval.every=50 "
                             "--checkpoint.async=true";
    const auto t0 = std::chrono::steady_clock::now();
    auto ref = train(1, "ref", args);
    ASSERT_EQ(ref.status, 0) << ref.output;
    // Kills within the first 10-25% of an unbroken run's time (measured here, so a fast host
    // cannot finish the run in fewer attempts than the test needs): several kills before it ends.
    const double whole = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const KillTrials t = kill_until_done(direct("killed", args), dir / "killed", data, 8, 0.10 * whole, 0.25 * whole, 47);
    ASSERT_EQ(t.failure, "") << read_file(dir / "killed.log");
    if (!t.finished) ASSERT_EQ(std::system(("OMP_NUM_THREADS=1 " + direct("killed", args)).c_str()), 0) << read_file(dir / "killed.log");
    EXPECT_GE(t.kills, 3);
    EXPECT_GE(t.in_write, 1) << "no kill landed in a background write";
    EXPECT_EQ(t.verified + t.before_first, t.kills);
    for (const char* c : {"/train/loss", "/train/grad_norm", "/eval/loss", "/train/step"})
        EXPECT_EQ(metrics_column(dir / "killed", c), metrics_column(dir / "ref", c)) << c << " after " << t.kills << " kills";
    std::printf("[ async ] %d SIGKILLs (%d inside a background write), latest loaded after each; the run ended on the "
                "unbroken curve\n", t.kills, t.in_write);
}

// Disk full during a background write: the writer is held (SIGSTOP inside the write) while the
// test fills the tmpfs, so the pre-write room check passes and the bytes then do not fit.
TEST_F(Async, DiskFullDuringABackgroundWriteStopsTheRunAndKeepsTheEarlierOnes) {
    const fs::path mnt = dir / "small";
    fs::create_directories(mnt);
    if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=4m") != 0) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
    struct Unmount {
        fs::path p;
        ~Unmount() { umount2(p.c_str(), MNT_DETACH); }
    } unmount{mnt};
    const std::string cmd = "env OMP_NUM_THREADS=1 QUINTET_INJECT_FAULT=rank=0,step=3,mode=stop_checkpoint " +
                            direct("small/run", "--train.steps=8 --checkpoint.async=true --eval.every=0");
    const pid_t pid = spawn(cmd);
    bool held = false;
    for (int i = 0; i < 600 && !held; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        held = is_stopped(pid);
    }
    ASSERT_TRUE(held) << read_file(dir / "small/run.log");
    ASSERT_TRUE(fs::exists(mnt / "run/checkpoints/step_00000004.h5.tmp"));
    // Fill the file system, then give back a little for the metrics' appends (not the 0.4 MiB
    // the checkpoint's bytes need).
    {
        std::ofstream filler(mnt / "filler", std::ios::binary);
        std::vector<char> block(65536, 'x');
        while (filler.write(block.data(), std::streamsize(block.size())) && filler.flush()) {
        }
    }
    fs::resize_file(mnt / "filler", std::max<uintmax_t>(fs::file_size(mnt / "filler"), 200000) - 160000);
    kill(pid, SIGCONT);
    const int status = wait_status(pid);
    const std::string log = read_file(dir / "small/run.log");
    EXPECT_EQ(status, 4) << log;
    EXPECT_NE(log.find("step_00000004.h5.tmp: No space left on device"), std::string::npos) << log;
    EXPECT_NE(log.find("the earlier checkpoints are intact (latest: " + (mnt / "run/checkpoints/step_00000002.h5").string()),
              std::string::npos) << log;
    EXPECT_EQ(read_file(mnt / "run/checkpoints/latest"), "step_00000002.h5\n");
    EXPECT_FALSE(fs::exists(mnt / "run/checkpoints/step_00000004.h5.tmp"));  // the partial file is removed
    EXPECT_FALSE(fs::exists(mnt / "run/checkpoints/step_00000004.h5"));
    fs::remove(mnt / "filler");
    auto e = run_quintet(0, "eval --checkpoint " + (mnt / "run/checkpoints/step_00000002.h5").string() + " --data " + data.string());
    EXPECT_EQ(e.status, 0) << e.output;
}

// A write that stops answering (a hung file system: the writer sleeps inside the write) meets
// train.collective_timeout_s like any wait: in the background, and blocking.
TEST_F(Async, AHungWriteEndsTheRunAtTheDeadline) {
    for (const char* mode : {"true", "false"}) {
        SCOPED_TRACE(mode);
        const std::string run = std::string("hang_") + mode;
        setenv("QUINTET_INJECT_FAULT", "rank=0,step=1,mode=hang_checkpoint", 1);
        const auto t0 = std::chrono::steady_clock::now();
        auto r = train(1, run, std::string("--train.steps=100000 --eval.every=0 --train.collective_timeout_s=3 --checkpoint.async=") + mode);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        unsetenv("QUINTET_INJECT_FAULT");
        EXPECT_EQ(r.status, 4) << r.output;
        EXPECT_NE(r.output.find(std::string(mode) == "true" ? "did not complete within 3 s (train.collective_timeout_s)"
                                                             : "checkpoint write"),
                  std::string::npos)
            << r.output;
        EXPECT_LT(secs, 3 + 30);
        EXPECT_EQ(read_file(dir / run / "fault").rfind("kind=transient step=", 0), 0u) << read_file(dir / run / "fault");
        EXPECT_FALSE(fs::exists(dir / run / "checkpoints/step_00000002.h5"));
    }
}

TEST_F(Async, StopSignalWithAWriteInFlightCheckpointsAndExitsCleanly) {
    const pid_t pid = spawn("env OMP_NUM_THREADS=1 " +
                            direct("stop", "--train.steps=100000 --checkpoint.every=1 --eval.every=0 --checkpoint.async=true"));
    for (int i = 0; i < 600 && !fs::exists(dir / "stop/checkpoints/latest"); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(pid, SIGUSR1);
    const int status = wait_status(pid);
    const std::string log = read_file(dir / "stop.log");
    EXPECT_EQ(status, 0) << log;
    EXPECT_NE(log.find("stop signal received: checkpointed step"), std::string::npos) << log;
    const std::string stopped = read_file(dir / "stop/stopped");
    ASSERT_EQ(stopped.rfind("step=", 0), 0u) << stopped;
    const int step = std::atoi(stopped.c_str() + 5);
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d.h5", step);
    EXPECT_EQ(read_file(dir / "stop/checkpoints/latest"), std::string(name) + "\n");
    for (auto& e : fs::directory_iterator(dir / "stop/checkpoints")) EXPECT_NE(e.path().extension(), ".tmp") << e.path();
    auto e = run_quintet(0, "eval --checkpoint " + (dir / "stop/checkpoints" / name).string() + " --data " + data.string());
    EXPECT_EQ(e.status, 0) << e.output;
}

// The staging copy is this rank's share of the weights and both moments (12 bytes a parameter
// here, one rank). The memory cgroup's limit is calibrated on this machine, not fixed: a blocking
// run of the same model in the same cgroup (no limit yet) reports its measured peak RSS and the
// weights' and moments' MiB; the limit is then that peak plus half the copy. The process never
// needs more than its peak before the check, so it starts; the check then finds at most half the
// copy (plus the activations it has yet to allocate) free, and must refuse.
double figure_after(const std::string& log, const std::string& key) {
    // "... params 49.6/49.6 | grads ... | optimizer 99.2/99.2 | ... | peak RSS 387.0/391.3": the measured (second) figure
    const size_t at = log.rfind(key + " ");
    if (at == std::string::npos) return -1;
    const size_t slash = log.find('/', at);
    return slash == std::string::npos ? -1 : std::atof(log.c_str() + slash + 1);
}

TEST_F(Async, AStagingCopyThatDoesNotFitIsRefusedBeforeAnyWork) {
    const fs::path cg = "/sys/fs/cgroup/memory/quintet_async_" + std::to_string(getpid());
    std::error_code ec;
    if (!fs::create_directory(cg, ec)) GTEST_SKIP() << "cannot make a memory cgroup here (" << ec.message() << ")";
    struct Remove {
        fs::path p;
        ~Remove() { rmdir(p.c_str()); }
    } remove{cg};
    const std::string model = "--model.d_model=512 --model.n_layers=4 --model.n_heads=8 --model.n_kv_heads=4 "
                              "--model.ffn_dim=1536 --data.micro_batch_size=1 --eval.every=0 --train.steps=2";
    const std::string in_group = "echo $$ > " + (cg / "cgroup.procs").string() + " && grep -q quintet_async_ /proc/self/cgroup && exec ";
    auto run = [&](const std::string& name, const std::string& extra) {
        return run_shell("sh -c '" + in_group + "env OMP_NUM_THREADS=1 " + QUINTET_BINARY + " train " + deck.string() +
                         " --data.path=" + data.string() + " --output.run_dir=" + (dir / name).string() + " " + model +
                         " " + extra + "'");
    };
    const RunResult calib = run("calibrate", "--checkpoint.async=false");
    if (calib.status != 0 && calib.output.find("quintet train") == std::string::npos)
        GTEST_SKIP() << "cannot join the memory cgroup here: " << calib.output;
    ASSERT_EQ(calib.status, 0) << calib.output;
    const double peak = figure_after(calib.output, "peak RSS"), params = figure_after(calib.output, "params"),
                 optim = figure_after(calib.output, "optimizer");
    ASSERT_GT(peak, 0) << calib.output;
    ASSERT_GT(params + optim, 100) << calib.output;  // the copy is large beside the runtime's jitter
    const double limit_mib = peak + 0.5 * (params + optim);
    write_file(cg / "memory.limit_in_bytes", std::to_string(int64_t(limit_mib * 1048576.0)));
    const RunResult r = run("big", "--checkpoint.async=true");
    EXPECT_EQ(r.status, 2) << "limit " << limit_mib << " MiB\n" << r.output;
    EXPECT_NE(r.output.find("checkpoint.async = true: the staging copy"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("set checkpoint.async = false"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "big/checkpoints")) << r.output;
}

}  // namespace
