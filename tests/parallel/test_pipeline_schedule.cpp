// Pipeline schedules without MPI (the schedule is data: a pure function per stage): for every
// valid (kind, p, m, v) with p <= 8, m <= 16, v <= 4, each stage's action list is checked
// structurally, the neighbours' send/recv sequences are matched link by link, all stages are
// simulated together (no deadlock, dependencies respected in time), and the idle fractions and
// in-flight peaks equal the theory -- for 1f1b, gpipe and interleaved, and (below) for the
// zero-bubble schedules zb_h1 and zbv, whose backwards are split into B and W.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"

using namespace quintet;

namespace {

struct Case {
    std::string kind;
    int pp, m, v;
    std::string name() const {
        return kind + " pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
               " v=" + std::to_string(v);
    }
};

// Every valid combination in the test range.
std::vector<Case> all_cases() {
    std::vector<Case> out;
    for (std::string kind : {"1f1b", "gpipe", "interleaved"})
        for (int pp = 1; pp <= 8; ++pp)
            for (int m = 1; m <= 16; ++m)
                for (int v = 1; v <= 4; ++v)
                    if (schedule_check(kind, pp, m, v, 0).empty()) out.push_back({kind, pp, m, v});
    return out;
}

std::vector<std::vector<Action>> all_stages(const Case& c) {
    std::vector<std::vector<Action>> lists;
    for (int s = 0; s < c.pp; ++s) lists.push_back(make_schedule(c.kind, c.pp, s, c.m, c.v));
    return lists;
}

int warmup_of(const Case& c, int stage) {
    if (c.kind == "gpipe") return c.m;
    if (c.kind == "1f1b") return std::min(c.pp - stage - 1, c.m);
    return std::min((c.pp - stage - 1) * 2 + (c.v - 1) * c.pp, c.m * c.v);
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(PipelineSchedule, CoversTheRange) {
    auto cases = all_cases();
    int interleaved = 0;
    for (auto& c : cases) interleaved += c.kind == "interleaved";
    EXPECT_EQ(cases.size() - interleaved, 2u * 8 * 16);  // 1f1b and gpipe: every (p, m), v = 1
    EXPECT_GT(interleaved, 50);
}

// Each (mb, chunk) has one forward and one backward, forward first; transfers sit right next to
// their compute action exactly where the conventions in pipeline_schedule.hpp say.
TEST(PipelineSchedule, EveryMicrobatchOnceWithItsTransfers) {
    for (const Case& c : all_cases()) {
        SCOPED_TRACE(c.name());
        const int last_vs = c.pp * c.v - 1;
        for (int s = 0; s < c.pp; ++s) {
            SCOPED_TRACE("stage " + std::to_string(s));
            const auto acts = make_schedule(c.kind, c.pp, s, c.m, c.v);
            std::map<std::pair<int, int>, int> fwd_at, bwd_at;
            for (size_t i = 0; i < acts.size(); ++i) {
                const Action& a = acts[i];
                ASSERT_GE(a.microbatch, 0);
                ASSERT_LT(a.microbatch, c.m);
                ASSERT_GE(a.chunk, 0);
                ASSERT_LT(a.chunk, c.v);
                const int vs = virtual_stage(c.pp, s, a.chunk);
                auto prev = [&](Op op) { return i > 0 && acts[i - 1] == Action{op, a.microbatch, a.chunk}; };
                auto next = [&](Op op) {
                    return i + 1 < acts.size() && acts[i + 1] == Action{op, a.microbatch, a.chunk};
                };
                const std::pair<int, int> key{a.microbatch, a.chunk};
                switch (a.op) {
                    case Op::forward:
                        ASSERT_EQ(fwd_at.count(key), 0u) << "second forward";
                        fwd_at[key] = int(i);
                        EXPECT_EQ(prev(Op::recv_fwd), vs != 0);
                        EXPECT_EQ(next(Op::send_fwd), vs != last_vs);
                        break;
                    case Op::backward:
                        ASSERT_EQ(bwd_at.count(key), 0u) << "second backward";
                        ASSERT_EQ(fwd_at.count(key), 1u) << "backward before forward";
                        bwd_at[key] = int(i);
                        EXPECT_EQ(prev(Op::recv_bwd), vs != last_vs);
                        EXPECT_EQ(next(Op::send_bwd), vs != 0);
                        break;
                    case Op::recv_fwd: EXPECT_TRUE(next(Op::forward)); break;
                    case Op::send_fwd: EXPECT_TRUE(prev(Op::forward)); break;
                    case Op::recv_bwd: EXPECT_TRUE(next(Op::backward)); break;
                    case Op::send_bwd: EXPECT_TRUE(prev(Op::backward)); break;
                }
            }
            EXPECT_EQ(fwd_at.size(), size_t(c.m) * c.v);
            EXPECT_EQ(bwd_at.size(), size_t(c.m) * c.v);
            for (auto& [key, i] : fwd_at) EXPECT_LT(i, bwd_at[key]);
        }
    }
}

// On every directed link, the sender's sends and the receiver's recvs name the same messages in
// the same order (checked here from the lists alone, independently of the simulator).
TEST(PipelineSchedule, NeighbourSendsAndRecvsMatchInOrder) {
    for (const Case& c : all_cases()) {
        SCOPED_TRACE(c.name());
        using Link = std::tuple<int, int, bool>;  // sender, receiver, bwd
        std::map<Link, std::vector<std::pair<int, int>>> sent, received;  // (mb, receiver chunk)
        const auto lists = all_stages(c);
        for (int s = 0; s < c.pp; ++s)
            for (const Action& a : lists[s]) {
                if (a.op == Op::forward || a.op == Op::backward) continue;
                const SchedulePeer peer = schedule_peer(c.pp, c.v, s, a);
                const bool bwd = a.op == Op::send_bwd || a.op == Op::recv_bwd;
                if (a.op == Op::send_fwd || a.op == Op::send_bwd) {
                    EXPECT_EQ(virtual_stage(c.pp, peer.stage, peer.chunk),
                              virtual_stage(c.pp, s, a.chunk) + (bwd ? -1 : 1));
                    sent[{s, peer.stage, bwd}].push_back({a.microbatch, peer.chunk});
                } else {
                    received[{peer.stage, s, bwd}].push_back({a.microbatch, a.chunk});
                }
            }
        EXPECT_EQ(sent, received);
        size_t messages = 0;
        for (auto& [link, seq] : sent) messages += seq.size();
        EXPECT_EQ(messages, 2u * c.m * (c.pp * c.v - 1));  // one each way per virtual-stage edge
    }
}

// All stages together: no deadlock, and virtual stage vs runs mb i after vs-1 (forward) and after
// vs+1 (backward) in simulated time, with the simulated busy time m*(tf+tb) per stage.
TEST(PipelineSchedule, SimulationRespectsDependencies) {
    for (const Case& c : all_cases()) {
        SCOPED_TRACE(c.name());
        Simulation sim;
        ASSERT_NO_THROW(sim = simulate(c.kind, c.pp, c.m, c.v, 1.0, 2.0));
        ASSERT_EQ(sim.stages.size(), size_t(c.pp));
        const int nvs = c.pp * c.v;
        // [vs][mb] -> (start, end) of forward / backward
        std::vector<std::vector<std::pair<double, double>>> f(nvs, std::vector<std::pair<double, double>>(c.m, {-1, -1})),
            b = f;
        for (int s = 0; s < c.pp; ++s) {
            const auto& T = sim.stages[s];
            EXPECT_NEAR(T.busy, c.m * 3.0, 1e-9);
            double clock = 0;
            for (const auto& [t0, t1, op, mb, chunk] : T.slots) {
                EXPECT_GE(t0, clock - 1e-12) << "overlapping slots on stage " << s;
                clock = t1;
                auto& slot = (op == Op::forward ? f : b)[virtual_stage(c.pp, s, chunk)][mb];
                slot = {t0, t1};
            }
        }
        for (int vs = 0; vs < nvs; ++vs)
            for (int i = 0; i < c.m; ++i) {
                ASSERT_GE(f[vs][i].first, 0);
                ASSERT_GE(b[vs][i].first, f[vs][i].second - 1e-12);
                if (vs > 0) {
                    EXPECT_GE(f[vs][i].first, f[vs - 1][i].second - 1e-12) << "vs " << vs << " mb " << i;
                }
                if (vs + 1 < nvs) {
                    EXPECT_GE(b[vs][i].first, b[vs + 1][i].second - 1e-12) << "vs " << vs << " mb " << i;
                }
            }
        if (c.pp * c.v > 1) {
            EXPECT_GT(sim.makespan, c.m * 3.0);
        }
    }
}

// Idle fraction 1 - busy/makespan equals the formula on every stage (docs/math.md §7.1): with
// equal costs, and with tb = 2 tf as well.
TEST(PipelineSchedule, IdleFractionsEqualTheory) {
    for (const Case& c : all_cases())
        for (double tb : {1.0, 2.0, 3.0}) {
            SCOPED_TRACE(c.name() + " tb=" + std::to_string(tb));
            const Simulation sim = simulate(c.kind, c.pp, c.m, c.v, 1.0, tb);
            const double theory = bubble_theory(c.kind, c.pp, c.m, c.v);
            for (int s = 0; s < c.pp; ++s) EXPECT_NEAR(sim.stages[s].idle_fraction, theory, 1e-9) << "stage " << s;
            EXPECT_NEAR(sim.makespan, c.m * (1.0 + tb) / (1.0 - theory), 1e-9);
        }
    EXPECT_DOUBLE_EQ(bubble_theory("1f1b", 4, 8, 1), 3.0 / 11.0);
    EXPECT_DOUBLE_EQ(bubble_theory("gpipe", 4, 8, 1), 3.0 / 11.0);
    EXPECT_DOUBLE_EQ(bubble_theory("interleaved", 4, 8, 2), 3.0 / 19.0);
}

// Activation memory: 1F1B holds at most p - stage microbatches (never more than p), GPipe all m,
// interleaved warm-up + 1 chunk-microbatches.
TEST(PipelineSchedule, PeakInFlight) {
    for (const Case& c : all_cases()) {
        SCOPED_TRACE(c.name());
        const Simulation sim = simulate(c.kind, c.pp, c.m, c.v);
        for (int s = 0; s < c.pp; ++s) {
            const int peak = sim.stages[s].peak_in_flight;
            if (c.kind == "1f1b") {
                EXPECT_LE(peak, c.pp - s);
                EXPECT_LE(peak, c.pp);
                EXPECT_EQ(peak, std::min(c.pp - s, c.m));
            } else if (c.kind == "gpipe") {
                EXPECT_EQ(peak, c.m);
            } else {
                EXPECT_EQ(peak, std::min(warmup_of(c, s) + 1, c.m * c.v));
            }
        }
    }
}

// The phases read like the paper: warm-up forwards, then strict alternation, then backwards.
TEST(PipelineSchedule, PhasesOfOneFOneB) {
    for (const Case& c : all_cases()) {
        if (c.kind == "gpipe") continue;
        SCOPED_TRACE(c.name());
        for (int s = 0; s < c.pp; ++s) {
            std::string ops;
            for (const Action& a : make_schedule(c.kind, c.pp, s, c.m, c.v))
                if (a.op == Op::forward || a.op == Op::backward) ops += a.op == Op::forward ? 'F' : 'B';
            const int w = warmup_of(c, s), total = c.m * c.v, steady = total - w;
            std::string expect(w, 'F');
            for (int i = 0; i < steady; ++i) expect += "FB";
            expect += std::string(w, 'B');
            EXPECT_EQ(ops, expect) << "stage " << s;
        }
    }
    EXPECT_EQ(format_actions(make_1f1b(4, 1, 8), 1),
              "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
    EXPECT_EQ(format_actions(make_1f1b(4, 3, 3), 1), "F0 B0 F1 B1 F2 B2");
    EXPECT_EQ(format_actions(make_gpipe(2, 0, 3), 1), "F0 F1 F2 B2 B1 B0");
    EXPECT_EQ(format_actions(make_1f1b(2, 0, 2), 1, true), "F0 sF0 F1 sF1 rB0 B0 rB1 B1");
    EXPECT_EQ(format_actions(make_1f1b(2, 1, 2), 1, true), "rF0 F0 B0 sB0 rF1 F1 B1 sB1");
    // Interleaved, pp = 2, v = 2, m = 4: groups of pp microbatches through chunk a, then b.
    EXPECT_EQ(format_actions(make_interleaved(2, 1, 4, 2), 2),
              "F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a");
}

TEST(PipelineSchedule, VirtualStagesAndPeers) {
    EXPECT_EQ(virtual_stage(4, 3, 0), 3);
    EXPECT_EQ(virtual_stage(4, 0, 1), 4);
    EXPECT_EQ(virtual_stage(4, 2, 1), 6);
    auto peer = [](int pp, int v, int stage, Op op, int chunk) {
        SchedulePeer p = schedule_peer(pp, v, stage, {op, 0, chunk});
        return std::make_pair(p.stage, p.chunk);
    };
    // The fwd wrap: stage pp-1 chunk c feeds stage 0 chunk c+1; bwd goes back.
    EXPECT_EQ(peer(4, 2, 3, Op::send_fwd, 0), std::make_pair(0, 1));
    EXPECT_EQ(peer(4, 2, 0, Op::recv_fwd, 1), std::make_pair(3, 0));
    EXPECT_EQ(peer(4, 2, 0, Op::send_bwd, 1), std::make_pair(3, 0));
    EXPECT_EQ(peer(4, 2, 3, Op::recv_bwd, 0), std::make_pair(0, 1));
    EXPECT_EQ(peer(4, 2, 1, Op::send_fwd, 1), std::make_pair(2, 1));
    EXPECT_EQ(peer(4, 2, 1, Op::send_bwd, 1), std::make_pair(0, 1));
    EXPECT_EQ(peer(4, 1, 2, Op::recv_fwd, 0), std::make_pair(1, 0));
    EXPECT_THROW(schedule_peer(4, 2, 0, {Op::recv_fwd, 0, 0}), std::invalid_argument);
    EXPECT_THROW(schedule_peer(4, 2, 3, {Op::send_fwd, 0, 1}), std::invalid_argument);
    EXPECT_THROW(schedule_peer(4, 2, 0, {Op::send_bwd, 0, 0}), std::invalid_argument);
    EXPECT_THROW(schedule_peer(4, 2, 3, {Op::recv_bwd, 0, 1}), std::invalid_argument);
    EXPECT_THROW(schedule_peer(4, 2, 1, {Op::forward, 0, 0}), std::invalid_argument);
}

// The simulator is a real check: broken lists are caught.
TEST(PipelineSchedule, SimulatorDetectsDeadlockAndMismatch) {
    auto logic_error_of = [](const std::vector<std::vector<Action>>& lists, int v) -> std::string {
        try {
            simulate_actions(lists, v);
        } catch (const std::logic_error& e) {
            return e.what();
        }
        return "";
    };
    // Stage 0 waits for the gradient before sending the activation: a cycle.
    std::vector<std::vector<Action>> dead = {
        {{Op::forward, 0, 0}, {Op::recv_bwd, 0, 0}, {Op::send_fwd, 0, 0}, {Op::backward, 0, 0}},
        make_1f1b(2, 1, 1)};
    std::string e = logic_error_of(dead, 1);
    EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
    EXPECT_NE(e.find("stage 0 action #1 recv_bwd mb 0"), std::string::npos) << e;
    EXPECT_NE(e.find("stage 1 action #0 recv_fwd mb 0"), std::string::npos) << e;
    // GPipe stage 0 expecting the gradients in mb order while stage 1 sends them last-first.
    auto wrong_order = make_gpipe(2, 0, 2);
    std::swap(wrong_order[4], wrong_order[6]);  // rB1 B1 rB0 B0 -> rB0 B0 rB1 B1
    std::swap(wrong_order[5], wrong_order[7]);
    e = logic_error_of({wrong_order, make_gpipe(2, 1, 2)}, 1);
    EXPECT_NE(e.find("mismatch"), std::string::npos) << e;
    // A send nobody receives, a forward without its input.
    auto no_recv = make_1f1b(2, 1, 1);
    no_recv.erase(no_recv.begin());
    e = logic_error_of({make_1f1b(2, 0, 1), no_recv}, 1);
    EXPECT_NE(e.find("without its recv_fwd"), std::string::npos) << e;
    // The real schedules pass.
    EXPECT_EQ(logic_error_of({make_1f1b(2, 0, 3), make_1f1b(2, 1, 3)}, 1), "");
}

TEST(PipelineSchedule, CheckNamesTheKey) {
    struct Bad { std::string kind; int pp, m, v, L; std::string key; };
    const std::vector<Bad> bad = {
        {"zigzag", 2, 4, 1, 8, "parallel.schedule"},
        {"1f1b", 0, 4, 1, 8, "parallel.pp"},
        {"1f1b", 2, 0, 1, 8, "parallel.microbatches"},
        {"1f1b", 2, 4, 2, 8, "parallel.virtual_stages"},
        {"gpipe", 2, 4, 0, 8, "parallel.virtual_stages"},
        {"1f1b", 4, 4, 1, 3, "model.n_layers"},
        {"interleaved", 4, 6, 2, 16, "parallel.microbatches"},
        {"interleaved", 4, 2, 2, 16, "parallel.microbatches"},  // m < pp
        {"interleaved", 4, 8, 1, 16, "parallel.virtual_stages"},
        {"interleaved", 1, 4, 2, 16, "parallel.pp"},
        {"interleaved", 4, 8, 2, 12, "model.n_layers"},  // 12 % 8 != 0
    };
    for (const Bad& b : bad) {
        std::string msg = schedule_check(b.kind, b.pp, b.m, b.v, b.L);
        EXPECT_NE(msg.find("'" + b.key + "'"), std::string::npos) << b.key << ": " << msg;
        EXPECT_EQ(error_of([&] { make_schedule(b.kind, b.pp, 0, b.m, b.v); }).empty(),
                  b.key == "model.n_layers")
            << msg;  // make_schedule does not know the layer count
    }
    EXPECT_EQ(schedule_check("interleaved", 4, 8, 2, 16), "");
    EXPECT_EQ(schedule_check("1f1b", 4, 3, 1, 4), "");
    EXPECT_EQ(schedule_check("gpipe", 3, 5, 1, 0), "");  // n_layers 0: not checked
    EXPECT_NE(schedule_check("interleaved", 4, 6, 2, 16).find("multiple of parallel.pp = 4"),
              std::string::npos);
    EXPECT_THROW(make_1f1b(4, 4, 8), std::invalid_argument);
    EXPECT_THROW(simulate("interleaved", 4, 6, 2), ConfigError);
}

TEST(PipelineSchedule, TimelineChart) {
    const std::string one = render_timeline(simulate("1f1b", 4, 8, 1), 4);
    for (const char* row : {"stage 0", "stage 1", "stage 2", "stage 3"})
        EXPECT_NE(one.find(row), std::string::npos) << one;
    // Stage 3 of 1F1B starts after 3 idle slots and then alternates F/B without a gap.
    EXPECT_NE(one.find("stage 3  .  .  .  F0 B0--- F1 B1--- F2"), std::string::npos) << one;
    EXPECT_NE(one.find("stage 0  F0 F1 F2 F3 ."), std::string::npos) << one;
    const std::string two = render_timeline(simulate("interleaved", 4, 8, 2), 4, 100);
    EXPECT_NE(two.find("F0a F1a F2a F3a F0b"), std::string::npos) << two;
    EXPECT_NE(two.find("one column = 0.5"), std::string::npos) << two;
    for (const std::string& line : [&] {
             std::vector<std::string> v;
             size_t a = 0, b;
             while ((b = two.find('\n', a)) != std::string::npos) v.push_back(two.substr(a, b - a)), a = b + 1;
             return v;
         }())
        if (line.rfind("stage", 0) == 0) {
            EXPECT_LE(line.size(), 100u) << line;
        }
}

// ---- the zero-bubble schedules: the backward split into B (input) and W (weights) -----------

namespace {

std::vector<Case> zero_bubble_cases() {
    std::vector<Case> out;
    for (int pp = 1; pp <= 8; ++pp)
        for (int m = 1; m <= 16; ++m) {
            out.push_back({"zb_h1", pp, m, 1});
            if (pp >= 2) out.push_back({"zbv", pp, m, 2});
        }
    return out;
}

// The microbatches from which the formula of bubble_theory is exact (fewer leave more idle).
int theory_from(const Case& c) { return c.kind == "zbv" ? 2 * c.pp - 1 : c.pp; }

}  // namespace

// Each (mb, chunk) once as F, B (backward_input) and W (backward_weight), in that order; no
// whole backward; B carries the backward's transfers exactly where a backward would.
TEST(ZeroBubbleSchedule, EveryMicrobatchOnceAsFBW) {
    for (const Case& c : zero_bubble_cases()) {
        SCOPED_TRACE(c.name());
        const Placement pl = schedule_placement(c.kind);
        EXPECT_TRUE(schedule_splits_backward(c.kind));
        const int last_vs = c.pp * c.v - 1;
        for (int s = 0; s < c.pp; ++s) {
            SCOPED_TRACE("stage " + std::to_string(s));
            const auto acts = make_schedule(c.kind, c.pp, s, c.m, c.v);
            std::map<std::pair<int, int>, int> f_at, b_at, w_at;
            for (size_t i = 0; i < acts.size(); ++i) {
                const Action& a = acts[i];
                ASSERT_GE(a.microbatch, 0);
                ASSERT_LT(a.microbatch, c.m);
                ASSERT_LT(a.chunk, c.v);
                const int vs = virtual_stage(c.pp, s, a.chunk, pl);
                auto prev = [&](Op op) { return i > 0 && acts[i - 1] == Action{op, a.microbatch, a.chunk}; };
                auto next = [&](Op op) {
                    return i + 1 < acts.size() && acts[i + 1] == Action{op, a.microbatch, a.chunk};
                };
                const std::pair<int, int> key{a.microbatch, a.chunk};
                switch (a.op) {
                    case Op::forward:
                        ASSERT_EQ(f_at.count(key), 0u);
                        f_at[key] = int(i);
                        EXPECT_EQ(prev(Op::recv_fwd), vs != 0);
                        EXPECT_EQ(next(Op::send_fwd), vs != last_vs);
                        break;
                    case Op::backward_input:
                        ASSERT_EQ(b_at.count(key), 0u);
                        ASSERT_EQ(f_at.count(key), 1u) << "B before F";
                        b_at[key] = int(i);
                        EXPECT_EQ(prev(Op::recv_bwd), vs != last_vs);
                        EXPECT_EQ(next(Op::send_bwd), vs != 0);
                        break;
                    case Op::backward_weight:
                        ASSERT_EQ(w_at.count(key), 0u);
                        ASSERT_EQ(b_at.count(key), 1u) << "W before B";
                        w_at[key] = int(i);
                        break;
                    case Op::backward: ADD_FAILURE() << "a whole backward in a split schedule"; break;
                    case Op::recv_fwd: EXPECT_TRUE(next(Op::forward)); break;
                    case Op::send_fwd: EXPECT_TRUE(prev(Op::forward)); break;
                    case Op::recv_bwd: EXPECT_TRUE(next(Op::backward_input)); break;
                    case Op::send_bwd: EXPECT_TRUE(prev(Op::backward_input)); break;
                }
            }
            EXPECT_EQ(f_at.size(), size_t(c.m) * c.v);
            EXPECT_EQ(b_at.size(), size_t(c.m) * c.v);
            EXPECT_EQ(w_at.size(), size_t(c.m) * c.v);
        }
    }
}

// Links match in order; under the V the message from virtual stage pp-1 to pp stays on stage
// pp-1 (a transfer to itself, which the executor stages locally).
TEST(ZeroBubbleSchedule, LinksMatchInOrderAndTheVTurnsOnTheLastStage) {
    for (const Case& c : zero_bubble_cases()) {
        SCOPED_TRACE(c.name());
        const Placement pl = schedule_placement(c.kind);
        using Link = std::tuple<int, int, bool>;
        std::map<Link, std::vector<std::pair<int, int>>> sent, received;
        const auto lists = all_stages(c);
        for (int s = 0; s < c.pp; ++s) {
            for (const Action& a : lists[s]) {
                if (is_compute(a.op)) continue;
                const SchedulePeer peer = schedule_peer(c.pp, c.v, s, a, pl);
                const bool bwd = a.op == Op::send_bwd || a.op == Op::recv_bwd;
                if (a.op == Op::send_fwd || a.op == Op::send_bwd) {
                    EXPECT_EQ(virtual_stage(c.pp, peer.stage, peer.chunk, pl),
                              virtual_stage(c.pp, s, a.chunk, pl) + (bwd ? -1 : 1));
                    sent[{s, peer.stage, bwd}].push_back({a.microbatch, peer.chunk});
                } else {
                    received[{peer.stage, s, bwd}].push_back({a.microbatch, a.chunk});
                }
            }
            const int self = self_messages_in_flight(lists[s], c.pp, c.v, s, pl);
            EXPECT_EQ(self > 0, c.kind == "zbv" && s == c.pp - 1) << "stage " << s;
            EXPECT_LE(self, c.m);
        }
        EXPECT_EQ(sent, received);
        size_t messages = 0;
        for (auto& [link, seq] : sent) messages += seq.size();
        EXPECT_EQ(messages, 2u * c.m * (c.pp * c.v - 1));
    }
}

// All stages together: no deadlock, every dependency met in simulated time (F after the previous
// virtual stage's F, B after the next one's B, W after its own B), busy = m (F + B + W).
TEST(ZeroBubbleSchedule, SimulationRespectsDependencies) {
    for (const Case& c : zero_bubble_cases()) {
        SCOPED_TRACE(c.name());
        const Placement pl = schedule_placement(c.kind);
        Simulation sim;
        ASSERT_NO_THROW(sim = simulate(c.kind, c.pp, c.m, c.v, 1.0, 2.0));
        const int nvs = c.pp * c.v;
        std::vector<std::vector<std::pair<double, double>>> f(nvs, std::vector<std::pair<double, double>>(c.m, {-1, -1})),
            b = f, w = f;
        for (int s = 0; s < c.pp; ++s) {
            const auto& T = sim.stages[s];
            EXPECT_NEAR(T.busy, c.m * 3.0, 1e-9);
            double clock = 0;
            for (const auto& [t0, t1, op, mb, chunk] : T.slots) {
                EXPECT_GE(t0, clock - 1e-12);
                clock = t1;
                auto& slot = (op == Op::forward ? f : op == Op::backward_input ? b : w)[virtual_stage(c.pp, s, chunk, pl)][mb];
                slot = {t0, t1};
            }
        }
        for (int vs = 0; vs < nvs; ++vs)
            for (int i = 0; i < c.m; ++i) {
                ASSERT_GE(f[vs][i].first, 0);
                ASSERT_GE(b[vs][i].first, f[vs][i].second - 1e-12);
                ASSERT_GE(w[vs][i].first, b[vs][i].second - 1e-12);
                if (vs > 0) EXPECT_GE(f[vs][i].first, f[vs - 1][i].second - 1e-12);
                if (vs + 1 < nvs) EXPECT_GE(b[vs][i].first, b[vs + 1][i].second - 1e-12);
            }
    }
}

// The bubble: exactly the formula with F = B = W once there are enough microbatches (zb_h1:
// (p-1)/(3m+p-1), a third of 1F1B's when m >> p; zbv: (p-1)/(6m+p-1)), never above 1F1B's, and
// zbv's never above zb_h1's.
TEST(ZeroBubbleSchedule, BubbleEqualsTheoryAndBeatsOneFOneB) {
    for (const Case& c : zero_bubble_cases()) {
        SCOPED_TRACE(c.name());
        const Simulation sim = simulate(c.kind, c.pp, c.m, c.v, 1.0, 2.0);
        const double theory = bubble_theory(c.kind, c.pp, c.m, c.v), one = bubble_theory("1f1b", c.pp, c.m, 1);
        double mean = 0;
        for (int s = 0; s < c.pp; ++s) {
            if (c.m >= theory_from(c)) EXPECT_NEAR(sim.stages[s].idle_fraction, theory, 1e-9) << "stage " << s;
            mean += sim.stages[s].idle_fraction / c.pp;
        }
        EXPECT_LE(mean, one + 1e-9);
        if (c.kind == "zbv" && c.m >= theory_from(c)) EXPECT_LE(theory, bubble_theory("zb_h1", c.pp, c.m, 1));
        // Any costs: never worse than 1F1B with the same split of the backward.
        for (double tw : {0.5, 1.5}) {
            const Simulation any = simulate(c.kind, c.pp, c.m, c.v, 1.0, 2.0, tw);
            const Simulation ref = simulate("1f1b", c.pp, c.m, 1, 1.0, 2.0);
            EXPECT_LE(any.makespan, ref.makespan + 1e-9) << "tw " << tw;
        }
    }
    EXPECT_DOUBLE_EQ(bubble_theory("zb_h1", 4, 8, 1), 3.0 / 27.0);
    EXPECT_DOUBLE_EQ(bubble_theory("zbv", 4, 8, 2), 3.0 / 51.0);
}

// Activation memory at 1F1B's: a microbatch is held from its F to its W. zb_h1 holds at most
// min(pp, m) on any stage (1F1B's stage 0); zbv at most 2 min(pp, m) chunk-microbatches of half
// a stage each, and on stage 0 exactly 1F1B's stage-0 figure once m >= 2pp-1.
TEST(ZeroBubbleSchedule, PeakInFlightIsOneFOneBs) {
    for (const Case& c : zero_bubble_cases()) {
        SCOPED_TRACE(c.name());
        const Simulation sim = simulate(c.kind, c.pp, c.m, c.v);
        for (int s = 0; s < c.pp; ++s) {
            const int peak = sim.stages[s].peak_in_flight;
            if (c.kind == "zb_h1") EXPECT_LE(peak, std::min(c.pp, c.m)) << "stage " << s;
            else EXPECT_LE(peak, 2 * std::min(c.pp, c.m)) << "stage " << s;
        }
        if (c.kind == "zb_h1") EXPECT_EQ(sim.stages[0].peak_in_flight, std::min(c.pp, c.m));
        if (c.kind == "zbv" && c.m >= theory_from(c)) EXPECT_EQ(sim.stages[0].peak_in_flight, 2 * c.pp);
    }
}

TEST(ZeroBubbleSchedule, ListsReadLikeThePaper) {
    // ZB-H1, pp = 2: stage 0 is 1F1B with each W after its B; stage 1 holds back its first W.
    EXPECT_EQ(format_actions(make_zb_h1(2, 0, 4), 1), "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3");
    EXPECT_EQ(format_actions(make_zb_h1(2, 1, 4), 1), "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3");
    EXPECT_EQ(format_actions(make_zb_h1(2, 1, 2), 1, true), "rF0 F0 B0 sB0 rF1 F1 B1 sB1 W0 W1");
    // ZB-V, pp = 2: stage 0 holds virtual stages 0 and 3, stage 1 stages 1 and 2 and turns the V.
    EXPECT_EQ(format_actions(make_zbv(2, 0, 3), 2),
              "F0a F1a F2a F0b B0b W0b F1b B1b W1b B0a W0a F2b B2b W2b B1a W1a B2a W2a");
    EXPECT_EQ(format_actions(make_zbv(2, 1, 2), 2, true),
              "rF0a F0a sF0a rF0b F0b sF0b rF1a F1a sF1a rF1b F1b sF1b rB0b B0b sB0b W0b rB0a B0a sB0a W0a "
              "rB1b B1b sB1b W1b rB1a B1a sB1a W1a");
    EXPECT_EQ(virtual_stage(4, 0, 1, Placement::vee), 7);
    EXPECT_EQ(virtual_stage(4, 3, 1, Placement::vee), 4);
    const SchedulePeer turn = schedule_peer(4, 2, 3, {Op::send_fwd, 0, 0}, Placement::vee);
    EXPECT_EQ(turn.stage, 3);
    EXPECT_EQ(turn.chunk, 1);
    const SchedulePeer up = schedule_peer(4, 2, 1, {Op::send_fwd, 0, 1}, Placement::vee);
    EXPECT_EQ(up.stage, 0);
    EXPECT_EQ(up.chunk, 1);
    EXPECT_THROW(schedule_peer(4, 2, 0, {Op::send_fwd, 0, 1}, Placement::vee), std::invalid_argument);
}

TEST(ZeroBubbleSchedule, CheckNamesTheKey) {
    EXPECT_NE(schedule_check("zbv", 4, 8, 1, 0).find("'parallel.virtual_stages' = '1'"), std::string::npos);
    EXPECT_NE(schedule_check("zbv", 4, 8, 3, 0).find("must be 2 with parallel.schedule = zbv"), std::string::npos);
    EXPECT_NE(schedule_check("zbv", 1, 8, 2, 0).find("'parallel.pp'"), std::string::npos);
    EXPECT_NE(schedule_check("zbv", 2, 8, 2, 6).find("'model.n_layers' = '6'"), std::string::npos);
    EXPECT_NE(schedule_check("zb_h1", 2, 8, 2, 0).find("'parallel.virtual_stages'"), std::string::npos);
    EXPECT_EQ(schedule_check("zbv", 2, 3, 2, 8), "");
    EXPECT_EQ(schedule_check("zb_h1", 4, 3, 1, 4), "");
    EXPECT_NE(schedule_check("zigzag", 2, 4, 1, 0).find("zb_h1, zbv"), std::string::npos);
    // The simulator catches a W before its B.
    auto broken = make_zb_h1(1, 0, 2);
    std::swap(broken[1], broken[2]);  // F0 W0 B0 ...
    EXPECT_THROW(simulate_actions({broken}, 1), std::logic_error);
}

TEST(ZeroBubbleSchedule, TimelineChart) {
    const std::string zb = render_timeline(simulate("zb_h1", 4, 8, 1), 4);
    EXPECT_NE(zb.find("B<mb> input backward, W<mb> weight backward"), std::string::npos) << zb;
    // The last stage: B right after each F, its three held-back W's at the end.
    EXPECT_NE(zb.find("stage 3  .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4"), std::string::npos) << zb;
    EXPECT_NE(zb.find("W4 W5 W6 W7"), std::string::npos) << zb;
    const std::string v = render_timeline(simulate("zbv", 4, 8, 2), 4);
    EXPECT_NE(v.find("stage 0  F0a F1a F2a F3a F4a F5a F6a F0b B0b W0b"), std::string::npos) << v;
}
