// Pipeline schedules as action lists, their simulator and chart (parallel/pipeline_schedule.hpp).
// Deliberately MPI-free: tests/CMakeLists.txt compiles this file without MPI's include path.
#include "quintet/parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "quintet/core/error.hpp"

namespace quintet {

const char* op_name(Op op) {
    switch (op) {
        case Op::recv_fwd: return "recv_fwd";
        case Op::forward: return "forward";
        case Op::send_fwd: return "send_fwd";
        case Op::recv_bwd: return "recv_bwd";
        case Op::backward: return "backward";
        case Op::send_bwd: return "send_bwd";
        case Op::backward_input: return "backward_input";
        case Op::backward_weight: return "backward_weight";
    }
    return "?";
}

bool is_compute(Op op) {
    return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight;
}

Placement schedule_placement(const std::string& kind) { return kind == "zbv" ? Placement::vee : Placement::loop; }

bool schedule_splits_backward(const std::string& kind) { return kind == "zb_h1" || kind == "zbv"; }

int virtual_stage(int pp, int stage, int chunk, Placement placement) {
    if (placement == Placement::vee) return chunk == 0 ? stage : 2 * pp - 1 - stage;
    return chunk * pp + stage;
}

namespace {
// The (stage, chunk) that holds virtual stage vs.
SchedulePeer holder(int pp, int vs, Placement placement) {
    if (placement == Placement::vee) return vs < pp ? SchedulePeer{vs, 0} : SchedulePeer{2 * pp - 1 - vs, 1};
    return {vs % pp, vs / pp};
}
}  // namespace

SchedulePeer schedule_peer(int pp, int v, int stage, const Action& a, Placement placement) {
    const int vs = virtual_stage(pp, stage, a.chunk, placement), last = pp * v - 1;
    const bool towards_next = a.op == Op::send_fwd || a.op == Op::recv_bwd;   // talks to vs+1
    const bool towards_prev = a.op == Op::recv_fwd || a.op == Op::send_bwd;   // talks to vs-1
    auto fail = [&](const char* why) {
        throw std::invalid_argument(std::string("schedule_peer: ") + op_name(a.op) + " mb " +
                                    std::to_string(a.microbatch) + " chunk " +
                                    std::to_string(a.chunk) + " on stage " +
                                    std::to_string(stage) + ": " + why);
    };
    if (!towards_next && !towards_prev) fail("not a transfer");
    if (towards_next && vs == last) fail("the last virtual stage has no next stage");
    if (towards_prev && vs == 0) fail("virtual stage 0 has no previous stage");
    return holder(pp, towards_next ? vs + 1 : vs - 1, placement);
}

namespace {

// Appends forward/backward actions with their transfers, following the header's conventions.
struct ActionList {
    int pp, stage, v;
    std::vector<Action> out;
    Placement placement = Placement::loop;

    bool first(int chunk) const { return virtual_stage(pp, stage, chunk, placement) == 0; }
    bool last(int chunk) const { return virtual_stage(pp, stage, chunk, placement) == pp * v - 1; }

    void forward(int mb, int chunk) {
        if (!first(chunk)) out.push_back({Op::recv_fwd, mb, chunk});
        out.push_back({Op::forward, mb, chunk});
        if (!last(chunk)) out.push_back({Op::send_fwd, mb, chunk});
    }
    void backward(int mb, int chunk) {
        if (!last(chunk)) out.push_back({Op::recv_bwd, mb, chunk});
        out.push_back({Op::backward, mb, chunk});
        if (!first(chunk)) out.push_back({Op::send_bwd, mb, chunk});
    }
    // The split backward: B with the backward's transfers, W on its own.
    void input(int mb, int chunk) {
        if (!last(chunk)) out.push_back({Op::recv_bwd, mb, chunk});
        out.push_back({Op::backward_input, mb, chunk});
        if (!first(chunk)) out.push_back({Op::send_bwd, mb, chunk});
    }
    void weight(int mb, int chunk) { out.push_back({Op::backward_weight, mb, chunk}); }
};

void check_or_throw(const std::string& kind, int pp, int stage, int m, int v) {
    std::string err = schedule_check(kind, pp, m, v, 0);
    if (!err.empty()) throw ConfigError(err);
    if (stage < 0 || stage >= pp)
        throw std::invalid_argument("pipeline schedule: stage " + std::to_string(stage) +
                                    " outside [0, " + std::to_string(pp) + ")");
}

std::string key_error(const std::string& key, const std::string& value, const std::string& valid) {
    return "deck key '" + key + "' = '" + value + "': " + valid;  // config_fail's form
}

}  // namespace

std::vector<Action> make_gpipe(int pp, int stage, int m) {
    check_or_throw("gpipe", pp, stage, m, 1);
    ActionList a{pp, stage, 1, {}};
    for (int i = 0; i < m; ++i) a.forward(i, 0);       // fill: every forward
    for (int i = m - 1; i >= 0; --i) a.backward(i, 0); // drain: every backward, last mb first
    return a.out;
}

std::vector<Action> make_1f1b(int pp, int stage, int m) {
    check_or_throw("1f1b", pp, stage, m, 1);
    ActionList a{pp, stage, 1, {}};
    const int num_warmup = std::min(pp - stage - 1, m);
    const int num_steady = m - num_warmup;
    // Warm-up: forwards only, until the first gradient can come back.
    for (int i = 0; i < num_warmup; ++i) a.forward(i, 0);
    // Steady state: one forward, one backward (send_forward_recv_backward, send_backward_recv_forward).
    for (int i = 0; i < num_steady; ++i) {
        a.forward(num_warmup + i, 0);
        a.backward(i, 0);
    }
    // Cool-down: the backwards of the warm-up microbatches.
    for (int i = num_steady; i < m; ++i) a.backward(i, 0);
    return a.out;
}

std::vector<Action> make_interleaved(int pp, int stage, int m, int v) {
    check_or_throw("interleaved", pp, stage, m, v);
    ActionList a{pp, stage, v, {}};
    const int total = m * v;  // chunk-microbatches on this rank
    const int group = pp * v; // microbatches advance in groups of pp through all v chunks
    auto chunk_of = [&](int k, bool forward) {
        int c = (k % group) / pp;
        return forward ? c : v - 1 - c;
    };
    auto microbatch_of = [&](int k) { return (k / group) * pp + k % pp; };
    const int num_warmup = std::min((pp - stage - 1) * 2 + (v - 1) * pp, total);
    const int num_steady = total - num_warmup;
    // Warm-up: forwards through the chunks, group by group.
    for (int k = 0; k < num_warmup; ++k) a.forward(microbatch_of(k), chunk_of(k, true));
    // Steady state: the (k + warm-up)-th forward, then the k-th backward.
    for (int k = 0; k < num_steady; ++k) {
        const int kf = k + num_warmup;
        a.forward(microbatch_of(kf), chunk_of(kf, true));
        a.backward(microbatch_of(k), chunk_of(k, false));
    }
    // Cool-down: the remaining backwards.
    for (int k = num_steady; k < total; ++k) a.backward(microbatch_of(k), chunk_of(k, false));
    return a.out;
}

std::vector<Action> make_zb_h1(int pp, int stage, int m) {
    check_or_throw("zb_h1", pp, stage, m, 1);
    ActionList a{pp, stage, 1, {}};
    const int num_warmup = std::min(pp - stage - 1, m);
    int next_w = 0;
    // Stage s holds back its first s W's: the k-th B (k = 0, 1, ...) is followed by a W once
    // k >= s, always the oldest one still owed.
    auto after_input = [&](int k) {
        if (k >= stage) a.weight(next_w++, 0);
    };
    for (int i = 0; i < num_warmup; ++i) a.forward(i, 0);
    for (int k = 0; k < m - num_warmup; ++k) {
        a.forward(num_warmup + k, 0);
        a.input(k, 0);
        after_input(k);
    }
    for (int k = m - num_warmup; k < m; ++k) {
        a.input(k, 0);
        after_input(k);
    }
    while (next_w < m) a.weight(next_w++, 0);  // the held-back W's fill the drain
    return a.out;
}

std::vector<Action> make_zbv(int pp, int stage, int m) {
    check_or_throw("zbv", pp, stage, m, 2);
    // Built for n >= 2pp-1 microbatches (what the V needs to reach its steady state); those past
    // m are dropped below.
    const int n = std::max(2 * pp - 1, m);
    ActionList a{pp, stage, 2, {}};
    a.placement = Placement::vee;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    for (int i = 0; i < 2 * (pp - stage) - 1; ++i) a.forward(f0++, 0);
    for (int i = 0; i < stage; ++i) {
        a.forward(f1++, 1);
        a.forward(f0++, 0);
    }
    for (int i = 0; i < pp - stage; ++i) {
        a.forward(f1++, 1);
        a.input(b1, 1);
        a.weight(b1++, 1);
    }
    while (f1 < f0 || f0 < n) {
        if (f0 < n) a.forward(f0++, 0);
        a.input(b0, 0);
        a.weight(b0++, 0);
        a.forward(f1++, 1);
        a.input(b1, 1);
        a.weight(b1++, 1);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < stage; ++i) {
        a.input(b0++, 0);
        a.input(b1++, 1);
    }
    for (int i = 0; i < pp - stage; ++i) {
        a.input(b0++, 0);
        a.weight(w0++, 0);
    }
    while (w1 < b1) a.weight(w1++, 1);
    while (w0 < b0) a.weight(w0++, 0);
    if (!(f0 == n && b0 == n && w0 == n && f1 == n && b1 == n && w1 == n))
        throw std::logic_error("make_zbv: the counts do not close (pp " + std::to_string(pp) + ", stage " +
                               std::to_string(stage) + ")");
    std::vector<Action> kept;
    for (const Action& x : a.out)
        if (x.microbatch < m) kept.push_back(x);
    return kept;
}

std::vector<Action> make_schedule(const std::string& kind, int pp, int stage, int m, int v) {
    check_or_throw(kind, pp, stage, m, v);
    if (kind == "1f1b") return make_1f1b(pp, stage, m);
    if (kind == "gpipe") return make_gpipe(pp, stage, m);
    if (kind == "zb_h1") return make_zb_h1(pp, stage, m);
    if (kind == "zbv") return make_zbv(pp, stage, m);
    return make_interleaved(pp, stage, m, v);
}

std::string schedule_check(const std::string& kind, int pp, int m, int v, int n_layers) {
    const std::string S = std::to_string(pp), M = std::to_string(m), V = std::to_string(v),
                      L = std::to_string(n_layers);
    if (kind != "1f1b" && kind != "gpipe" && kind != "interleaved" && kind != "zb_h1" && kind != "zbv")
        return key_error("parallel.schedule", kind, "must be one of 1f1b, gpipe, interleaved, zb_h1, zbv");
    if (pp < 1) return key_error("parallel.pp", S, "must be >= 1");
    if (m < 1) return key_error("parallel.microbatches", M, "must be >= 1");
    if (v < 1) return key_error("parallel.virtual_stages", V, "must be >= 1");
    if (kind == "zbv") {
        if (v != 2)
            return key_error("parallel.virtual_stages", V,
                             "must be 2 with parallel.schedule = zbv (two chunks per stage in a V)");
        if (pp < 2) return key_error("parallel.pp", S, "must be >= 2 with parallel.schedule = zbv");
        if (n_layers > 0 && n_layers % (2 * pp) != 0)
            return key_error("model.n_layers", L,
                             "must be a multiple of 2 * parallel.pp = " + std::to_string(2 * pp) +
                                 " for parallel.schedule = zbv (two equal chunks per stage)");
        return "";
    }
    if (kind != "interleaved") {
        if (v != 1)
            return key_error("parallel.virtual_stages", V,
                             "must be 1 with parallel.schedule = " + kind +
                                 " (virtual stages need parallel.schedule = interleaved or zbv)");
        if (n_layers > 0 && n_layers < pp)
            return key_error("model.n_layers", L,
                             "must be >= parallel.pp = " + S + " (every stage needs a layer)");
        return "";
    }
    if (v < 2)
        return key_error("parallel.virtual_stages", V,
                         "must be >= 2 with parallel.schedule = interleaved (1 is plain 1f1b)");
    if (pp < 2)
        return key_error("parallel.pp", S, "must be >= 2 with parallel.schedule = interleaved");
    if (m % pp != 0)
        return key_error("parallel.microbatches", M,
                         "must be a multiple of parallel.pp = " + S +
                             " for parallel.schedule = interleaved (microbatches go through the "
                             "chunks in groups of pp)");
    if (n_layers > 0 && n_layers % (pp * v) != 0)
        return key_error("model.n_layers", L,
                         "must be a multiple of parallel.pp * parallel.virtual_stages = " + S +
                             " * " + V + " = " + std::to_string(pp * v) +
                             " for parallel.schedule = interleaved");
    return "";
}

// ---- simulation ------------------------------------------------------------------------------

namespace {

std::string label(Op op, int mb, int chunk, int v) {
    std::string s;
    switch (op) {
        case Op::recv_fwd: s = "rF"; break;
        case Op::forward: s = "F"; break;
        case Op::send_fwd: s = "sF"; break;
        case Op::recv_bwd: s = "rB"; break;
        case Op::backward: s = "B"; break;
        case Op::send_bwd: s = "sB"; break;
        case Op::backward_input: s = "B"; break;
        case Op::backward_weight: s = "W"; break;
    }
    s += std::to_string(mb);
    if (v > 1) s += char('a' + chunk % 26);
    return s;
}

std::string describe(int stage, size_t index, const Action& a) {
    return "stage " + std::to_string(stage) + " action #" + std::to_string(index) + " " +
           op_name(a.op) + " mb " + std::to_string(a.microbatch) + " chunk " +
           std::to_string(a.chunk);
}

}  // namespace

Simulation simulate_actions(const std::vector<std::vector<Action>>& lists, int v, double tf,
                            double tb, double tw, Placement placement) {
    const int pp = static_cast<int>(lists.size());
    if (pp < 1 || v < 1) throw std::invalid_argument("simulate: need pp >= 1 and v >= 1");
    if (tw < 0) tw = tb / 2;
    if (!(tw < tb)) throw std::invalid_argument("simulate: the weight part of the backward must be < the backward");
    const double cost_f = tf / v, cost_b = tb / v, cost_bi = (tb - tw) / v, cost_w = tw / v;
    // A directed link: (sender, receiver, is_bwd) -> FIFO of (mb, receiver chunk, send time).
    using Link = std::tuple<int, int, bool>;
    struct Message { int mb, chunk; double time; };
    std::map<Link, std::vector<Message>> queue;  // with a read cursor per link
    std::map<Link, size_t> head;

    struct State {
        size_t pc = 0;                           // next action
        double clock = 0;                        // when the stage is free
        std::set<std::pair<int, int>> got_fwd;   // (mb, chunk) inputs received
        std::set<std::pair<int, int>> got_bwd;   // (mb, chunk) output gradients received
        std::set<std::pair<int, int>> fwd_done, bwd_done, input_done, weight_done;
        int in_flight = 0;
    };
    std::vector<State> st(pp);
    Simulation sim;
    sim.stages.resize(pp);

    auto fail = [](const std::string& what) { throw std::logic_error("pipeline schedule: " + what); };

    // Each action's start is max(stage free, input sent): independent of the order in which the
    // stages are advanced, so a simple sweep until nothing moves gives the event-driven result.
    bool progress = true;
    while (progress) {
        progress = false;
        for (int s = 0; s < pp; ++s) {
            State& S = st[s];
            StageTimeline& T = sim.stages[s];
            while (S.pc < lists[s].size()) {
                const Action& a = lists[s][S.pc];
                if (a.chunk < 0 || a.chunk >= v || a.microbatch < 0)
                    fail(describe(s, S.pc, a) + ": chunk or microbatch out of range");
                const int vs = virtual_stage(pp, s, a.chunk, placement);
                const std::pair<int, int> key{a.microbatch, a.chunk};
                auto compute = [&](double cost) {
                    T.slots.emplace_back(S.clock, S.clock + cost, a.op, a.microbatch, a.chunk);
                    S.clock += cost;
                    T.busy += cost;
                };
                if (a.op == Op::recv_fwd || a.op == Op::recv_bwd) {
                    SchedulePeer from;
                    try {
                        from = schedule_peer(pp, v, s, a, placement);
                    } catch (const std::invalid_argument& e) {
                        fail(describe(s, S.pc, a) + ": " + e.what());
                    }
                    Link link{from.stage, s, a.op == Op::recv_bwd};
                    auto& q = queue[link];
                    size_t& h = head[link];
                    if (h == q.size()) break;  // blocked: nothing sent yet
                    const Message& msg = q[h];
                    if (msg.mb != a.microbatch || msg.chunk != a.chunk)
                        fail("mismatch: " + describe(s, S.pc, a) + " but the next " +
                             (a.op == Op::recv_bwd ? "bwd" : "fwd") + " message from stage " +
                             std::to_string(from.stage) + " is mb " + std::to_string(msg.mb) +
                             " chunk " + std::to_string(msg.chunk));
                    ++h;
                    S.clock = std::max(S.clock, msg.time);
                    (a.op == Op::recv_fwd ? S.got_fwd : S.got_bwd).insert(key);
                } else if (a.op == Op::send_fwd || a.op == Op::send_bwd) {
                    SchedulePeer to;
                    try {
                        to = schedule_peer(pp, v, s, a, placement);
                    } catch (const std::invalid_argument& e) {
                        fail(describe(s, S.pc, a) + ": " + e.what());
                    }
                    const bool bwd = a.op == Op::send_bwd;
                    if (!(bwd ? (S.bwd_done.count(key) || S.input_done.count(key)) : S.fwd_done.count(key)))
                        fail(describe(s, S.pc, a) + ": sends a result not computed yet");
                    queue[Link{s, to.stage, bwd}].push_back({a.microbatch, to.chunk, S.clock});
                } else if (a.op == Op::forward) {
                    if (S.fwd_done.count(key)) fail(describe(s, S.pc, a) + ": second forward");
                    if (vs != 0 && !S.got_fwd.count(key))
                        fail(describe(s, S.pc, a) + ": forward without its recv_fwd");
                    compute(cost_f);
                    S.fwd_done.insert(key);
                    T.peak_in_flight = std::max(T.peak_in_flight, ++S.in_flight);
                } else if (a.op == Op::backward || a.op == Op::backward_input) {
                    const bool whole = a.op == Op::backward;
                    if (!S.fwd_done.count(key)) fail(describe(s, S.pc, a) + ": backward before forward");
                    if (S.bwd_done.count(key) || S.input_done.count(key))
                        fail(describe(s, S.pc, a) + ": second backward");
                    if (vs != pp * v - 1 && !S.got_bwd.count(key))
                        fail(describe(s, S.pc, a) + ": backward without its recv_bwd");
                    compute(whole ? cost_b : cost_bi);
                    if (whole) {
                        S.bwd_done.insert(key);
                        --S.in_flight;
                    } else {
                        S.input_done.insert(key);
                    }
                } else {  // backward_weight
                    if (!S.input_done.count(key))
                        fail(describe(s, S.pc, a) + ": backward_weight before its backward_input");
                    if (S.weight_done.count(key)) fail(describe(s, S.pc, a) + ": second backward_weight");
                    compute(cost_w);
                    S.weight_done.insert(key);
                    --S.in_flight;
                }
                ++S.pc;
                progress = true;
            }
        }
    }

    std::string stuck;
    for (int s = 0; s < pp; ++s)
        if (st[s].pc < lists[s].size())
            stuck += "\n  " + describe(s, st[s].pc, lists[s][st[s].pc]) + " waits forever";
    if (!stuck.empty()) fail("deadlock:" + stuck);
    for (const auto& [link, q] : queue)
        if (head[link] != q.size())
            fail("stage " + std::to_string(std::get<0>(link)) + " sent " +
                 (std::get<2>(link) ? "bwd" : "fwd") + " mb " + std::to_string(q[head[link]].mb) +
                 " to stage " + std::to_string(std::get<1>(link)) + ", which never receives it");
    for (int s = 0; s < pp; ++s) {
        if (st[s].fwd_done.size() != st[s].bwd_done.size() + st[s].weight_done.size())
            fail("stage " + std::to_string(s) + " ends with " +
                 std::to_string(st[s].in_flight) + " microbatch(es) never run backward");
        if (st[s].input_done.size() != st[s].weight_done.size())
            fail("stage " + std::to_string(s) + " ends with a backward_input whose backward_weight never runs");
    }

    for (int s = 0; s < pp; ++s) sim.makespan = std::max(sim.makespan, st[s].clock);
    for (auto& T : sim.stages)
        T.idle_fraction = sim.makespan > 0 ? 1.0 - T.busy / sim.makespan : 0.0;
    return sim;
}

Simulation simulate(const std::string& kind, int pp, int m, int v, double tf, double tb, double tw) {
    std::string err = schedule_check(kind, pp, m, v, 0);
    if (!err.empty()) throw ConfigError(err);
    if (!(tf > 0) || !(tb > 0))
        throw std::invalid_argument("simulate: forward and backward costs must be > 0");
    std::vector<std::vector<Action>> lists;
    for (int s = 0; s < pp; ++s) lists.push_back(make_schedule(kind, pp, s, m, v));
    return simulate_actions(lists, v, tf, tb, tw, schedule_placement(kind));
}

int self_messages_in_flight(const std::vector<Action>& actions, int pp, int v, int stage, Placement placement) {
    int now = 0, peak = 0;
    for (const Action& a : actions) {
        const bool transfer = a.op == Op::recv_fwd || a.op == Op::recv_bwd || a.op == Op::send_fwd ||
                              a.op == Op::send_bwd;
        if (!transfer || schedule_peer(pp, v, stage, a, placement).stage != stage) continue;
        if (a.op == Op::send_fwd || a.op == Op::send_bwd) peak = std::max(peak, ++now);
        else --now;
    }
    return peak;
}

double bubble_theory(const std::string& kind, int pp, int m, int v) {
    const double p = pp;
    if (kind == "interleaved") return (p - 1) / (double(v) * m + p - 1);
    if (kind == "zb_h1") return (p - 1) / (3.0 * m + p - 1);
    if (kind == "zbv") return (p - 1) / (6.0 * m + p - 1);
    return (p - 1) / (m + p - 1);
}

// ---- text ------------------------------------------------------------------------------------

std::string format_actions(const std::vector<Action>& actions, int v, bool with_transfers) {
    std::string out;
    for (const Action& a : actions) {
        if (!with_transfers && !is_compute(a.op)) continue;
        if (!out.empty()) out += ' ';
        out += label(a.op, a.microbatch, a.chunk, v);
    }
    return out;
}

std::string render_timeline(const Simulation& s, int pp, int width) {
    // Chunk letters when any slot runs a chunk > 0; the quantum divides every slot duration.
    int v = 1;
    bool split = false;
    double shortest = 0;
    std::vector<double> durations;
    size_t label_width = 1;
    for (const auto& T : s.stages)
        for (const auto& [t0, t1, op, mb, chunk] : T.slots) {
            v = std::max(v, chunk + 1);
            split = split || op == Op::backward_weight;
            durations.push_back(t1 - t0);
            shortest = shortest == 0 ? t1 - t0 : std::min(shortest, t1 - t0);
        }
    if (durations.empty() || shortest <= 0) return "(empty schedule)\n";
    double q = shortest;
    for (int k = 1; k <= 64; ++k) {
        q = shortest / k;
        bool ok = true;
        for (double d : durations) {
            double r = d / q;
            if (std::fabs(r - std::round(r)) > 1e-6 * std::max(1.0, r)) { ok = false; break; }
        }
        if (ok) break;
    }
    for (const auto& T : s.stages)
        for (const auto& [t0, t1, op, mb, chunk] : T.slots)
            label_width = std::max(label_width, label(op, mb, chunk, v).size());
    const size_t W = label_width + 1;  // characters per column
    const int ncols = static_cast<int>(std::lround(s.makespan / q));
    const int rows = std::min<int>(pp, static_cast<int>(s.stages.size()));

    // Cells: per stage, per column, the text of that column (exactly W characters).
    std::vector<std::vector<std::string>> cells(rows, std::vector<std::string>(ncols));
    for (int r = 0; r < rows; ++r) {
        std::string idle(W, ' ');
        idle[0] = '.';
        for (int c = 0; c < ncols; ++c) cells[r][c] = idle;
        for (const auto& [t0, t1, op, mb, chunk] : s.stages[r].slots) {
            const int c0 = static_cast<int>(std::lround(t0 / q));
            const int c1 = std::max(c0 + 1, static_cast<int>(std::lround(t1 / q)));
            std::string text = label(op, mb, chunk, v);
            const size_t len = (c1 - c0) * W;
            text += std::string(len - 1 - text.size(), c1 - c0 > 1 ? '-' : ' ');
            text += ' ';
            for (int c = c0; c < c1 && c < ncols; ++c) cells[r][c] = text.substr((c - c0) * W, W);
        }
    }

    char qbuf[32];
    std::snprintf(qbuf, sizeof qbuf, "%g", q);
    std::ostringstream out;
    out << "one column = " << qbuf << " time unit(s); F<mb> forward, "
        << (split ? "B<mb> input backward, W<mb> weight backward" : "B<mb> backward")
        << (v > 1 ? " (letter = chunk: a = 0, b = 1, ...)" : "") << ", '-' continues a slot, "
        << "'.' idle\n";
    const std::string prefix_fmt = "stage " + std::to_string(rows - 1);
    const size_t prefix = prefix_fmt.size() + 2;
    int per_block = ncols;
    if (width > 0) per_block = std::max<int>(1, static_cast<int>((width - prefix) / W));
    for (int b0 = 0; b0 < ncols; b0 += per_block) {
        const int b1 = std::min(ncols, b0 + per_block);
        if (b0 > 0) out << '\n';
        // Time axis: a tick where the previous tick's text has ended.
        std::string axis(prefix, ' ');
        axis.replace(0, 4, "time");
        for (int c = b0; c < b1; ++c) {
            const size_t at = prefix + (c - b0) * W;
            if (axis.size() > at) continue;
            axis.resize(at, ' ');
            char t[32];
            std::snprintf(t, sizeof t, "%g", c * q);
            axis += t;
            axis += ' ';
        }
        while (!axis.empty() && axis.back() == ' ') axis.pop_back();
        out << axis << '\n';
        for (int r = 0; r < rows; ++r) {
            std::string line = "stage " + std::to_string(r);
            line.resize(prefix, ' ');
            for (int c = b0; c < b1; ++c) line += cells[r][c];
            while (!line.empty() && line.back() == ' ') line.pop_back();
            out << line << '\n';
        }
    }
    return out.str();
}

}  // namespace quintet
