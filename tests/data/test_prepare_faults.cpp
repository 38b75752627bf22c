// `quintet prepare` when things go wrong (docs/data.md, "Faults and exit statuses"): truncated
// gzip, zstd and xz inputs at random offsets; binary files, mixed directories, nested and several
// JSON keys, malformed lines up to --max-bad-lines; SIGINT at random moments of a 2-rank and a
// 1-rank prepare, then --resume, ending in the same bytes as an uninterrupted prepare; a disk that
// fills (a small tmpfs); two prepares into one output; a shard deleted or altered after prepare,
// which train refuses; --output rules; the same command twice gives the same bytes.
// ctest: labels=mpi timeout=900 launches_mpirun
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "quintet/io/token_data.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const std::string kBinary = QUINTET_BINARY;
const std::string kMpirun = std::string(QUINTET_MPIEXEC) + " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1";

std::string words(std::mt19937& g, int n) {
    static const char* w[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "then",
                              "some", "more", "words", "with", "unicode é ü", "Numbers 12345", "tabs\tand"};
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? " " : "") + std::string(w[g() % (sizeof w / sizeof *w)]);
    return s;
}

std::string json_words(std::mt19937& g, int n) {
    std::string s;
    for (char c : words(g, n)) s += c == '\t' ? std::string("\\t") : std::string(1, c);
    return s;
}

// Every file under `dir` (relative path -> bytes), for "nothing else changed" and equality checks.
std::map<std::string, std::string> tree(const fs::path& dir) {
    std::map<std::string, std::string> out;
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_file(e.path());
        else if (e.is_directory()) out[fs::relative(e.path(), dir).string() + "/"] = "";
    return out;
}

std::vector<std::string> names(const std::map<std::string, std::string>& t) {
    std::vector<std::string> n;
    for (const auto& [k, v] : t) n.push_back(k);
    return n;
}

// A command in `cwd`, started in its own process group; returns its pid.
pid_t start(const fs::path& cwd, const std::string& command, const std::string& log = "run.log") {
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        if (chdir(cwd.c_str()) != 0) _exit(127);
        // exec: the signal reaches quintet (or mpirun) itself, not a shell waiting for it.
        execl("/bin/sh", "sh", "-c", ("exec " + command + " > " + log + " 2>&1").c_str(), (char*)nullptr);
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

int wait_status(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

double seconds(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// SIGINT to a started command's process group and, under mpirun, to the ranks it started, which
// Open MPI puts in process groups of their own (and to which mpirun passes a SIGINT on only
// after they finish work this short): as a batch system's cancel signals every task.
void interrupt(pid_t pid) {
    kill(-pid, SIGINT);
    std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
    for (pid_t child; children >> child;) kill(-child, SIGINT);
}

// The units of work a prepare into `corpus` has finished (their counts written last).
int units_done(const fs::path& corpus) {
    std::error_code ec;
    int n = 0;
    for (fs::directory_iterator it(corpus / ".prepare", ec), end; !ec && it != end; it.increment(ec))
        n += it->path().extension() == ".json" && it->path().filename().string().rfind("unit_", 0) == 0;
    return n;
}

struct PrepareFaults : ::testing::Test {
    fs::path dir;
    void SetUp() override {
        dir = scratch_dir(std::string("prepare_faults_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    }
    RunResult prepare(int ranks, const std::string& args) { return run_quintet(ranks, "prepare " + args); }
    void write_deck() {
        write_file(dir / "t.deck", "[model]\nd_model = 16\nn_layers = 1\nn_heads = 2\nn_kv_heads = 2\nffn_dim = 32\n"
                                   "[data]\nseq_len = 16\nmicro_batch_size = 2\n[train]\nsteps = 1\n[output]\nlog_every = 1\n");
    }
};

TEST_F(PrepareFaults, TruncatedCompressedInputsAreNamedAtAnyByte) {
    std::mt19937 g(7);
    std::string text;
    for (int d = 0; d < 3000; ++d) text += "{\"text\": \"" + json_words(g, 20) + "\"}\n";
    fs::create_directories(dir / "in");
    write_file(dir / "in" / "c.jsonl", text);
    ASSERT_EQ(run_shell("cd " + dir.string() + "/in && gzip -k c.jsonl && zstd -q -k c.jsonl && xz -k c.jsonl").status, 0);
    // Whole, the three read as the plain file does.
    std::vector<uint32_t> plain;
    for (const char* f : {"c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "c.jsonl.xz"}) {
        const fs::path out = dir / (std::string("whole_") + f + ".h5");
        const RunResult r = prepare(0, "--input " + (dir / "in" / f).string() + " --jsonl-key text --tokenizer byte --output " +
                                           out.string());
        ASSERT_EQ(r.status, 0) << f << "\n" << r.output;
        const auto t = quintet::token_file_read(out.string()).tokens;
        if (plain.empty()) plain = t;
        EXPECT_EQ(t, plain) << f;
    }
    // Cut anywhere -- random offsets, inside the trailer, one byte short -- each is exit status 2
    // naming the file, and nothing is left behind.
    int cases = 0;
    for (const char* f : {"c.jsonl.gz", "c.jsonl.zst", "c.jsonl.xz"}) {
        const std::string whole = read_file(dir / "in" / f);
        std::vector<size_t> cuts = {whole.size() - 1, whole.size() - 4, whole.size() / 2, 20};
        for (int i = 0; i < 6; ++i) cuts.push_back(1 + g() % (whole.size() - 1));
        for (size_t cut : cuts) {
            const fs::path cutf = dir / (std::string("cut_") + f);
            write_file(cutf, whole.substr(0, cut));
            const fs::path out = dir / "cut_out";
            const RunResult r = prepare(cases % 2 ? 2 : 0, "--input " + cutf.string() +
                                                               " --jsonl-key text --tokenizer byte --shard-tokens 10000 --output " +
                                                               out.string());
            EXPECT_EQ(r.status, 2) << f << " cut at " << cut << " of " << whole.size() << "\n" << r.output;
            EXPECT_NE(r.output.find(cutf.filename().string()), std::string::npos) << r.output;
            EXPECT_TRUE(tree(out).empty()) << f << " cut at " << cut << ": left " << ::testing::PrintToString(names(tree(out)));
            fs::remove_all(out);
            ++cases;
        }
    }
    std::printf("[ faults ] %d truncated gzip/zstd/xz inputs refused, nothing left behind\n", cases);
}

TEST_F(PrepareFaults, MixedDirectoryBinaryFilesKeysAndBadLines) {
    std::mt19937 g(11);
    fs::create_directories(dir / "in" / "sub");
    std::string jsonl, nested, text;
    for (int d = 0; d < 50; ++d) jsonl += "{\"text\": \"" + json_words(g, 10) + "\"}\n";
    for (int d = 0; d < 50; ++d)
        nested += d % 2 ? "{\"meta\": {\"body\": \"" + json_words(g, 10) + "\"}}\n" : "{\"content\": \"" + json_words(g, 10) + "\"}\n";
    for (int d = 0; d < 100; ++d) text += words(g, 12) + "\n";
    write_file(dir / "in" / "a.jsonl", jsonl);
    write_file(dir / "in" / "sub" / "b.json", nested);
    write_file(dir / "in" / "c.txt", text);
    std::string bin(5000, '\0');
    for (char& c : bin) c = char(g());
    write_file(dir / "in" / "d.bin", bin);
    const std::string base = "--input " + (dir / "in").string() + " --jsonl-key text,content,meta.body --tokenizer byte";
    // A binary file is refused by default (exit 2, named), skipped and counted with --binary skip.
    RunResult r = prepare(0, base + " --output " + (dir / "x.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("d.bin' is not UTF-8 text"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "x.h5"));
    r = prepare(2, base + " --binary skip --output " + (dir / "x.h5").string());
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("skipped 1 input(s) that are not UTF-8"), std::string::npos) << r.output;
    // 50 + 50 JSON lines (three keys, one nested) and one text file: 101 documents, each ended.
    EXPECT_NE(r.output.find("101 document(s)"), std::string::npos) << r.output;
    const auto t = quintet::token_file_read((dir / "x.h5").string());
    EXPECT_EQ(std::count(t.tokens.begin(), t.tokens.end(), 0u), 101);
    // Malformed lines: the first stops the job (named); --max-bad-lines N skips up to N.
    write_file(dir / "in" / "sub" / "e.jsonl", "{\"text\": \"ok\"}\n{\"nope\": 1}\nnot json\n{\"text\": \"ok\"}\n");
    r = prepare(2, base + " --binary skip --output " + (dir / "y.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("e.jsonl' line 2"), std::string::npos) << r.output;
    r = prepare(2, base + " --binary skip --max-bad-lines 1 --output " + (dir / "y.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    r = prepare(2, base + " --binary skip --max-bad-lines 2 --output " + (dir / "y.h5").string());
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("skipped 2 malformed JSON line(s)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("103 document(s)"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "y.h5.prepare"));
}

TEST_F(PrepareFaults, OutputRules) {
    write_file(dir / "a.txt", "hello world, hello world\n");
    write_file(dir / "notes.txt", "my notes\n");
    // A file that is not a token file is never overwritten, --force or not.
    for (const char* force : {"", " --force"}) {
        const RunResult r = prepare(0, "--input " + (dir / "a.txt").string() + " --tokenizer byte --output " +
                                           (dir / "notes.txt").string() + force);
        EXPECT_EQ(r.status, 2) << r.output;
        EXPECT_NE(r.output.find("not a token file"), std::string::npos) << r.output;
        EXPECT_EQ(read_file(dir / "notes.txt"), "my notes\n");
    }
    // A token file: refused without --force, replaced with it.
    ASSERT_EQ(prepare(0, "--input " + (dir / "a.txt").string() + " --tokenizer byte --output " + (dir / "t.h5").string()).status, 0);
    RunResult r = prepare(0, "--input " + (dir / "notes.txt").string() + " --tokenizer byte --output " + (dir / "t.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
    r = prepare(0, "--input " + (dir / "notes.txt").string() + " --tokenizer byte --force --output " + (dir / "t.h5").string());
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(quintet::token_file_read((dir / "t.h5").string()).tokens.size(), 9u);
    // "newdir/" without --shard-tokens says what is expected; with it the directories are made.
    r = prepare(0, "--input " + (dir / "a.txt").string() + " --tokenizer byte --output " + (dir / "newdir").string() + "/");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("needs --shard-tokens"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "newdir"));
    r = prepare(0, "--input " + (dir / "a.txt").string() + " --tokenizer byte --shard-tokens 10 --output " +
                       (dir / "new" / "dir").string() + "/");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(fs::exists(dir / "new" / "dir" / "manifest.json"));
    // A complete corpus is not prepared into again.
    r = prepare(0, "--input " + (dir / "a.txt").string() + " --tokenizer byte --shard-tokens 10 --output " +
                       (dir / "new" / "dir").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("already holds a complete corpus"), std::string::npos) << r.output;
}

// The same command in two folders: the same bytes, manifest included.
TEST_F(PrepareFaults, SameCommandSameBytes) {
    std::mt19937 g(3);
    std::string text;
    for (int d = 0; d < 2000; ++d) text += words(g, 15) + "\n";
    write_file(dir / "in.txt", text);
    for (const char* run : {"a", "b"}) {
        fs::create_directories(dir / run);
        const RunResult r = run_shell("cd " + (dir / run).string() + " && " + kMpirun + " -n 2 " + kBinary +
                                      " prepare --input ../in.txt --tokenizer bpe --vocab-size 300 --shard-tokens 20000 "
                                      "--output corpus && " + kBinary +
                                      " prepare --input ../in.txt --tokenizer bpe --vocab-size 300 --output one.h5");
        ASSERT_EQ(r.status, 0) << r.output;
    }
    const auto a = tree(dir / "a"), b = tree(dir / "b");
    EXPECT_GT(a.size(), 5u);
    EXPECT_TRUE(a == b) << "the two runs' files differ";
}

// SIGINT at random moments of a prepare (2 ranks, then 1), each time --resume, until it completes:
// every stop leaves no shard, temporary or manifest -- only the state folder -- and train refuses
// the output; the completed corpus is byte for byte the uninterrupted one.
TEST_F(PrepareFaults, SigintAtRandomMomentsThenResumeEqualsUninterrupted) {
    std::mt19937 g(2024);
    std::string text;
    while (text.size() < (size_t(24) << 20)) text += words(g, 15) + "\nAnd " + words(g, 9) + "\n";
    write_file(dir / "in.txt", text);
    write_deck();
    const std::string args = " prepare --input ../in.txt --tokenizer bpe --vocab-size 300 --train-sample 1000000 "
                             "--shard-tokens 1000000 --output corpus";
    auto command = [&](int ranks, bool resume) {
        return (ranks > 1 ? kMpirun + " -x QUINTET_PREPARE_UNIT_BYTES -n 2 " : std::string()) + kBinary + args +
               (resume ? " --resume" : "");
    };
    setenv("QUINTET_PREPARE_UNIT_BYTES", "1000000", 1);
    constexpr int kUnits = 26;  // units of work of 1 MB
    std::map<std::string, std::string> ref;
    int stops = 0;
    bool train_checked = false;
    for (int ranks : {2, 1}) {
        // The uninterrupted prepare on this many ranks, timed: the stops fall inside it.
        const fs::path whole = dir / ("ref" + std::to_string(ranks));
        fs::create_directories(whole);
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(wait_status(start(whole, command(ranks, false))), 0) << read_file(whole / "run.log");
        const double d = seconds(t0);
        if (ref.empty()) ref = tree(whole / "corpus");
        ASSERT_GT(ref.size(), 10u);
        EXPECT_TRUE(tree(whole / "corpus") == ref) << "1 and 2 ranks differ";
        const fs::path work = dir / ("stopped" + std::to_string(ranks));
        fs::create_directories(work);
        bool done = false;
        for (int round = 0; round < 10 && !done; ++round) {
            const std::string log_name = "run" + std::to_string(round) + ".log";
            const auto before = tree(work / "corpus");
            const int had = units_done(work / "corpus");
            const pid_t pid = start(work, command(ranks, round > 0), log_name);
            const double u = double(g() % 1000) / 1000.0;
            if (round == 0 || had >= kUnits - 1) {
                // The first stop anywhere in the run (start-up, the tokenizer, the units, the
                // shards), a later one with little work left early.
                std::this_thread::sleep_for(std::chrono::duration<double>(d * (round == 0 ? 0.25 + 0.6 * u : 0.15 + 0.3 * u)));
            } else {
                // Other stops amid the units (a resumed run has less left than the first, and a
                // time on a loaded host can fall in its start-up or after its end): after a
                // random number of the units it had left.
                const int target = had + 1 + int(u * (kUnits - 1 - had));
                const auto t0 = std::chrono::steady_clock::now();
                auto running = [&] {  // not yet ended (the status is left for wait_status)
                    siginfo_t info{};
                    return waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
                };
                while (units_done(work / "corpus") < target && running() && seconds(t0) < 60)
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            if (round < 5) interrupt(pid);
            const int st = wait_status(pid);
            const std::string log = read_file(work / log_name);
            if (st == 0) {
                done = true;
                break;
            }
            // A signal that came as the prepare finished leaves a complete corpus; the next
            // --resume only tidies the state folder away.
            if (fs::exists(work / "corpus" / "manifest.json")) continue;
            // A signal before quintet began (MPI start-up) ends it by the default action: nothing
            // was touched.
            if (log.empty()) {
                EXPECT_TRUE(tree(work / "corpus") == before) << "a stop at start-up changed the output";
                continue;
            }
            ++stops;
            if (ranks == 1) EXPECT_EQ(st, 4) << log;
            EXPECT_NE(log.find("interrupted"), std::string::npos) << "status " << st << ": " << log;
            // Nothing but the state folder: no shard, no tokenizer, no manifest, no temporary.
            for (const auto& [name, bytes] : tree(work / "corpus")) {
                EXPECT_EQ(name.rfind(".prepare", 0), 0u) << "left after a stop: " << name;
                EXPECT_EQ(name.find(".part"), std::string::npos) << "left after a stop: " << name;
                EXPECT_EQ(name.find(".tmp"), std::string::npos) << "left after a stop: " << name;
            }
            if (!train_checked && fs::exists(work / "corpus" / ".prepare")) {
                train_checked = true;
                const RunResult r = run_quintet(0, "train " + (dir / "t.deck").string() + " --data.path=" +
                                                       (work / "corpus").string());
                EXPECT_EQ(r.status, 2) << r.output;
                EXPECT_NE(r.output.find("--resume"), std::string::npos) << r.output;
            }
        }
        ASSERT_TRUE(done);
        const auto got = tree(work / "corpus");
        EXPECT_EQ(names(got), names(ref)) << ranks << " rank(s)";
        EXPECT_TRUE(got == ref) << ranks << " rank(s): the resumed corpus differs from the uninterrupted one";
    }
    unsetenv("QUINTET_PREPARE_UNIT_BYTES");
    EXPECT_GE(stops, 3);
    EXPECT_TRUE(train_checked);
    std::printf("[ faults ] %d SIGINTs; each resumed corpus equals the uninterrupted one\n", stops);
}

// Two prepares into one output: the second is refused while the first runs, which completes.
TEST_F(PrepareFaults, TwoPreparesIntoOneOutput) {
    std::mt19937 g(5);
    std::string text;
    while (text.size() < (size_t(12) << 20)) text += words(g, 15) + "\n";
    write_file(dir / "in.txt", text);
    const std::string cmd = kBinary + " prepare --input ../in.txt --tokenizer bpe --vocab-size 300 --train-sample 100000 "
                                      "--shard-tokens 1000000 --output corpus";
    fs::create_directories(dir / "w");
    const pid_t first = start(dir / "w", cmd);
    // Wait until the first holds the lock, then hold the first still (SIGSTOP) so that it cannot
    // finish before the second starts, however fast or loaded the machine is.
    const fs::path lock = dir / "w" / "corpus" / ".prepare" / "lock";
    for (int i = 0; i < 3000 && !fs::exists(lock); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_EQ(kill(first, SIGSTOP), 0);
    ASSERT_TRUE(fs::exists(lock)) << "the first prepare never held the lock (or finished before it was stopped)";
    const RunResult second = run_shell("cd " + (dir / "w").string() + " && " + cmd);
    ASSERT_EQ(kill(first, SIGCONT), 0);
    EXPECT_EQ(second.status, 2) << second.output;
    EXPECT_NE(second.output.find("in use by another job"), std::string::npos) << second.output;
    EXPECT_EQ(wait_status(first), 0) << read_file(dir / "w" / "run.log");
    EXPECT_TRUE(fs::exists(dir / "w" / "corpus" / "manifest.json"));
    EXPECT_FALSE(fs::exists(dir / "w" / "corpus" / ".prepare"));
}

// A disk that fills during prepare: exit status 4, a message, and everything it wrote removed.
TEST_F(PrepareFaults, FullDiskRemovesEverything) {
    const fs::path mnt = dir / "small";
    fs::create_directories(mnt);
    if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=3m") != 0)
        GTEST_SKIP() << "cannot mount a tmpfs here (not root?): " << std::strerror(errno);
    std::mt19937 g(9);
    std::string text;
    while (text.size() < (size_t(4) << 20)) text += words(g, 15) + "\n";
    write_file(dir / "in.txt", text);
    for (int ranks : {0, 2}) {
        for (const std::string out : {"corpus --shard-tokens 100000", "one.h5"}) {
            const RunResult r = prepare(ranks, "--input " + (dir / "in.txt").string() + " --tokenizer byte --output " +
                                                   (mnt / "").string() + out);
            EXPECT_EQ(r.status, 4) << r.output;
            EXPECT_NE(r.output.find("No space left on device") + r.output.find("disk full"), 2 * std::string::npos) << r.output;
            EXPECT_TRUE(tree(mnt).empty() || names(tree(mnt)) == std::vector<std::string>{"corpus/"})
                << ::testing::PrintToString(names(tree(mnt)));
            fs::remove_all(mnt / "corpus");
        }
    }
    umount(mnt.c_str());
}

// A shard deleted or altered after prepare: train refuses the corpus (exit 2, naming the shard),
// unless told to use it as it is.
TEST_F(PrepareFaults, ShardDeletedOrAlteredAfterPrepare) {
    std::mt19937 g(4);
    std::string text;
    for (int d = 0; d < 3000; ++d) text += words(g, 15) + "\n";
    write_file(dir / "in.txt", text);
    write_deck();
    ASSERT_EQ(prepare(0, "--input " + (dir / "in.txt").string() + " --tokenizer byte --shard-tokens 20000 --output " +
                             (dir / "c").string()).status, 0);
    auto train = [&](const std::string& name, const std::string& extra) {
        return run_quintet(0, "train " + (dir / "t.deck").string() + " --data.path=" + (dir / "c").string() +
                                  " --output.run_dir=" + (dir / name).string() + " " + extra);
    };
    ASSERT_EQ(train("ok", "").status, 0);
    // Altered: same size, other tokens.
    const fs::path shard = dir / "c" / "shard_000002.h5";
    const auto h = quintet::token_file_header(shard.string());
    std::string bytes = read_file(shard);
    bytes[size_t(h.file_offset) + 100] ^= 0x01;
    write_file(shard, bytes);
    RunResult r = train("altered", "");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("shard_000002.h5"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("checksum"), std::string::npos) << r.output;
    // Deleted.
    fs::remove(shard);
    r = train("deleted", "");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("shard_000002.h5"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("missing"), std::string::npos) << r.output;
    // Used as it is when asked.
    r = train("as_is", "--data.allow_incomplete=true");
    EXPECT_EQ(r.status, 0) << r.output;
}

}  // namespace
