// The planner (perf/planner.cpp) against the trainer's own accounting (/memory/* in metrics.h5,
// written by the real `quintet train` under mpirun): params, grads, optimizer, activations and
// buffers to the byte, on every axis, MoE with ep, MLA, bf16, ZeRO and recompute. Also the
// `quintet plan` command: the JSON contract of docs/planner.md, invalid layouts with reasons, bad
// input.
// ctest: labels=mpi timeout=900 launches_mpirun
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "quintet/io/token_data.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/perf/planner.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet::testing;

namespace {

const char* kDeck = R"([model]
d_model = 48
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_dim = 96
[data]
seq_len = 32
micro_batch_size = 4
[train]
steps = 2
lr = 1e-3
[eval]
every = 0
[checkpoint]
every = 0
[output]
log_every = 1
)";

const char* kMoe = " --moe.experts=4 --moe.top_k=2 --moe.shared_experts=1 --moe.ffn_dim=32";

struct PlannerTest : TrainFixture {
    void SetUp() override { prepare("planner_", kDeck, 7); }

    // The trainer's last row of /memory/<cat>_bytes [step, rank] for every rank.
    std::vector<double> measured(const std::string& run, const std::string& cat, int ranks) {
        std::vector<double> v = metrics_column(dir / run, "/memory/" + cat + "_bytes");
        EXPECT_GE(v.size(), size_t(ranks));
        return std::vector<double>(v.end() - std::min<size_t>(v.size(), size_t(ranks)), v.end());
    }

    // Trains `run` on `ranks` with `extra` and holds the planner to its accounting (the optimizer
    // bytes to `optimizer_tol` relative when it is not 0).
    void check(int ranks, const std::string& run, const std::string& extra, double optimizer_tol = 0) {
        SCOPED_TRACE(run + ": " + extra);
        RunResult r = train(ranks, run, extra);
        ASSERT_EQ(r.status, 0) << r.output;
        // The same deck through the planner (overrides parsed as the trainer parses them).
        std::vector<std::string> ov{"--data.path=" + data.string()};
        std::regex arg("(--[a-z_]+\\.[a-z_]+=[^ ]+)");
        for (std::sregex_iterator it(extra.begin(), extra.end(), arg), end; it != end; ++it) ov.push_back((*it)[1]);
        quintet::Deck d = quintet::deck_load(deck.string(), ov);
        d.model.vocab_size = quintet::token_file_info(data.string()).vocab_size;
        quintet::MachineModel mm;
        mm.matmul_gflops_per_core = 10;
        const quintet::PlanRow p = quintet::plan_layout(d, ranks, mm);
        ASSERT_TRUE(p.valid) << p.reason;
        // The largest rank of the run by the planner's own total (params .. buffers).
        const auto params = measured(run, "params", ranks), grads = measured(run, "grads", ranks),
                   optim = measured(run, "optimizer", ranks), act = measured(run, "activations", ranks),
                   buf = measured(run, "buffers", ranks);
        double best_model = -1;
        int big = 0;
        for (int q = 0; q < ranks; ++q) {
            const double t = params[q] + grads[q] + optim[q] + act[q] + buf[q];
            if (t > best_model) best_model = t, big = q;
        }
        EXPECT_EQ(p.memory.params, params[big]) << "rank " << big;
        EXPECT_EQ(p.memory.grads, grads[big]) << "rank " << big;
        if (optimizer_tol == 0) EXPECT_EQ(p.memory.optimizer, optim[big]) << "rank " << big;
        else EXPECT_NEAR(p.memory.optimizer, optim[big], optimizer_tol * optim[big]) << "rank " << big;
        // Activations and buffers come from the same declarations of the layer modules, laid out
        // the same way: the bytes are the trainer's, exactly.
        EXPECT_EQ(p.memory.activations, act[big]) << "rank " << big;
        EXPECT_EQ(p.memory.buffers, buf[big]) << "rank " << big;
        // Every rank's peak RSS is measured and holds at least its accounted buffers.
        const auto rss = measured(run, "peak_rss", ranks);
        for (int q = 0; q < ranks; ++q) EXPECT_GT(rss[q], params[q] + grads[q] + optim[q] + act[q]) << "rank " << q;
        EXPECT_NE(r.output.find("predicted (quintet plan) / measured"), std::string::npos) << r.output;
    }
};

TEST_F(PlannerTest, OneRankAndDataParallel) {
    check(1, "r1", "");
    check(2, "dp2", "");
    check(2, "dp2_zero", "--parallel.zero=1");
}

// ZeRO-2/3: the gradient shard and windows, the parameter slices and gather windows (bf16
// copies included), the moments of the slices -- on dense and expert groups, with buffers (the
// aux-free bias), a pipeline under zbv, tensor parallelism.
TEST_F(PlannerTest, ZeroTwoAndThree) {
    check(2, "dp2_zero2", "--parallel.zero=2");
    check(2, "dp2_zero3", "--parallel.zero=3");
    check(2, "dp2_zero3_bf16", "--parallel.zero=3 --train.precision=bf16");
    check(4, "tp2_dp2_zero3", "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.zero=3");
    check(4, "pp2_dp2_zero3_zbv", "--parallel.pp=2 --parallel.microbatches=4 --parallel.zero=3 --parallel.schedule=zbv"
                                  " --parallel.virtual_stages=2");
    check(4, "moe_ep2_zero3", std::string(kMoe) + " --parallel.ep=2 --parallel.zero=3 --moe.balance=aux_free");
    check(4, "moe_ep2_zero2_bf16", std::string(kMoe) + " --parallel.ep=2 --parallel.zero=2 --train.precision=bf16");
}

// train.optimizer = muon: AdamW's moments for the other tensors only, and Muon's momentum on
// each matrix's owner with the exchange's staging and the Newton-Schulz scratch -- to the byte
// without ZeRO on every axis, dense and MoE (kv heads shared by tp ranks, experts whole on every
// tp rank); under ZeRO the slices cut tensors where they fall and the planner spreads each
// evenly: within 6% (measured: 0, 0.2% and 3.6% here).
TEST_F(PlannerTest, Muon) {
    const std::string mu = " --train.optimizer=muon";
    check(1, "muon1", mu);
    check(2, "muon_dp2", mu);
    check(4, "muon_dp4", mu);
    check(2, "muon_tp2", mu + " --parallel.tp=2");
    check(4, "muon_tp4", mu + " --parallel.tp=4");  // kv heads shared by tp pairs
    check(4, "muon_tp2_dp2", mu + " --parallel.tp=2 --parallel.sequence_parallel=true");
    check(2, "muon_pp2", mu + " --parallel.pp=2 --parallel.microbatches=4");
    check(2, "muon_cp2", mu + " --parallel.cp=2");
    check(1, "muon_moe1", mu + kMoe);
    check(2, "muon_moe_ep2", mu + kMoe + " --parallel.ep=2");
    check(4, "muon_moe_ep2_dp4", mu + kMoe + " --parallel.ep=2");
    check(4, "muon_moe_tp2_ep2", mu + kMoe + " --parallel.tp=2 --parallel.ep=2 --parallel.sequence_parallel=true");
    check(2, "muon_zero1", mu + " --parallel.zero=1", 0.06);
    check(4, "muon_zero3", mu + " --parallel.zero=3", 0.06);
    check(4, "muon_moe_ep2_zero2", mu + kMoe + " --parallel.ep=2 --parallel.zero=2", 0.06);
    // The Newton-Schulz FLOPs are the optimizer's, apart from the model's (MFU): 4 layers of
    // q, k, v, o [48 x 48, 24 x 48 twice, 48 x 48] and gate, up, down [96 x 48 twice, 48 x 96],
    // five steps of 4 m^2 n + 2 m^3 each, on one rank.
    std::vector<std::string> ov{"--data.path=" + data.string(), "--train.optimizer=muon"};
    quintet::Deck d = quintet::deck_load(deck.string(), ov);
    d.model.vocab_size = quintet::token_file_info(data.string()).vocab_size;
    quintet::MachineModel mm;
    mm.matmul_gflops_per_core = 10;
    const quintet::PlanRow muon = quintet::plan_layout(d, 1, mm);
    auto ns = [](double m, double n) { return 5 * (4 * m * m * n + 2 * m * m * m); };
    EXPECT_DOUBLE_EQ(muon.optimizer_flops, 4 * (2 * ns(48, 48) + 2 * ns(24, 48) + 3 * ns(48, 96)));
    d.train.optimizer = "adamw";
    const quintet::PlanRow adamw = quintet::plan_layout(d, 1, mm);
    EXPECT_EQ(adamw.optimizer_flops, 0.0);
    EXPECT_EQ(muon.flops_per_step, adamw.flops_per_step);
    EXPECT_GT(muon.step_time_s, adamw.step_time_s + muon.optimizer_flops / 10e9 * 0.99);
    EXPECT_LT(muon.mfu, adamw.mfu);
    // Its exchange on two data-parallel ranks: each owner sends the update of its matrices to
    // the other replica, on the dp axis (no ZeRO, tp = 1: the gradients are in place).
    const quintet::PlanRow dp2 = quintet::plan_layout(d, 2, mm);
    d.train.optimizer = "muon";
    const quintet::PlanRow mdp2 = quintet::plan_layout(d, 2, mm);
    EXPECT_GT(mdp2.comm_bytes.dp, dp2.comm_bytes.dp);
    EXPECT_EQ(mdp2.comm_bytes.tp, 0.0);
}

TEST_F(PlannerTest, TensorAndSequenceParallel) {
    check(2, "tp2", "--parallel.tp=2");
    check(2, "tp2sp", "--parallel.tp=2 --parallel.sequence_parallel=true");
}

TEST_F(PlannerTest, PipelineSchedules) {
    check(2, "pp2", "--parallel.pp=2 --parallel.microbatches=4");
    check(2, "pp2_gpipe", "--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=gpipe");
    check(2, "pp2_int", "--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=interleaved --parallel.virtual_stages=2");
    // The zero-bubble schedules: W's operands kept per slot, slots held from F to W, zbv's
    // local staging of the V's turn.
    check(2, "pp2_zbh1", "--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=zb_h1");
    check(2, "pp2_zbv", "--parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=zbv --parallel.virtual_stages=2");
    check(2, "pp2_zbv_moe_bf16_full", std::string(kMoe) + " --parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=zbv"
                                       " --parallel.virtual_stages=2 --train.precision=bf16 --train.recompute=full");
}

TEST_F(PlannerTest, ContextParallel) { check(2, "cp2", "--parallel.cp=2"); }

// checkpoint.async: the staging copy (each rank's dp-owned slice with both moments, the buffers
// on the first rank of its group; under ZeRO-3 its slices) is counted in buffers, exactly.
TEST_F(PlannerTest, BackgroundCheckpointStagingIsBuffers) {
    check(2, "dp2_async", "--checkpoint.async=true --checkpoint.every=5");
    check(4, "tp2_dp2_zero3_async", "--parallel.tp=2 --parallel.sequence_parallel=true --parallel.zero=3 --checkpoint.async=true");
    check(4, "moe_ep2_async", std::string(kMoe) + " --parallel.ep=2 --moe.balance=aux_free --checkpoint.async=true");
    // Muon: AdamW's moments of its tensors only, and the momentum of the matrices the rank owns.
    check(1, "muon1_async", "--train.optimizer=muon --checkpoint.async=true");
    check(2, "muon_tp2_async", "--train.optimizer=muon --parallel.tp=2 --checkpoint.async=true");
}

TEST_F(PlannerTest, ExpertsAndPrecisionAndRecompute) {
    check(1, "moe1", kMoe);
    check(2, "moe_ep2", std::string(kMoe) + " --parallel.ep=2");
    check(1, "bf16", "--train.precision=bf16");
    check(1, "full", "--train.recompute=full");
    check(1, "selective", "--train.recompute=selective");
    check(2, "moe_tp2", std::string(kMoe) + " --parallel.tp=2 --parallel.sequence_parallel=true --train.precision=bf16");
}

// MLA (both ways of moving K/V under cp), MoE on some layers only, documents, full recompute of
// a mixed model, an interleaved MoE pipeline: the declarations hold for every block kind.
TEST_F(PlannerTest, MlaMixedLayersAndContext) {
    const std::string mla = " --model.attention=mla --model.n_kv_heads=0 --model.kv_lora_rank=16 --model.q_lora_rank=24"
                            " --model.qk_nope_dim=8 --model.qk_rope_dim=4 --model.v_head_dim=8";
    check(1, "mla", mla);
    check(2, "mla_cp_ring", mla + " --parallel.cp=2");
    check(2, "mla_cp_latent", mla + " --parallel.cp=2 --parallel.cp_mla_kv=latent --train.precision=bf16");
    check(2, "moe_some_full", std::string(kMoe) + " --moe.layers=1,3 --train.recompute=full --parallel.ep=2");
    check(2, "cp_docs_sel", "--parallel.cp=2 --data.document_mask=true --data.eos_id=3 --train.recompute=selective");
    check(2, "moe_pp_int", std::string(kMoe) + " --parallel.pp=2 --parallel.microbatches=4 --parallel.schedule=interleaved"
                           " --parallel.virtual_stages=2 --moe.balance=aux_free");
}

TEST_F(PlannerTest, PlanCommandJsonContract) {
    RunResult r = run_quintet(0, "plan " + deck.string() + " --data.path=" + data.string() + " --world 4 --json" + kMoe);
    ASSERT_EQ(r.status, 0) << r.output;
    // stdout is only JSON: a list of objects with the keys docs/planner.md lists.
    ASSERT_EQ(r.output.front(), '[') << r.output;
    for (const char* k : {"\"tp\"", "\"cp\"", "\"dp\"", "\"pp\"", "\"ep\"", "\"microbatches\"", "\"zero\"", "\"recompute\"",
                          "\"valid\"", "\"reason\"", "\"memory_bytes\"", "\"params\"", "\"grads\"", "\"optimizer\"",
                          "\"activations\"", "\"buffers\"", "\"runtime\"", "\"total\"", "\"comm_bytes\"", "\"bubble\"",
                          "\"step_time_s\"", "\"tokens_per_s\""})
        EXPECT_NE(r.output.find(k), std::string::npos) << k;
    // 4 ranks: 15 (tp, cp, pp) x ep combinations; some invalid (tp 4 > kv heads is fine, cp 4
    // needs seq divisible by 8: fine; MoE with tp needs SP: invalid) -- each with a reason.
    const std::string& o = r.output;
    EXPECT_NE(o.find("\"valid\": false, \"reason\": \"deck key"), std::string::npos) << o;
    EXPECT_NE(o.find("\"ep\": 4"), std::string::npos) << o;
    // Python's json module parses it (if present): the same check a script would make.
    write_file(dir / "plan.json", o);
    RunResult py = run_shell("/usr/bin/python3 -c \"import json,sys; rows=json.load(open('" + (dir / "plan.json").string() +
                                       "')); assert all((r['tokens_per_s'] is None) == (not r['valid']) for r in rows); "
                                       "print(len(rows))\"");
    if (py.status == 0) EXPECT_GE(std::stoi(py.output), 10) << py.output;
}

TEST_F(PlannerTest, PlanCommandTableAndErrors) {
    RunResult r = run_quintet(0, "plan " + deck.string() + " --data.path=" + data.string() + " --world 2 --device-memory 0.001");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("does not fit --device-memory"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
    RunResult bad = run_quintet(0, "plan " + deck.string() + " --world 0");
    EXPECT_EQ(bad.status, 2);
    EXPECT_NE(bad.output.find("--world"), std::string::npos) << bad.output;
    RunResult nosweep = run_quintet(0, "plan " + deck.string() + " --data.path=" + data.string() + " --world 2 --sweep parallel.tp=1,2");
    EXPECT_EQ(nosweep.status, 2);
    EXPECT_NE(nosweep.output.find("parallel.microbatches, parallel.zero, train.recompute or data.micro_batch_size"), std::string::npos) << nosweep.output;
    RunResult badval = run_quintet(0, "plan " + deck.string() + " --data.path=" + data.string() + " --world 2 --sweep train.recompute=most");
    EXPECT_EQ(badval.status, 2);
    EXPECT_NE(badval.output.find("train.recompute"), std::string::npos) << badval.output;
    RunResult help = run_quintet(0, "plan --help");
    EXPECT_EQ(help.status, 0);
    EXPECT_NE(help.output.find("--world N"), std::string::npos);
}

}  // namespace
