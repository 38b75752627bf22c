// End to end, through the real binary under mpirun: every data-parallel layout (with and
// without ZeRO-1) gives the single-rank loss curve; step-0 checkpoints are bit-identical
// across layouts; an interrupted run resumes to the same curve bit for bit, also on another
// layout; and bad inputs stop with a clear message and leave nothing on disk.
// ctest: labels=mpi timeout=900 launches_mpirun
#include <gtest/gtest.h>

#include <sstream>
#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "quintet/io/h5.hpp"

#include <hdf5.h>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

// A model small enough for 4 oversubscribed ranks on 2 cores, big enough to cross the
// attention tile (T = 80 > 64) and use GQA.
const char* kDeck = R"([model]
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
[data]
seq_len = 80
micro_batch_size = 2
order = random
val_fraction = 0.1
[train]
steps = 10
lr = 1e-2
lr_min = 1e-3
warmup = 2
grad_clip = 1.0
seed = 7
peak_tflops = 0.1
[eval]
every = 5
batches = 4
[checkpoint]
every = 0
[output]
log_every = 5
)";

struct Fixture : TrainFixture {
    void SetUp() override { prepare("", kDeck, 1); }
};

TEST_F(Fixture, DataParallelLayoutsMatchSingleRank) {
    // Global batch = dp * microbatches * micro_batch_size = 8 samples in every layout.
    auto ref = train(1, "ref", "--parallel.microbatches=4");
    ASSERT_EQ(ref.status, 0) << ref.output;
    auto loss_ref = metrics_column(dir / "ref", "/train/loss");
    auto eval_ref = metrics_column(dir / "ref", "/eval/loss");
    ASSERT_EQ(loss_ref.size(), 10u);
    EXPECT_LT(loss_ref.back(), loss_ref.front() - 0.5) << "the tiny model should learn";
    struct L { int ranks; std::string args; };
    for (const L& l : {L{2, "--parallel.microbatches=2"}, L{4, "--parallel.microbatches=1"},
                       L{2, "--parallel.microbatches=2 --parallel.zero=1"},
                       L{4, "--parallel.microbatches=1 --parallel.zero=1 --parallel.bucket_mb=0.001"}}) {
        std::string name = "dp" + std::to_string(l.ranks) + (l.args.find("zero") != std::string::npos ? "z" : "");
        auto r = train(l.ranks, name, l.args);
        ASSERT_EQ(r.status, 0) << r.output;
        expect_close(metrics_column(dir / name, "/train/loss"), loss_ref, 1e-5, name + " train loss");
        expect_close(metrics_column(dir / name, "/eval/loss"), eval_ref, 1e-5, name + " eval loss");
    }
}

TEST_F(Fixture, StepZeroCheckpointsAreBitIdenticalAcrossLayouts) {
    std::vector<std::vector<std::pair<std::string, std::vector<float>>>> all;
    struct L { int ranks; std::string args; };
    for (const L& l : {L{1, "--parallel.microbatches=4"}, L{2, "--parallel.microbatches=2"},
                       L{4, "--parallel.microbatches=1 --parallel.zero=1"},
                       L{3, "--parallel.microbatches=1 --parallel.zero=1"}}) {
        std::string name = "s0_" + std::to_string(l.ranks);
        auto r = train(l.ranks, name, "--train.steps=0 " + l.args);
        ASSERT_EQ(r.status, 0) << r.output;
        fs::path f = dir / name / "checkpoints" / "step_00000000.h5";
        ASSERT_TRUE(fs::exists(f)) << r.output;
        EXPECT_EQ(read_file(dir / name / "checkpoints" / "latest"), "step_00000000.h5\n");
        all.push_back(checkpoint_tensors(f.string()));
    }
    ASSERT_GT(all[0].size(), 10u);
    for (size_t k = 1; k < all.size(); ++k) {
        ASSERT_EQ(all[k].size(), all[0].size());
        for (size_t i = 0; i < all[0].size(); ++i) {
            EXPECT_EQ(all[k][i].first, all[0][i].first);
            EXPECT_EQ(0, std::memcmp(all[k][i].second.data(), all[0][i].second.data(),
                                     all[0][i].second.size() * 4))
                << all[0][i].first << " differs in layout " << k;
        }
    }
}

TEST_F(Fixture, ResumeGivesTheUnbrokenCurveBitForBit) {
    const std::string common = "--train.steps=20 --parallel.microbatches=2 ";
    auto a = train(2, "unbroken", common);
    ASSERT_EQ(a.status, 0) << a.output;
    auto b1 = train(2, "broken", common + "--train.exit_after=10");
    ASSERT_EQ(b1.status, 0) << b1.output;
    EXPECT_EQ(read_file(dir / "broken" / "checkpoints" / "latest"), "step_00000010.h5\n");
    auto b2 = train(2, "broken", common);
    ASSERT_EQ(b2.status, 0) << b2.output;
    EXPECT_NE(b2.output.find("resumed from"), std::string::npos) << b2.output;
    auto la = metrics_column(dir / "unbroken", "/train/loss");
    auto lb = metrics_column(dir / "broken", "/train/loss");
    ASSERT_EQ(la.size(), 20u);
    ASSERT_EQ(lb.size(), 20u);
    for (size_t i = 0; i < 20; ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;  // bit for bit
    auto sa = metrics_column(dir / "broken", "/train/step");
    for (size_t i = 0; i < 20; ++i) EXPECT_EQ(sa[i], double(i + 1));
    auto ca = checkpoint_tensors((dir / "unbroken/checkpoints/step_00000020.h5").string());
    auto cb = checkpoint_tensors((dir / "broken/checkpoints/step_00000020.h5").string());
    ASSERT_EQ(ca.size(), cb.size());
    for (size_t i = 0; i < ca.size(); ++i)
        EXPECT_EQ(0, std::memcmp(ca[i].second.data(), cb[i].second.data(), ca[i].second.size() * 4))
            << ca[i].first;
}

// Resuming with deck values that differ from the checkpoint's says so, key by key, and what
// is allowed; a key that changes the model's tensors stops before any work (exit 2); re-running
// a finished run says it is complete, exits 0 and writes nothing.
TEST_F(Fixture, ResumeReportsChangesAndAFinishedRunSaysSo) {
    auto a = train(1, "changes", "--train.steps=4 --parallel.microbatches=2");
    ASSERT_EQ(a.status, 0) << a.output;
    const auto before = fs::last_write_time(dir / "changes" / "metrics.h5");
    auto done = train(1, "changes", "--train.steps=4 --parallel.microbatches=2");
    EXPECT_EQ(done.status, 0) << done.output;
    EXPECT_NE(done.output.find("the run is complete"), std::string::npos) << done.output;
    EXPECT_NE(done.output.find("raise train.steps"), std::string::npos) << done.output;
    EXPECT_EQ(fs::last_write_time(dir / "changes" / "metrics.h5"), before) << "a finished run writes nothing";
    auto more = train(2, "changes", "--train.steps=6 --train.lr=2e-2 --parallel.microbatches=1");
    ASSERT_EQ(more.status, 0) << more.output;
    EXPECT_NE(more.output.find("resume: train.lr: 0.01 -> 0.02 (allowed"), std::string::npos) << more.output;
    EXPECT_NE(more.output.find("resume: parallel.dp: 1 -> 2 (allowed: a checkpoint loads into any layout)"),
              std::string::npos) << more.output;
    auto shape = train(1, "changes", "--train.steps=8 --model.ffn_dim=96");
    EXPECT_EQ(shape.status, 2) << shape.output;
    EXPECT_NE(shape.output.find("model.ffn_dim: 64 -> 96"), std::string::npos) << shape.output;
    // A checkpoint from before the vocabulary was resolved into its deck (vocab_size = 0 there)
    // resumes: 0 means "from the data", not another model.
    const fs::path ck = dir / "changes" / "checkpoints" / "step_00000006.h5";
    const hid_t f = H5Fopen(ck.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    std::string deck = quintet::h5::read_attr_string(f, "deck");
    const size_t at = deck.find("\nvocab_size = ");
    ASSERT_NE(at, std::string::npos);
    deck.replace(at, deck.find('\n', at + 1) - at, "\nvocab_size = 0");
    H5Adelete(f, "deck");
    quintet::h5::write_attr_string(f, "deck", deck);
    H5Fclose(f);
    auto old = train(1, "changes", "--train.steps=7");
    EXPECT_EQ(old.status, 0) << old.output;
    EXPECT_EQ(old.output.find("model.vocab_size"), std::string::npos) << old.output;
    EXPECT_NE(old.output.find("resumed from"), std::string::npos) << old.output;
}

// A denominator measured below what a step reaches is raised, once said, so no share of the
// progress line reads above 100% (a busy machine at the start, or a train.peak_tflops too low).
TEST_F(Fixture, SharesNeverReadAbove100Percent) {
    auto r = train(1, "shares", "--train.steps=3 --train.peak_tflops=0.0000001");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("note: step 1 reached"), std::string::npos) << r.output;
    for (double m : metrics_column(dir / "shares", "/train/mfu")) EXPECT_LE(m, 1.0);
    for (double m : metrics_column(dir / "shares", "/train/mfu_matmul")) EXPECT_LE(m, 1.0);
}

TEST_F(Fixture, CheckpointsMoveBetweenLayouts) {
    // Written at dp=2 with ZeRO-1, continued at dp=1 (and the reverse), against the unbroken dp=1 run.
    auto ref = train(1, "ref", "--train.steps=16 --parallel.microbatches=4");
    ASSERT_EQ(ref.status, 0) << ref.output;
    auto lref = metrics_column(dir / "ref", "/train/loss");
    auto w = train(2, "moved", "--train.steps=16 --parallel.microbatches=2 --parallel.zero=1 --train.exit_after=8");
    ASSERT_EQ(w.status, 0) << w.output;
    auto r = train(1, "moved", "--train.steps=16 --parallel.microbatches=4");
    ASSERT_EQ(r.status, 0) << r.output;
    expect_close(metrics_column(dir / "moved", "/train/loss"), lref, 1e-5, "dp2+zero -> dp1");
    auto w2 = train(1, "moved2", "--train.steps=16 --parallel.microbatches=4 --train.exit_after=8");
    ASSERT_EQ(w2.status, 0) << w2.output;
    auto r2 = train(4, "moved2", "--train.steps=16 --parallel.microbatches=1 --parallel.zero=1");
    ASSERT_EQ(r2.status, 0) << r2.output;
    expect_close(metrics_column(dir / "moved2", "/train/loss"), lref, 1e-5, "dp1 -> dp4+zero");
}

TEST_F(Fixture, StopSignalCheckpointsAndExitsCleanly) {
    std::string cmd = std::string(QUINTET_MPIEXEC) +
                      " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -n 2 " + QUINTET_BINARY +
                      " train " + deck.string() + " --data.path=" + data.string() + " --output.run_dir=" +
                      (dir / "sig").string() + " --train.steps=100000 --eval.every=0 > " +
                      (dir / "log").string() + " 2>&1 & echo $!";
    FILE* p = popen(cmd.c_str(), "r");
    int pid = 0;
    ASSERT_EQ(fscanf(p, "%d", &pid), 1);
    pclose(p);
    // Wait until a few steps are done (metrics.h5 exists), then signal as Slurm would.
    for (int i = 0; i < 300 && !fs::exists(dir / "sig" / "metrics.h5"); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ASSERT_EQ(kill(pid, SIGUSR1), 0);
    int waited = 0;
    while (kill(pid, 0) == 0 && waited++ < 600) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string log = read_file(dir / "log");
    EXPECT_NE(log.find("stop signal received"), std::string::npos) << log;
    std::string latest = read_file(dir / "sig" / "checkpoints" / "latest");
    ASSERT_FALSE(latest.empty()) << log;
    auto steps = metrics_column(dir / "sig", "/train/step");
    ASSERT_FALSE(steps.empty());
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d.h5\n", int(steps.back()));
    EXPECT_EQ(latest, name);
}

// How each way of stopping a job ends (docs/reliability.md, "Signals"): SIGUSR1 to a bare mpirun,
// and SIGINT or SIGTERM to it and its ranks (Ctrl-C in a terminal; scancel and qdel), all
// checkpoint and leave run_dir/stopped naming that step; mpirun reports 0 after USR1 but its own
// 1 after TERM and INT. Through the job scripts (jobs/common.sh),
// a signal to every process of the job -- what scancel, a time limit's SIGTERM, qdel and Ctrl-C
// do -- ends with status 0.
TEST_F(Fixture, EveryStopPathCheckpointsAndTheJobScriptsReturnZero) {
    const std::string base = " train " + deck.string() + " --data.path=" + data.string() +
                             " --train.steps=100000 --eval.every=0";
    // Runs `cmd` (bash) in a session and process group of its own, with SIGINT and SIGTERM at
    // their defaults (a shell's `cmd &` would start it with SIGINT ignored, which no trap can
    // undo), output into dir/log. Signals it (the leader only, or every process of the group, as
    // scancel and qdel do) once the run has written its metrics; returns its exit status.
    auto run = [&](const std::string& name, const std::string& cmd, int sig, bool whole_group) {
        const fs::path run_dir = dir / name;
        fs::remove_all(run_dir);
        const std::string log_path = (dir / "log").string();
        const pid_t pid = fork();
        if (pid == 0) {
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            setsid();
            const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(fd, 1);
            dup2(fd, 2);
            execl("/bin/bash", "bash", "-c", cmd.c_str(), static_cast<char*>(nullptr));
            _exit(127);
        }
        for (int i = 0; i < 600 && !fs::exists(run_dir / "metrics.h5"); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        kill(whole_group ? -pid : pid, sig);
        int status = 0;
        waitpid(pid, &status, 0);
        const std::string log = read_file(dir / "log");
        const std::string latest = read_file(run_dir / "checkpoints" / "latest");
        const std::string stopped = read_file(run_dir / "stopped");
        // SIGUSR1 always checkpoints; after INT/TERM mpirun ends the ranks itself soon after
        // forwarding the signal, a race the ranks usually (not always, under load) win.
        if (sig == SIGUSR1) EXPECT_FALSE(latest.empty()) << name << "\n" << log;
        // run_dir/stopped names the step of the checkpoint the run stopped at. After INT/TERM
        // mpirun may end the ranks before they write it; `latest` may then be a periodic save.
        if (sig == SIGUSR1) EXPECT_FALSE(stopped.empty()) << name << "\n" << log;
        const size_t at = latest.find("step_");
        if (at != std::string::npos && !stopped.empty())
            EXPECT_EQ(stopped.rfind("step=" + std::to_string(std::stoll(latest.substr(at + 5))) + "\n", 0), 0u)
                << name << ": " << stopped << "\n" << log;
        // Open MPI 4.1's mpirun itself sometimes crashes in its own PMIx teardown after forwarding
        // INT/TERM (a segfault inside PMIx_server_finalize, once in several runs on a fresh
        // Debian): the ranks were already gone, so that is mpirun's exit, not quintet's; it is
        // reported and counted as mpirun's usual status 1.
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV && sig != SIGUSR1 &&
            log.find("PMIx_server_finalize") != std::string::npos) {
            std::printf("[ note ] %s: mpirun crashed in its PMIx teardown after the signal (an Open MPI fault)\n",
                        name.c_str());
            return std::make_pair(1, log);
        }
        EXPECT_TRUE(WIFEXITED(status)) << name << " ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, log);
    };
    const std::string mpirun = "exec " + std::string(QUINTET_MPIEXEC) + " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -n 2 " + QUINTET_BINARY;
    auto [usr1, l1] = run("usr1", mpirun + base + " --output.run_dir=" + (dir / "usr1").string(), SIGUSR1, false);
    EXPECT_EQ(usr1, 0) << l1;
    // Ctrl-C in a terminal: SIGINT to mpirun and its ranks (the foreground process group); the
    // same with SIGTERM, as scancel and qdel send it to every process of the job.
    auto [intr, l3] = run("int", mpirun + base + " --output.run_dir=" + (dir / "int").string(), SIGINT, true);
    EXPECT_EQ(intr, 1) << "Open MPI's mpirun after SIGINT (docs/reliability.md says 1)\n" << l3;
    auto [term, l2] = run("term", mpirun + base + " --output.run_dir=" + (dir / "term").string(), SIGTERM, true);
    EXPECT_EQ(term, 1) << "Open MPI's mpirun after SIGTERM (docs/reliability.md says 1)\n" << l2;
    // The job scripts' launcher, signalled with every process of the job.
    const std::string job = "cd " + std::string(QUINTET_SOURCE_DIR) + " && exec env QUINTET_BIN=" + QUINTET_BINARY +
                            " QUINTET_MPIRUN_FLAGS=--oversubscribe OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash -c \"source jobs/common.sh && quintet_env 1 && "
                            "quintet_args " + deck.string() + " --data.path=" + data.string() +
                            " --train.steps=100000 --eval.every=0 --output.run_dir=";
    for (const auto& [name, sig] : std::vector<std::pair<std::string, int>>{{"job_term", SIGTERM}, {"job_int", SIGINT}}) {
        auto [rc, log] = run(name, job + (dir / name).string() + " && quintet_run 2\"", sig, true);
        if (fs::exists(dir / name / "stopped")) {  // the checkpoint was written: a clean stop, 0
            EXPECT_EQ(rc, 0) << name << "\n" << log;
            EXPECT_NE(log.find("quintet stopped cleanly"), std::string::npos) << name << "\n" << log;
        } else {  // mpirun won the race: its status stands
            EXPECT_NE(rc, 0) << name << "\n" << log;
        }
    }
}

TEST_F(Fixture, GenerateSamplesFromACheckpoint) {
    auto r = train(1, "gen", "--train.steps=5 --parallel.microbatches=4");
    ASSERT_EQ(r.status, 0) << r.output;
    std::string ckpt = (dir / "gen/checkpoints/step_00000005.h5").string();
    auto g1 = run_quintet(0, "generate --checkpoint " + ckpt + " --prompt abc --tokens 30 --temperature 0");
    auto g2 = run_quintet(0, "generate --checkpoint " + ckpt + " --prompt abc --tokens 30 --temperature 0");
    ASSERT_EQ(g1.status, 0) << g1.output;
    // stderr's report lines (cache bytes per token, tokens/s) apart, the text on stdout.
    auto text = [](std::string out) {
        std::string kept, line;
        std::stringstream ss(out);
        bool cache_line = false;
        while (std::getline(ss, line)) {
            const auto at = line.find("generate: ");
            if (at != std::string::npos) {
                cache_line |= line.find("KV cache 256 bytes per token") != std::string::npos;  // 2 layers x K|V x 2 heads x 8 x 4 B
                line = line.substr(0, at);
                if (line.empty()) continue;
            }
            kept += line + "\n";
        }
        return std::make_pair(kept, cache_line);
    };
    EXPECT_TRUE(text(g1.output).second) << g1.output;
    g1.output = text(g1.output).first;
    g2.output = text(g2.output).first;
    EXPECT_EQ(g1.output, g2.output);  // greedy decoding is deterministic
    EXPECT_EQ(g1.output.rfind("abc", 0), 0u) << g1.output;
    EXPECT_GE(g1.output.size(), 3u + 30u);  // byte tokenizer: one byte per token (+ newline)
    auto s = run_quintet(0, "generate --checkpoint " + ckpt + " --prompt abc --tokens 30 --temperature 0.8 --seed 3");
    EXPECT_EQ(s.status, 0) << s.output;
    auto bad = run_quintet(0, "generate --checkpoint " + (dir / "nope.h5").string());
    EXPECT_NE(bad.status, 0);
    EXPECT_NE(bad.output.find("nope.h5"), std::string::npos) << bad.output;
    auto help = run_quintet(0, "generate --help");
    EXPECT_EQ(help.status, 0);
    EXPECT_NE(help.output.find("--temperature"), std::string::npos);
}

// ---- bad input: a clear message naming the key/value, exit status != 0, nothing written ----

struct BadCase {
    int ranks;
    std::string args;
    std::vector<std::string> message;  // every piece must appear
};

TEST_F(Fixture, BadInputsFailCleanlyBeforeAnyWork) {
    write_file(dir / "unknown.deck", std::string(kDeck) + "[model]\nd_modl = 4\n");
    write_file(dir / "garbage.h5", "this is not an HDF5 file at all");
    // A token file whose ids exceed its vocabulary.
    {
        std::string f = (dir / "badids.h5").string();
        hid_t file = H5Fcreate(f.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        hsize_t n = 1000;
        hid_t sp = H5Screate_simple(1, &n, nullptr);
        hid_t ds = H5Dcreate2(file, "/tokens", H5T_STD_U16LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        std::vector<uint16_t> t(n, 5);
        t[500] = 300;
        H5Dwrite(ds, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data());
        hid_t as = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(file, "vocab_size", H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
        int64_t v = 256;
        H5Awrite(a, H5T_NATIVE_INT64, &v);
        hid_t st = H5Tcopy(H5T_C_S1);
        H5Tset_size(st, 4);
        hid_t a2 = H5Acreate2(file, "tokenizer", st, as, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a2, st, "byte");
        H5Aclose(a2); H5Tclose(st); H5Aclose(a); H5Sclose(as); H5Dclose(ds); H5Sclose(sp); H5Fclose(file);
    }
    // A checkpoint of another model shape.
    auto other = train(1, "other", "--train.steps=0 --model.d_model=48");
    ASSERT_EQ(other.status, 0) << other.output;
    std::string other_ckpt = (dir / "other/checkpoints/step_00000000.h5").string();

    const std::vector<BadCase> cases = {
        {1, "--model.n_heads=abc", {"model.n_heads", "abc", "integer"}},
        {1, "--model.n_heads=5", {"model.n_heads", "5", "d_model"}},
        {1, "--model.n_kv_heads=3", {"model.n_kv_heads", "3", "n_heads"}},
        {1, "--data.order=shuffled", {"data.order", "shuffled", "random | sequential | shuffle"}},
        {1, "--model.nonsense=1", {"model.nonsense", "unknown key"}},
        {2, "--parallel.dp=3", {"parallel.dp", "3", "world size 2"}},
        {2, "--parallel.ep=2", {"parallel.ep", "needs MoE layers"}},
        {2, "--parallel.cp=2 --data.seq_len=18", {"data.seq_len", "2*parallel.cp = 4"}},
        {3, "--parallel.tp=3", {"model.n_heads", "4", "parallel.tp = 3"}},
        {4, "--parallel.tp=4 --model.ffn_dim=66", {"model.ffn_dim", "66", "parallel.tp = 4"}},
        {4, "--parallel.tp=4 --parallel.sequence_parallel=true --data.seq_len=82", {"data.seq_len", "82", "sequence_parallel"}},
        {2, "--parallel.pp=2 --model.n_layers=3", {"model.n_layers", "3", "parallel.pp = 2"}},
        {2, "--parallel.pp=2 --parallel.schedule=interleaved --parallel.virtual_stages=2 --parallel.microbatches=3",
         {"parallel.microbatches", "3", "interleaved"}},
        {2, "--parallel.pp=2 --parallel.pp_layers=1,2", {"parallel.pp_layers", "1,2"}},
        {2, "--parallel.pp=2 --parallel.schedule=zbv --parallel.virtual_stages=1", {"parallel.virtual_stages", "1", "zbv"}},
        {2, "--parallel.pp=2 --parallel.schedule=zbv", {"model.n_layers", "2", "2 * parallel.pp = 4"}},
        {1, "--parallel.zero=4", {"parallel.zero", "4", "[0, 3]"}},
        {2, "--parallel.pp=2 --parallel.schedule=zbv --parallel.virtual_stages=2 --parallel.zero=3 "
            "--model.tie_embeddings=true --model.n_layers=4", {"parallel.zero", "3", "tie_embeddings"}},
        {2, "--parallel.pp=2 --parallel.schedule=zbv --parallel.virtual_stages=2 --model.n_layers=6",
         {"model.n_layers", "6", "2 * parallel.pp = 4"}},
        {1, "--data.seq_len=30000", {"data.seq_len", "30000", "train split"}},
        {1, "--train.device=cuda", {"train.device", "cuda"}},
        {1, "--data.path=" + (dir / "missing.h5").string(), {"missing.h5"}},
        {1, "--data.path=" + (dir / "garbage.h5").string(), {"garbage.h5"}},
        {1, "--data.path=" + (dir / "badids.h5").string(), {"badids.h5", "300"}},
        {2, "--checkpoint.resume=" + other_ckpt, {"step_00000000.h5", "another model"}},
        {2, "--checkpoint.resume=" + (dir / "nope.h5").string(), {"nope.h5", "does not exist"}},
    };
    int k = 0;
    for (const auto& c : cases) {
        std::string run = "bad" + std::to_string(k++);
        auto r = train(c.ranks, run, c.args);
        EXPECT_NE(r.status, 0) << c.args << "\n" << r.output;
        for (const auto& piece : c.message)
            EXPECT_NE(r.output.find(piece), std::string::npos) << c.args << ": no '" << piece << "' in\n" << r.output;
        EXPECT_FALSE(fs::exists(dir / run)) << c.args << " left files behind";
    }
    auto u = run_quintet(1, "train " + (dir / "unknown.deck").string() + " --data.path=" + data.string());
    EXPECT_NE(u.status, 0);
    EXPECT_NE(u.output.find("d_modl"), std::string::npos) << u.output;
    EXPECT_NE(u.output.find("valid: d_model"), std::string::npos) << u.output;
}

}  // namespace
