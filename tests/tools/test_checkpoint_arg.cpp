// `--checkpoint` of eval, generate, export and tokenize takes a checkpoint file, a run folder,
// its checkpoints/ folder (with or without a trailing slash) or the `latest` file: the folder
// forms resolve to the checkpoint `latest` names, said on stderr, and give what the file gives. A
// folder without `latest`, or a `latest` naming a missing file, is exit 2 saying what to give.
// ctest: labels=mpi timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 16
n_layers = 1
n_heads = 2
ffn_dim = 32
[data]
seq_len = 16
micro_batch_size = 1
[train]
steps = 2
warmup = 0
[eval]
every = 0
batches = 2
[checkpoint]
every = 1
[output]
log_every = 1
)";

std::string last_line(const std::string& out) {
    std::string s = out;
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s.substr(s.rfind('\n') + 1);
}

struct CheckpointArg : ::testing::Test {
    fs::path dir, run, file;
    void SetUp() override {
        dir = scratch_dir("checkpoint_arg");
        write_file(dir / "model.deck", kDeck);
        make_token_file(dir / "tokens.h5", 4000, 256, 5);
        run = dir / "run";
        const auto r = run_quintet(0, "train " + (dir / "model.deck").string() + " --data.path=" +
                                          (dir / "tokens.h5").string() + " --output.run_dir=" + run.string());
        ASSERT_EQ(r.status, 0) << r.output;
        file = run / "checkpoints/step_00000002.h5";
        ASSERT_TRUE(fs::exists(run / "checkpoints/step_00000001.h5"));
        ASSERT_EQ(read_file(run / "checkpoints/latest"), "step_00000002.h5\n");
    }
};

TEST_F(CheckpointArg, AFolderOrLatestIsTheCheckpointLatestNames) {
    const std::vector<std::string> forms = {run.string(), run.string() + "/", (run / "checkpoints").string(),
                                            (run / "checkpoints").string() + "/", (run / "checkpoints/latest").string()};
    auto tokenize = [&](const std::string& ck) { return run_shell("echo 'to be or not' | " + std::string(QUINTET_BINARY) +
                                                                    " tokenize --checkpoint " + ck); };
    auto generate = [&](const std::string& ck) {  // stdout only: its last line is the ids
        return run_shell("( " + std::string(QUINTET_BINARY) + " generate --checkpoint " + ck +
                         " --prompt-ids '1 2 3' --tokens 4 --temperature 0 --print-ids 2>/dev/null )");
    };
    auto eval = [&](const std::string& ck) {
        return run_quintet(0, "eval --checkpoint " + ck + " --data " + (dir / "tokens.h5").string());
    };
    const auto t0 = tokenize(file.string()), g0 = generate(file.string()), e0 = eval(file.string());
    ASSERT_EQ(t0.status, 0) << t0.output;
    ASSERT_EQ(g0.status, 0) << g0.output;
    ASSERT_EQ(e0.status, 0) << e0.output;
    for (const std::string& ck : forms) {
        const auto t = tokenize(ck), g = generate(ck), e = eval(ck);
        EXPECT_EQ(t.status, 0) << ck << "\n" << t.output;
        EXPECT_EQ(last_line(t.output), last_line(t0.output)) << ck;
        EXPECT_NE(t.output.find("step_00000002.h5, the checkpoint"), std::string::npos) << t.output;
        EXPECT_EQ(g.status, 0) << ck << "\n" << g.output;
        EXPECT_EQ(last_line(g.output), last_line(g0.output)) << ck;
        EXPECT_NE(last_line(g.output).find("1 2 3"), std::string::npos) << g.output;
        EXPECT_EQ(e.status, 0) << ck << "\n" << e.output;
        EXPECT_EQ(last_line(e.output), last_line(e0.output)) << ck;
        EXPECT_NE(e.output.find("eval: --checkpoint '" + ck + "': "), std::string::npos) << e.output;
    }
    const auto x = run_quintet(0, "export --checkpoint " + (run / "checkpoints/latest").string() +
                                      " --format gguf --output " + (dir / "m.gguf").string());
    EXPECT_EQ(x.status, 0) << x.output;
    EXPECT_NE(x.output.find("from " + file.string()), std::string::npos) << x.output;
}

TEST_F(CheckpointArg, AFolderWithoutLatestSaysWhatToGive) {
    fs::create_directories(dir / "empty");
    auto r = run_quintet(0, "generate --checkpoint " + (dir / "empty").string() + " --prompt x");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("is a folder without checkpoints/latest or latest"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("give a checkpoint file (step_NNNNNNNN.h5), a run folder or its checkpoints/ folder"),
              std::string::npos) << r.output;
    // `latest` naming a checkpoint that was pruned.
    write_file(run / "checkpoints/latest", "step_00000009.h5\n");
    r = run_quintet(0, "eval --checkpoint " + run.string() + " --data " + (dir / "tokens.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("names 'step_00000009.h5', which is not there"), std::string::npos) << r.output;
}

// The files eval and generate write are checked before any work, as export's are: a missing
// folder, a folder given for a file: exit 2 naming the option, not a failure after the work.
TEST_F(CheckpointArg, OutputFilesAreCheckedBeforeAnyWork) {
    auto r = run_quintet(0, "eval --checkpoint " + file.string() + " --data " + (dir / "tokens.h5").string() +
                                " --by-position " + (dir / "missing/pos.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("eval: --by-position '" + (dir / "missing/pos.h5").string() + "': the folder"),
              std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("val_loss="), std::string::npos) << "evaluated before refusing:\n" << r.output;
    r = run_quintet(0, "eval --checkpoint " + file.string() + " --data " + (dir / "tokens.h5").string() +
                           " --passkey 1 --passkey-out " + run.string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("eval: --passkey-out '" + run.string() + "' is a folder"), std::string::npos) << r.output;
    r = run_quintet(0, "generate --checkpoint " + file.string() + " --prompt x --probs " + (dir / "missing/p.f32").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("generate: --probs"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "missing"));
}

}  // namespace
