// The pipeline schedule as data (docs/parallelism.md, "Pipeline parallelism"): pure functions of (pp, stage,
// microbatches, virtual stages) that return each stage's ordered action list, plus a simulator
// that runs all stages' lists together (deadlock, bubble, activation memory) and a text chart.
// No MPI and no model here: parallel/pipeline_executor runs these lists; `quintet schedule`
// prints them. The bubble maths is derived in docs/math.md §7.1.
//
// Vocabulary. pp ranks ("stages") each hold v chunks of layers (v = parallel.virtual_stages, 1
// unless the schedule is interleaved). The model's layers are cut into pp*v contiguous *virtual
// stages*; chunk c of stage s is virtual stage  vs = c*pp + s,  so a microbatch visits stages
// 0,1,..,pp-1 with chunk 0, then 0,1,..,pp-1 again with chunk 1, and so on. Virtual stage 0
// (stage 0, chunk 0) owns the embedding; virtual stage pp*v-1 (stage pp-1, chunk v-1) owns the
// final norm, LM head and loss.
//
// Action-list conventions (what the executor may rely on; the simulator enforces them):
//  - each (microbatch, chunk) appears exactly once as forward and once as backward, the forward
//    first -- or, in the zero-bubble schedules (zb_h1, zbv), once as forward, once as
//    backward_input (B: the gradient of the chunk's input, what the previous stage waits for)
//    and once as backward_weight (W: the gradients of the chunk's weights, which nothing waits
//    for and which may run later, filling the bubble), in that order;
//  - recv_fwd(mb, c) comes immediately before forward(mb, c), except on virtual stage 0;
//    send_fwd(mb, c) immediately after forward(mb, c), except on the last virtual stage;
//  - recv_bwd(mb, c) comes immediately before backward(mb, c) (or backward_input), except on the
//    last virtual stage (its backward starts from the loss); send_bwd(mb, c) immediately after
//    backward(mb, c) (or backward_input), except on virtual stage 0;
//  - placement (Placement): which virtual stage chunk c of a stage is. `loop` (every schedule but
//    zbv): vs = c*pp + stage, the layers loop round the stages v times. `vee` (zbv, v = 2): chunk
//    0 is vs = stage and chunk 1 is vs = 2*pp-1-stage, so the microbatch goes down the stages
//    and back up -- stage 0 holds the first and the last virtual stage, and stage pp-1's chunk 0
//    hands its output to its own chunk 1 (a transfer whose peer is the stage itself);
//  - peers (schedule_peer): a fwd message leaves virtual stage vs for vs+1, a bwd message leaves
//    vs for vs-1, each to whichever (stage, chunk) holds it under the placement (loop: from
//    (stage, c) to ((stage+1) % pp, c + (stage == pp-1)) forward, to ((stage-1+pp) % pp,
//    c - (stage == 0)) backward);
//  - on every directed link (sender rank, receiver rank, fwd|bwd) the sender's sends and the
//    receiver's recvs name the same (mb, chunk) messages in the same order. So an executor that
//    posts sends without waiting for them (MPI_Isend, completed later) and blocks in recvs cannot
//    deadlock and can rely on MPI's per-(source, tag) ordering, as long as fwd and bwd use
//    different tags (for pp = 2, or interleaved, one rank pair carries both directions).
#pragma once
#include <string>
#include <tuple>
#include <vector>

namespace quintet {

enum class Op { recv_fwd, forward, send_fwd, recv_bwd, backward, send_bwd, backward_input, backward_weight };
const char* op_name(Op op);  // "recv_fwd", "forward", ...
bool is_compute(Op op);      // forward, backward, backward_input, backward_weight

// Where a stage's chunks sit among the virtual stages (see above).
enum class Placement { loop, vee };
Placement schedule_placement(const std::string& kind);  // vee for zbv, else loop
// true for the zero-bubble schedules, whose backwards are split into B and W (zb_h1, zbv).
bool schedule_splits_backward(const std::string& kind);

struct Action {
    Op op;
    int microbatch;  // 0 .. m-1
    int chunk;       // this rank's chunk index 0 .. v-1 (0 unless interleaved)
    bool operator==(const Action&) const = default;
};

// Virtual stage of chunk `chunk` on `stage`: chunk*pp + stage (loop), or stage / 2*pp-1-stage
// for chunk 0 / 1 (vee).
int virtual_stage(int pp, int stage, int chunk, Placement placement = Placement::loop);

// The other end of a transfer action (recv_fwd/send_fwd/recv_bwd/send_bwd) issued by `stage`:
// the peer rank on the pp axis and the peer's chunk index. Throws std::invalid_argument for a
// compute op or for a transfer the conventions above never issue (e.g. recv_fwd on vs 0).
struct SchedulePeer {
    int stage;  // peer rank on the pp axis
    int chunk;  // the peer's chunk index for the same message
};
SchedulePeer schedule_peer(int pp, int v, int stage, const Action& a, Placement placement = Placement::loop);

// GPipe: all m forwards in microbatch order, then all m backwards in reverse order (m-1 .. 0).
// Every stage holds all m microbatches' activations at the peak.
std::vector<Action> make_gpipe(int pp, int stage, int m);

// 1F1B (PipeDream-Flush; Megatron's forward_backward_pipelining_without_interleaving):
// warm-up of min(pp - stage - 1, m) forwards, steady state of one forward then one backward,
// cool-down of the remaining backwards. At most min(pp - stage, m) microbatches in flight.
std::vector<Action> make_1f1b(int pp, int stage, int m);

// Interleaved 1F1B (Narayanan et al. 2021; Megatron's forward_backward_pipelining_with_interleaving),
// v >= 2 chunks per rank. Requires pp >= 2 and m % pp == 0 (so m >= pp): microbatches go through
// the chunks in groups of pp. The k-th forward (k = 0 .. m*v-1) runs
//   chunk (k mod pp*v) / pp  on microbatch  (k / (pp*v))*pp + k mod pp,
// the k-th backward the same microbatch with chunk v-1 - (k mod pp*v) / pp. Warm-up is
//   min((pp - stage - 1)*2 + (v - 1)*pp, m*v)
// forwards (Megatron's count), then one forward + one backward, then cool-down. Peak in flight:
// warm-up + 1 chunk-microbatches (each 1/v of a stage's activations). With instantaneous
// transfers (pp - stage - 1)*1 would give the same bubble with fewer in flight; Megatron's factor
// 2 is slack for the transfer latency a real link adds, so we keep it.
std::vector<Action> make_interleaved(int pp, int stage, int m, int v);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024), v = 1: 1F1B's warm-up of
// min(pp - stage - 1, m) forwards, then each steady step a forward and a backward_input; the
// W's follow their B's in order, except that stage s holds back its first s of them, which run
// after the last B. The W's so fill the time stage s would wait at the end of 1F1B: the bubble
// is (p-1)(F + B - W) instead of (p-1)(F + B + W) (about a third with F = B = W; exact for
// m >= pp), at the peak activation memory of 1F1B's stage 0 (at most min(pp, m) microbatches in
// flight, on every stage).
std::vector<Action> make_zb_h1(int pp, int stage, int m);

// ZB-V (the same paper, section 6), v = 2 chunks in a V (Placement::vee): stage s runs
// 2(pp-s)-1 forwards of chunk 0, then s pairs (chunk 1, chunk 0) of forwards, then pp-s triples
// of chunk 1 (F, B, W); a steady state of (F, B, W) on chunk 0 then chunk 1; a cool-down of s
// pairs of B's (chunk 0, chunk 1), pp-s pairs (B, W) on chunk 0, and the W's left (chunk 1's,
// then chunk 0's). Generated for max(m, 2pp-1) microbatches and the ones past m dropped (each
// stage keeps the order of what is left, which stays deadlock-free). With F = B = W the only
// idle time is the fill and the drain of one chunk forward per stage: the bubble is
// (p-1)/(6m + p-1) of the step, at 1F1B's peak activation memory (2pp chunk-microbatches of
// half a stage each on stage 0).
std::vector<Action> make_zbv(int pp, int stage, int m);

// kind = "1f1b" | "gpipe" | "interleaved" | "zb_h1" | "zbv". Validates with schedule_check(kind, pp, m, v, 0) and
// throws ConfigError with its message; throws std::invalid_argument if stage is not in [0, pp).
std::vector<Action> make_schedule(const std::string& kind, int pp, int stage, int m, int v);

// "" if the combination is valid, else a message in config_fail's form naming the deck key, the
// value and what is valid, e.g. "deck key 'parallel.microbatches' = '6': must be a multiple of
// parallel.pp = 4 for parallel.schedule = interleaved". Checks: kind known; pp, m >= 1;
// 1f1b/gpipe/zb_h1 need v == 1; interleaved needs v >= 2, pp >= 2, m % pp == 0; zbv needs v == 2,
// pp >= 2. When n_layers > 0 also: n_layers >= pp (v = 1: every stage needs a layer),
// n_layers % (pp*v) == 0 (interleaved, zbv: equal chunks). Pass n_layers = 0 to skip the layer
// checks (as `quintet schedule` does).
std::string schedule_check(const std::string& kind, int pp, int m, int v, int n_layers);

// Runs all stages' action lists together. Costs: tf / tb are one microbatch's forward / backward
// time through one rank's whole share of layers, so one chunk costs tf/v and tb/v (makespans of
// different v are then comparable); a split backward costs tb - tw (backward_input) and tw
// (backward_weight), tw = tb/2 when not given (tw < 0). Transfers take no time and sends never block; a recv blocks
// until its message was sent, and must find exactly that message at the head of its link (else
// std::logic_error "mismatch"). If some stage can never proceed, throws std::logic_error naming
// every stuck stage and the action it waits at. Also throws on convention violations (a forward
// without its recv, a backward before its forward, messages never received, ...).
//   slots:          the compute actions (forward/backward only) as (start, end, op, mb, chunk);
//                   gaps between them are recv waits
//   busy:           total compute time of the stage
//   idle_fraction:  1 - busy / makespan (makespan common to all stages)
//   peak_in_flight: max number of (mb, chunk) whose forward has run and whose backward (or
//                   backward_weight: W frees what the forward kept) not yet
struct StageTimeline {
    std::vector<std::tuple<double, double, Op, int, int>> slots;
    double busy = 0, idle_fraction = 0;
    int peak_in_flight = 0;
};
struct Simulation {
    double makespan = 0;
    std::vector<StageTimeline> stages;
};
Simulation simulate(const std::string& kind, int pp, int m, int v, double tf = 1.0, double tb = 2.0,
                    double tw = -1.0);
// The same for arbitrary per-stage lists (stages.size() = pp), e.g. to test a broken schedule.
Simulation simulate_actions(const std::vector<std::vector<Action>>& stages, int v,
                            double tf = 1.0, double tb = 2.0, double tw = -1.0,
                            Placement placement = Placement::loop);

// The largest number of messages a stage has sent to itself and not yet received (zbv's turn at
// the bottom of the V), over its whole list: the executor's local staging buffers. 0 for loop.
int self_messages_in_flight(const std::vector<Action>& actions, int pp, int v, int stage,
                            Placement placement);

// Bubble (idle) fraction of the makespan, equal on every stage, derived in docs/math.md §7.1:
//   1f1b, gpipe:  (p-1)(tf+tb) idle in a makespan of (m+p-1)(tf+tb)   ->  (p-1)/(m+p-1)
//   interleaved:  fill and drain take p-1 *chunk* slots, (p-1)(tf+tb)/v, beside m(tf+tb) of
//                 work  ->  ((p-1)/v) / (m + (p-1)/v) = (p-1)/(v*m + p-1)  (bubble/v for m >> p)
//   zb_h1:        (p-1)(F + B - W) idle beside m(F + B + W) of work; with F = B = W (tb = 2 tf)
//                 -> (p-1)/(3m + p-1), about a third of 1f1b's
//   zbv:          one chunk forward (F/2) of fill and of drain per stage beside 3mF of work
//                 -> (p-1)/(6m + p-1) with F = B = W, for m >= 2p-1 (fewer: simulate)
// Exact in simulation for equal costs tf = tb (1f1b and gpipe: for any tf, tb; zb_h1 and zbv for
// tb = 2 tf, tw = tf).
double bubble_theory(const std::string& kind, int pp, int m, int v);

// One stage's list as compact tokens: "F0 F1 B0 F2 B1 ..." (compute only), or with transfers
// "F0 sF0 rB0 B0 ..." where rF/sF = recv_fwd/send_fwd and rB/sB = recv_bwd/send_bwd. B is the
// backward (whole, or its input part B when split) and W the weight part. A chunk letter follows
// the microbatch when v > 1 (a = chunk 0, b = chunk 1, ...): "F3b".
std::string format_actions(const std::vector<Action>& actions, int v, bool with_transfers = false);

// A chart a person can read: a time axis, then one row per stage with time flowing right; each
// column is one time quantum (the largest q dividing every slot's duration), a compute slot shows
// its label ("F3", "B3", "F3b" with a chunk letter when v > 1) followed by '-' over the rest of
// its duration, '.' marks an idle quantum. width > 0 wraps the chart into blocks of at most that
// many characters; 0 = one block.
std::string render_timeline(const Simulation& s, int pp, int width = 0);

}  // namespace quintet
