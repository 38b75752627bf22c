// The parameter groups in a run: printed at start-up, stored in checkpoints, and a resume that
// changes them -- refused where µP's forward multipliers would change (another model), reported
// with the groups before and after where only the learning rates change; [groups] overrides act
// (a group at learning rate 0 does not move).
// ctest: labels=mpi launches_mpirun timeout=600
#include <gtest/gtest.h>

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
micro_batch_size = 4
[train]
steps = 4
lr = 1e-2
warmup = 1
seed = 3
peak_tflops = 0.1
[init]
scheme = mup
base_width = 16
[checkpoint]
every = 2
[output]
log_every = 1
)";

struct GroupsRun : TrainFixture {
    void SetUp() override { prepare("groups_run_", kDeck, 9); }
};

}  // namespace

TEST_F(GroupsRun, PrintedStoredAndChangesOnResume) {
    const RunResult r = train(1, "run", "");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* piece : {"parameter groups (init.scheme = mup, width x2", "logits x0.5", "hidden", "lr x0.5",
                              "embedding", "norm"})
        EXPECT_NE(r.output.find(piece), std::string::npos) << piece << "\n" << r.output;
    // Another base width is another model: refused, naming the multipliers.
    const RunResult other = train(1, "run", "--train.steps=6 --init.base_width=8");
    EXPECT_EQ(other.status, 2) << other.output;
    EXPECT_NE(other.output.find("µP forward multipliers"), std::string::npos) << other.output;
    // Only a learning rate: reported with the table before and after, and the run goes on.
    const RunResult lr = train(1, "run", "--train.steps=6 --groups.hidden_lr=0.25");
    ASSERT_EQ(lr.status, 0) << lr.output;
    EXPECT_NE(lr.output.find("parameter groups (from the resumed step)"), std::string::npos) << lr.output;
    EXPECT_NE(lr.output.find("groups.hidden_lr: auto -> 0.25"), std::string::npos) << lr.output;
}

TEST_F(GroupsRun, AGroupAtLearningRateZeroStaysPut) {
    ASSERT_EQ(train(1, "frozen", "--groups.hidden_lr=0 --groups.output_lr=0 --train.weight_decay=0").status, 0);
    const auto t = checkpoint_tensors((dir / "frozen/checkpoints/step_00000004.h5").string());
    ASSERT_EQ(train(1, "s0", "--train.steps=0").status, 0);
    const auto t0 = checkpoint_tensors((dir / "s0/checkpoints/step_00000000.h5").string());
    int frozen = 0, moved = 0;
    for (const auto& [name, v] : t) {
        if (name.rfind("params/", 0) != 0) continue;
        for (const auto& [name0, v0] : t0)
            if (name0 == name) {
                const bool hidden = name.find("_proj") != std::string::npos || name.find("lm_head") != std::string::npos;
                if (hidden) {
                    EXPECT_EQ(v, v0) << name << " moved at learning rate 0";
                    ++frozen;
                } else if (v != v0) {
                    ++moved;
                }
            }
    }
    EXPECT_GT(frozen, 5);
    EXPECT_GT(moved, 0);  // the embedding and norms still train
}
