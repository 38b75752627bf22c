// The planner: the trainer's memory and traffic, derived from the deck (docs/planner.md).
//
// Parameters, gradients and optimizer moments come from the same parameter table the trainer
// builds (model/params.cpp, composed per layer kind by perf/inventory); activations and
// communication buffers from the same declarations of the layer modules, laid out the same way
// (model/buffers.hpp, chunk_buffers in model/slot_store.hpp); the number of microbatches in flight per stage from the
// schedule's own action lists. On this host that is the trainer's accounting exactly, and time
// is compute at a share of the measured sgemm rate, plus each axis's bytes over the link, plus
// the pipeline bubble. On GPUs (perf/hardware) memory is a bf16 mixed-precision run's
// (perf/gpu_memory) and time the model of perf/gpu_cost.
#include "quintet/perf/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

#include "quintet/core/error.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/model/config.hpp"
#include "quintet/model/muon_layout.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/transformer.hpp"
#include "quintet/parallel/context_parallel.hpp"
#include "quintet/parallel/expert_parallel.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"
#include "quintet/perf/gpu_memory.hpp"
#include "quintet/perf/host_peak.hpp"
#include "quintet/perf/inventory.hpp"

namespace quintet {

PlanTarget::PlanTarget() : hardware(hardware_load("host")) {}

namespace {

// Share of the sgemm rate a whole training step reaches on one rank (matmuls at the model's
// shapes, attention, element-wise kernels, the optimizer): measured on medium-sized models on
// this project's CPU hosts (docs/planner.md "Compute").
constexpr double kComputeEfficiency = 0.80;
// What a step costs on this host besides its FLOPs (docs/planner.md §3 "Fixed costs"): every
// kernel call's own cost (an OpenMP region, a BLAS call: the tiny deck's rmsnorm takes 5.5 us a
// call on 128 rows), about 36 calls per layer and microbatch (forward and backward) and 8 per
// microbatch for the embedding, head and loss; and AdamW's pass over the rank's parameters once
// per step (3 ns a parameter on one thread: 0.4 ms for the tiny deck's 0.108 M, 33-65 ms for
// the medium benchmark's 32.5 M on 2 threads, docs/benchmarks.md).
constexpr double kHostCallSeconds = 5e-6;
constexpr double kHostCallsPerLayer = 36, kHostCallsPerMicrobatch = 8;
constexpr double kHostOptimizerSecondsPerParam = 3e-9;

// What a plan over many layouts computes once: the model's counts, each (tp, ep)'s shards, the
// chunks' buffers.
struct PlanCache {
    bool have_counts = false;
    ModelCounts counts;
    std::map<std::tuple<int, int, bool>, std::unique_ptr<ModelInventory>> inventories;
    BufferCache buffers;
    const ModelCounts& model(const ModelConfig& m) {
        if (!have_counts) counts = model_counts(m), have_counts = true;
        return counts;
    }
    const ModelInventory& inventory(const ModelConfig& m, int tp, int ep, bool sp) {
        auto& slot = inventories[std::make_tuple(tp, ep, sp)];
        if (!slot) slot = std::make_unique<ModelInventory>(m, tp, ep, sp);
        return *slot;
    }
};

// Muon (train.optimizer = muon) on one pipeline stage, as train/muon lays it out
// (docs/planner.md "Muon"): the stage's matrices are each orthogonalised whole by the owner
// model/muon_layout gives it in their group (dense: tp x dp x cp ranks; experts: tp x edp), which
// keeps their momentum, receives the gradient's pieces, runs the Newton-Schulz iteration and
// sends the update's pieces back; every rank stages the pieces of the matrices others own.
struct MuonFigures {
    double floats = 0;  // the largest rank's momentum, exchange buffers and scratch
    double momentum = 0;  // that rank's momentum alone (checkpoint.async stages it)
    double flops = 0;   // the most Newton-Schulz FLOPs one rank runs per step
    double tp_floats = 0, dp_floats = 0;  // the most floats one rank sends per step to its tp peers / other replicas
};

// Per rank g = t + tp * j of one group (j: the rank in the replica group of R): the same sums
// the trainer's plan makes. Under ZeRO each holder's piece is taken as 1/R of its shard (the
// slices cut tensors where they fall: exact in total, approximate per rank).
struct MuonRanks {
    std::vector<double> floats, flops, tp, dp;  // floats: momentum and exchange buffers
    std::vector<double> momentum;               // the momentum of the matrices each rank owns
    std::vector<double> largest, side;         // the largest owned matrix and its smaller side squared
};
MuonRanks muon_ranks(const std::vector<MuonEntry>& mats, int tp, int R, bool sharded, int steps) {
    const size_t G = size_t(tp) * size_t(R);
    const std::vector<double> zeros(G, 0.0);
    MuonRanks out{zeros, zeros, zeros, zeros, zeros, zeros, zeros};
    if (mats.empty()) return out;
    std::vector<MuonMatrix> shapes;
    for (const MuonEntry& e : mats) shapes.push_back(e.whole);
    const std::vector<int> owner = muon_owners(shapes, int(G));
    std::vector<double> momentum(G, 0.0), own(G, 0.0), gather(G, 0.0), scatter(G, 0.0), dp_corr(G, 0.0),
        dp_base(size_t(tp), 0.0);
    std::vector<char> replicas(G, 0);  // an owned matrix has pieces that are not designated
    std::vector<double>&largest = out.largest, &side = out.side;
    double pieces = 0;
    for (size_t k = 0; k < mats.size(); ++k) {
        const MuonEntry& e = mats[k];
        const size_t o = size_t(owner[k]);
        const int to = int(o % size_t(tp)), jo = int(o / size_t(tp)), r = std::max(1, e.tp_copies);
        const double n = double(e.whole.numel()), piece = sharded ? e.shard / R : e.shard;
        const double lo = std::min(e.whole.rows, e.whole.cols);
        momentum[o] += n, largest[o] = std::max(largest[o], n), side[o] = std::max(side[o], lo * lo);
        out.flops[o] += newton_schulz_flops(e.whole, steps);
        pieces += piece, own[o] += piece;
        gather[o] += n - (to % r == 0 ? piece : 0.0);    // the designated pieces of the others
        scatter[o] += double(tp) * R * piece - piece;    // the update's pieces to every other holder
        // Pieces that are not designated, held by other ranks: every other replica's without
        // ZeRO; the non-writer tp copies' (but the owner's own).
        const int non_writers = R * (tp - tp / r) - (to % r != 0 ? 1 : 0);
        if ((!sharded && R > 1) || non_writers > 0) replicas[o] = 1;
        out.tp[o] += double(tp - 1) * piece;
        out.dp[o] += double(R - 1) * tp * piece;
        for (int t = 0; t < tp; t += r) {  // the writers send their designated pieces
            if (t != to) out.tp[size_t(t + tp * jo)] += piece;
            if (sharded) dp_base[size_t(t)] += piece, dp_corr[size_t(t + tp * jo)] -= piece;
        }
    }
    for (size_t g = 0; g < G; ++g) {
        if (sharded) out.dp[g] += dp_base[g % size_t(tp)] + dp_corr[g];
        // Only designated pieces arriving: the update goes back through the gradient's buffer.
        const double staged = G > 1 ? (pieces - own[g]) + gather[g] + (replicas[g] ? scatter[g] : 0.0) : 0.0;
        out.floats[g] = momentum[g] + staged;
    }
    out.momentum = momentum;
    return out;
}

// Both groups of a stage, rank by rank (t, j): dense rank t + tp j, expert rank t + tp (j / ep).
MuonFigures muon_figures(const ModelInventory::MuonStage& st, int tp, int dp_cp, int ep, bool sharded, int steps) {
    const MuonRanks d = muon_ranks(st.dense, tp, dp_cp, sharded, steps);
    const MuonRanks e = muon_ranks(st.expert, tp, dp_cp / ep, sharded, steps);
    MuonFigures f;
    for (int j = 0; j < dp_cp; ++j)
        for (int t = 0; t < tp; ++t) {
            const size_t a = size_t(t + tp * j), b = size_t(t + tp * (j / ep));
            // One scratch for both groups: two of the largest owned matrix, two of its side squared.
            const double scratch = 2 * std::max(d.largest[a], e.largest[b]) + 2 * std::max(d.side[a], e.side[b]);
            if (d.floats[a] + e.floats[b] + scratch > f.floats) {
                f.floats = d.floats[a] + e.floats[b] + scratch;
                f.momentum = d.momentum[a] + e.momentum[b];
            }
            f.flops = std::max(f.flops, d.flops[a] + e.flops[b]);
            f.tp_floats = std::max(f.tp_floats, d.tp[a] + e.tp[b]);
            f.dp_floats = std::max(f.dp_floats, d.dp[a] + e.dp[b]);
        }
    return f;
}

Recompute recompute_of(const std::string& s) {
    return s == "full" ? Recompute::full : s == "selective" ? Recompute::selective : Recompute::none;
}

// This host: the trainer's accounting (docs/planner.md §1-4).
void plan_host(PlanRow& row, const Deck& deck, int world, const MachineModel& mm, PlanCache& cache) {
    const auto& p = deck.parallel;
    const ModelConfig& m = deck.model;
    const ModelDims d = model_dims(m, p.tp, 0);
    const int edp = p.dp * p.cp / p.ep;
    const bool moe = m.moe.experts > 0;
    const double B = deck.data.micro_batch_size, T = deck.data.seq_len, Tl = T / p.cp, N = B * Tl;
    const bool sp = p.sequence_parallel && p.tp > 1;
    const double Nr = sp ? N / p.tp : N, C = m.d_model;
    const bool bf16 = deck.train.precision == "bf16";
    const Recompute rec = recompute_of(deck.train.recompute);
    row.bubble = bubble_theory(p.schedule, p.pp, p.microbatches, p.virtual_stages);

    const ModelCounts& counts = cache.model(m);
    const ModelInventory& inv = cache.inventory(m, p.tp, p.ep, sp);
    const double head_params = double(m.vocab_size) * m.d_model;
    // The MTP modules (last stage): their layers, projections and passes through the head.
    const double mtp_params = m.mtp_depth * (inv.mtp().active + head_params);
    const double layer_params = (counts.active - head_params - mtp_params) / m.n_layers;
    const ModelDims d1 = model_dims(m, 1, 0);
    const double attn_flops_tok = 6.0 * T * d1.NH * double(d1.Dqk + d1.Dv);  // per layer

    const double threads = mm.threads_per_rank > 0 ? mm.threads_per_rank
                           : std::max(1.0, std::floor(double(mm.cores) / (mm.ranks_per_node > 0 ? mm.ranks_per_node : world)));
    const int per_node = mm.ranks_per_node > 0 ? std::min(mm.ranks_per_node, world) : world;
    // Ranks of a node share its cores: more threads than cores run at the cores' rate.
    const double busy = std::max(1.0, per_node * threads / mm.cores);
    const double rate = mm.matmul_gflops_per_core * 1e9 * threads / busy * kComputeEfficiency;

    BufferShape bs;
    bs.B = deck.data.micro_batch_size;
    bs.T = deck.data.seq_len / p.cp;
    bs.N = bs.B * bs.T;
    bs.Nr = sp ? bs.N / p.tp : bs.N;
    bs.bf16 = bf16, bs.sp = sp, bs.recompute = rec;
    bs.cp = p.cp, bs.mla_latent = p.cp > 1 && p.cp_mla_kv == "latent", bs.ep = p.ep;
    bs.max_positions = deck.data.seq_len;
    bs.split_bw = schedule_splits_backward(p.schedule);
    const double pad[kNumRegions] = {double(p.dp) * p.cp, double(edp), 1};
    const Placement placement = schedule_placement(p.schedule);

    double worst_total = -1, worst_compute = 0;
    RegionFloats worst_params;
    const bool muon = deck.train.optimizer == "muon";
    MuonFigures muon_worst;  // the largest of every stage
    std::vector<ModelInventory::Unit> worst_units;
    for (int stage = 0; stage < p.pp; ++stage) {
        const auto chunks = stage_chunks(m.n_layers, p.pp, p.virtual_stages, stage, p.pp_layers, placement);
        const RegionFloats used = inv.stage_params(chunks, p.pp);
        // The arena: each region padded to a multiple of its replica group (ZeRO-1's shards).
        double total = 0;
        for (int r = 0; r < kNumRegions; ++r) total += std::ceil(used.r[size_t(r)] / pad[r]) * pad[r];
        MemoryBytes mem;
        mem.params = total * 4 + (bf16 ? total * 2 : 0);
        double state = 0, shards = 0;
        for (int r = 0; r < kNumRegions; ++r) {
            if (Replicas(r) == Replicas::none || used.r[size_t(r)] == 0) continue;
            const double shard = std::ceil(used.r[size_t(r)] / pad[r]);
            state += p.zero ? shard : used.r[size_t(r)];
            if (p.zero) shards += std::max(shard, 1.0);
        }
        mem.grads = total * 4 + shards * 4;
        mem.optimizer = 2 * std::max(state, 1.0) * 4;
        // checkpoint.async: the staging copy of what the rank writes (train/checkpointing): its
        // dp-owned slice of each trainable region with its optimizer state (AdamW's two moments;
        // under Muon, for AdamW's tensors only, and the momentum of the matrices the rank
        // orthogonalises, whole), and (the first rank of its dp x cp group, the largest) the buffers.
        double written = 0, written_buffers = 0;
        for (int r = 0; r < kNumRegions; ++r) {
            if (Replicas(r) == Replicas::none) written_buffers += used.r[size_t(r)];
            else written += std::ceil(used.r[size_t(r)] / pad[r]);
        }
        double staging = written_buffers + 3 * written;
        // ZeRO-2/3: this rank's slices of every unit and the windows (train/zero_state), from the
        // trainer's own byte functions (model/params.hpp).
        std::vector<ModelInventory::Unit> units;
        if (p.zero >= 2) {
            units = inv.stage_units(chunks, p.pp);
            double arena = 0;
            const ZeroLayout z = zero_sizes(units, pad, &arena);
            mem.params = zero_param_bytes(arena, z, p.zero, bf16);
            mem.grads = zero_grad_bytes(z);
            mem.optimizer = 2 * double(std::max<size_t>(z.trainable, 1)) * 4;
            state = double(z.trainable);
            written = double(z.trainable), written_buffers = double(z.buffers);
        }
        // Muon: AdamW's two moments for the other tensors only, Muon's momentum and exchange
        // (train/optimizer, train/muon). Under ZeRO Muon's share of a rank's slices is taken as
        // its share of the region.
        if (muon) {
            const ModelInventory::MuonStage ms = inv.stage_muon(chunks);
            const MuonFigures f = muon_figures(ms, p.tp, p.dp * p.cp, p.ep, p.zero > 0, deck.train.muon_ns_steps);
            double adam = used.trainable() - ms.floats.trainable();
            if (p.zero) adam = state - ms.floats.r[0] / pad[0] - ms.floats.r[1] / pad[1];
            mem.optimizer = 2 * std::max(std::round(adam), 1.0) * 4 + f.floats * 4;
            muon_worst.floats = std::max(muon_worst.floats, f.floats);
            muon_worst.flops = std::max(muon_worst.flops, f.flops);
            muon_worst.tp_floats = std::max(muon_worst.tp_floats, f.tp_floats);
            muon_worst.dp_floats = std::max(muon_worst.dp_floats, f.dp_floats);
            const double adam_written = written - ms.floats.r[0] / pad[0] - ms.floats.r[1] / pad[1];
            staging = written_buffers + written + 2 * std::max(std::round(adam_written), 0.0) + f.momentum;
        }
        // Each chunk keeps as many slots as it had microbatches in flight at once (the executor
        // allocates them on demand); activations are what its blocks declare (the trainer's own
        // accounting, model/slot_store.hpp chunk_buffers).
        const std::vector<int> slots = chunk_slots(p.schedule, p.pp, stage, p.microbatches, p.virtual_stages);
        double act_bytes = 0, stage_layers = 0;
        size_t ring_kv = 0, ring_out = 0, ring_lse = 0, exchange = 0;
        bool last = false;
        for (size_t ci = 0; ci < chunks.size(); ++ci) {
            const auto& c = chunks[ci];
            const ChunkBuffers& cb = cache.buffers.get(m, d, c, bs, deck.data.document_mask);
            act_bytes += double(slots[ci]) * double(cb.slot_bytes()) + double(cb.workspace_bytes()) +
                         double(cb.shared_bytes());
            ring_kv = std::max(ring_kv, cb.ring_kv), ring_out = std::max(ring_out, cb.ring_out);
            ring_lse = std::max(ring_lse, cb.ring_lse), exchange = std::max(exchange, cb.exchange);
            stage_layers += c.layer_end - c.layer_begin;
            last = last || c.last;
        }
        mem.activations = act_bytes;
        // Buffers: the pipeline's receive staging; the cp ring's K/V, dK/dV and partial outputs;
        // the ep exchange's staging (all reserved while the model is built, as declared).
        // (and zbv's turn of the V: the messages a stage sends itself, staged locally)
        const int locals = placement == Placement::vee
                               ? self_messages_in_flight(make_schedule(p.schedule, p.pp, stage, p.microbatches,
                                                                       p.virtual_stages),
                                                         p.pp, p.virtual_stages, stage, placement)
                               : 0;
        mem.buffers = double(1 + locals) * double(bs.Nr) * C * sizeof(float);
        if (p.cp > 1) mem.buffers += double(ContextParallel::buffer_bytes(ring_kv, ring_out, ring_lse));
        if (p.ep > 1 && exchange > 0) mem.buffers += double(ExpertParallel::buffer_bytes(exchange));
        if (deck.checkpoint.async) mem.buffers += std::max(staging, 1.0) * sizeof(float);
        mem.runtime = mm.runtime_base_bytes + mm.data_bytes;
        mem.total = mem.params + mem.grads + mem.optimizer + mem.activations + mem.buffers + mem.runtime;
        // Compute of this stage, per microbatch: its layers' share and (last stage) the head,
        // over the tp x cp ranks sharing each token's work; recompute adds forwards.
        const double tok_mb = B * T;
        double fl = stage_layers * (6 * layer_params + attn_flops_tok) + (last ? 6 * head_params : 0);
        if (last) fl += 6 * mtp_params + m.mtp_depth * attn_flops_tok;
        if (rec == Recompute::full) fl += stage_layers * (2 * layer_params + attn_flops_tok / 3);
        if (rec == Recompute::selective) fl += stage_layers * attn_flops_tok / 3;
        fl *= tok_mb / (p.tp * p.cp);
        const double calls = stage_layers * kHostCallsPerLayer + kHostCallsPerMicrobatch;
        const double compute = (fl / rate + calls * kHostCallSeconds) * p.microbatches;
        if (mem.total > worst_total) {
            worst_total = mem.total;
            row.memory = mem;
            row.stage = stage;
            worst_params = used;
            worst_units = std::move(units);
        }
        worst_compute = std::max(worst_compute, compute);
    }
    row.compute_s = worst_compute;

    // Bytes one rank sends per step, by axis, with the trainer's conventions (ring collectives:
    // an all-reduce of S bytes over g ranks sends 2S(g-1)/g, a gather or a scatter S(g-1)/g).
    const double mb = p.microbatches, L_stage = double(m.n_layers) / p.pp;
    const double rowbytes = N * C * 4;  // one microbatch's activations of the full sequence
    const double g_tp = double(p.tp - 1) / p.tp;
    // Per layer: attention and FFN each gather their input and reduce their output, forward
    // and backward (without SP: one all-reduce each way, the same bytes); full recompute
    // repeats the forward's.
    const double tp_layer = 8 * rowbytes * g_tp * (bf16 && sp ? 0.75 : 1.0);
    row.comm_bytes.tp = p.tp > 1 ? mb * L_stage * tp_layer * (rec == Recompute::full ? 1.5 : 1.0) : 0;
    // Gradients: dense over dp x cp, experts over edp (all-reduce; ZeRO-1: reduce-scatter plus the
    // parameters' all-gather, the same bytes). ZeRO-2/3 reduce-scatter every unit's gradient once
    // per microbatch; zero 2 all-gathers the updated parameters once per step, zero 3 gathers each
    // unit before its forward and each layer again before its backward (and before the W of a
    // split schedule under full recomputation), per microbatch -- an upper bound: a unit still in
    // a window is not gathered again.
    {
        const double gd = double(p.dp) * p.cp, ge = edp;
        double b = 0;
        if (p.zero >= 2) {
            const bool split_full = schedule_splits_backward(p.schedule) && rec == Recompute::full;
            for (const auto& u : worst_units) {
                const double gathers = p.zero == 3 ? mb * (1 + (u.layer ? 1 : 0) + (u.layer && split_full ? 1 : 0)) : 1;
                for (int r = 0; r < 2; ++r) {
                    const double g = r == 0 ? gd : ge;
                    if (g <= 1) continue;
                    b += (mb + gathers) * std::ceil(u.f.r[size_t(r)] / g) * g * 4 * (g - 1) / g;
                }
            }
        } else {
            if (gd > 1) b += 2 * worst_params.r[0] * 4 * (gd - 1) / gd;
            if (ge > 1) b += 2 * worst_params.r[1] * 4 * (ge - 1) / ge;
        }
        row.comm_bytes.dp = b;
    }
    // Context ring: forward sends this rank's K/V block cp-1 times; the backward sends K/V and
    // dK/dV around again.
    if (p.cp > 1) {
        const double kv = B * Tl * double(d.NKVl) * (d.Dqk + d.Dv) * 4;
        row.comm_bytes.cp = mb * L_stage * (p.cp - 1) * kv * 3;
    }
    // Experts: dispatch and combine, forward and backward, of the k rows per token that leave
    // the rank (a balanced router sends (ep-1)/ep of them).
    if (moe && p.ep > 1) {
        double moe_layers = 0;
        for (int l = 0; l < m.n_layers; ++l) moe_layers += moe_layer(m, l) ? 1 : 0;
        row.comm_bytes.ep = mb * moe_layers / p.pp * 4 * Nr * m.moe.top_k * C * 4 * (p.ep - 1) / p.ep;
    }
    // Pipeline: each microbatch's boundary activations forward and their gradient back.
    if (p.pp > 1) row.comm_bytes.pp = mb * 2 * Nr * C * 4;

    const double bw = mm.link_gbs * 1e9, lat = mm.link_latency_s;
    auto t_of = [&](double bytes, double msgs) { return bytes > 0 ? bytes / bw + msgs * lat : 0.0; };
    row.comm_s.tp = t_of(row.comm_bytes.tp, mb * L_stage * 8);
    row.comm_s.cp = t_of(row.comm_bytes.cp, mb * L_stage * 3 * (p.cp - 1));
    // Bucketed gradient reductions overlap the backward when parallel.overlap_dp: the last
    // bucket's share stays exposed.
    const double dp_t = t_of(row.comm_bytes.dp, 2 * (p.dp * p.cp - 1));
    // (ZeRO-2/3 reduce and gather unit by unit while the next unit computes.)
    row.comm_s.dp = ((p.overlap_dp && !p.zero) || p.zero >= 2) ? std::max(dp_t * 0.5, dp_t - 0.6 * row.compute_s) : dp_t;
    row.comm_s.ep = t_of(row.comm_bytes.ep, mb * 4 * m.n_layers / p.pp);
    row.comm_s.pp = t_of(row.comm_bytes.pp, mb * 2);
    const double busy_s = row.compute_s + row.comm_s.tp + row.comm_s.cp + row.comm_s.ep + row.comm_s.pp;
    row.bubble_s = row.bubble < 1 ? busy_s * row.bubble / (1 - row.bubble) : 0;
    row.fixed_s = worst_params.sum() * kHostOptimizerSecondsPerParam / threads;
    if (muon) {
        // Muon's Newton-Schulz GEMMs at the matmul rate and its two exchanges per step, blocking:
        // a fixed cost of the step, its FLOPs apart from the model's (not in MFU), its bytes in
        // the axes' figures.
        const double msgs = 2.0 * (p.tp * p.dp * p.cp - 1);
        row.optimizer_flops = muon_worst.flops;
        row.fixed_s += muon_worst.flops / rate + t_of(muon_worst.tp_floats * 4, p.tp > 1 ? msgs : 0) +
                       t_of(muon_worst.dp_floats * 4, p.dp * p.cp > 1 ? msgs : 0);
        row.comm_bytes.tp += muon_worst.tp_floats * 4;
        row.comm_bytes.dp += muon_worst.dp_floats * 4;
    }
    row.step_time_s = busy_s + row.bubble_s + row.comm_s.dp + row.fixed_s;
    const int sizes[kNumPlanAxes] = {p.tp, p.cp, p.dp * p.cp / p.ep, p.ep, p.pp};
    for (int a = 0; a < kNumPlanAxes; ++a) row.link[size_t(a)] = sizes[a] > 1 ? "host" : "none";
}

// A GPU cluster: perf/gpu_memory and perf/gpu_cost.
void plan_gpu(PlanRow& row, const Deck& deck, const PlanTarget& target, PlanCache& cache) {
    const auto& p = deck.parallel;
    const ModelConfig& m = deck.model;
    const Hardware& hw = target.hardware;
    const ModelDims d = model_dims(m, p.tp, 0);
    const bool sp = p.sequence_parallel && p.tp > 1;
    const bool bf16 = deck.train.precision == "bf16";
    const Recompute rec = recompute_of(deck.train.recompute);
    const ModelInventory& inv = cache.inventory(m, p.tp, p.ep, sp);
    // The modules' declarations with a balanced router: each rank's experts receive the k rows
    // per token its own rows send (ep = 1 sizes them so; the trainer's CPU arenas reserve the
    // dropless worst case instead).
    BufferShape bs;
    bs.B = deck.data.micro_batch_size;
    bs.T = deck.data.seq_len / p.cp;
    bs.N = bs.B * bs.T;
    bs.Nr = sp ? bs.N / p.tp : bs.N;
    bs.bf16 = bf16, bs.sp = sp, bs.recompute = rec;
    bs.cp = p.cp, bs.mla_latent = p.cp > 1 && p.cp_mla_kv == "latent", bs.ep = 1;
    bs.max_positions = deck.data.seq_len;
    bs.split_bw = schedule_splits_backward(p.schedule);

    GpuLayout gl;
    gl.model = &m, gl.inv = &inv;
    gl.tp = p.tp, gl.cp = p.cp, gl.dp = p.dp, gl.pp = p.pp, gl.ep = p.ep, gl.v = p.virtual_stages;
    gl.microbatches = p.microbatches, gl.zero = p.zero, gl.schedule = p.schedule;
    gl.B = deck.data.micro_batch_size, gl.T = deck.data.seq_len;
    gl.sp = sp, gl.bf16 = bf16, gl.overlap_dp = p.overlap_dp, gl.recompute = rec, gl.bucket_mb = p.bucket_mb;

    double worst = -1;
    const bool muon = deck.train.optimizer == "muon";
    MuonFigures muon_worst;
    for (int stage = 0; stage < p.pp; ++stage) {
        const auto chunks = stage_chunks(m.n_layers, p.pp, p.virtual_stages, stage, p.pp_layers,
                                         schedule_placement(p.schedule));
        GpuLayout::Stage st;
        st.params = inv.stage_params(chunks, p.pp);
        GpuMemoryInput in;
        in.params = st.params, in.bf16 = bf16, in.zero = p.zero;
        if (muon) {
            const ModelInventory::MuonStage ms = inv.stage_muon(chunks);
            in.muon = ms.floats;
            const MuonFigures f = muon_figures(ms, p.tp, p.dp * p.cp, p.ep, p.zero > 0, deck.train.muon_ns_steps);
            muon_worst.flops = std::max(muon_worst.flops, f.flops);
            muon_worst.tp_floats = std::max(muon_worst.tp_floats, f.tp_floats);
            muon_worst.dp_floats = std::max(muon_worst.dp_floats, f.dp_floats);
        }
        in.dense_group = double(p.dp) * p.cp, in.expert_group = double(p.dp) * p.cp / p.ep;
        if (p.zero >= 2)
            for (const auto& u : inv.stage_units(chunks, p.pp)) in.largest_unit = std::max(in.largest_unit, u.f.sum());
        const std::vector<int> slots = chunk_slots(p.schedule, p.pp, stage, p.microbatches, p.virtual_stages);
        size_t ring_kv = 0, ring_out = 0, ring_lse = 0;
        for (size_t ci = 0; ci < chunks.size(); ++ci) {
            const auto& c = chunks[ci];
            for (int l = c.layer_begin; l < c.layer_end; ++l) (moe_layer(m, l) ? st.moe_layers : st.dense_layers) += 1;
            st.first = st.first || c.first, st.last = st.last || c.last;
            const ChunkBuffers& cb = cache.buffers.get(m, d, c, bs, deck.data.document_mask);
            in.chunks.emplace_back(&cb, slots[ci]);
            ring_kv = std::max(ring_kv, cb.ring_kv), ring_out = std::max(ring_out, cb.ring_out);
            ring_lse = std::max(ring_lse, cb.ring_lse);
        }
        if (p.pp > 1) in.boundary_values = double(bs.Nr) * m.d_model;
        if (p.cp > 1) in.ring_values = 4.0 * double(ring_kv) + double(ring_out) + double(ring_lse);
        if (p.ep > 1 && st.moe_layers > 0) in.exchange_values = 2.0 * bs.Nr * m.moe.top_k * m.d_model;
        if (target.framework.unfused_attention && rec != Recompute::selective)
            in.score_values = double(bs.B) * d.NHl * bs.T * double(deck.data.seq_len);
        const MemoryBytes mem = gpu_memory(in);
        if (mem.total > worst) worst = mem.total, row.memory = mem, row.stage = stage;
        gl.stages.push_back(st);
    }
    const GpuStepTime t = gpu_step_time(gl, hw, target.framework, target.calibration);
    row.compute_s = t.compute_s;
    row.bubble = t.bubble, row.bubble_s = t.bubble_s, row.step_time_s = t.step_s, row.fixed_s = t.optimizer_s;
    row.comm_bytes = {t.comm_bytes[kAxisTp], t.comm_bytes[kAxisCp], t.comm_bytes[kAxisDp], t.comm_bytes[kAxisEp],
                      t.comm_bytes[kAxisPp]};
    row.comm_s = {t.comm_s[kAxisTp], t.comm_s[kAxisCp], t.comm_s[kAxisDp], t.comm_s[kAxisEp], t.comm_s[kAxisPp]};
    row.link = t.link;
    if (muon) {
        // Muon's Newton-Schulz GEMMs (fp32) at the GEMMs' share of the fp32 peak, apart from the
        // model's FLOPs; its exchange's bytes counted on tp and dp (their time is not modelled).
        row.optimizer_flops = muon_worst.flops;
        const double s = muon_worst.flops / (hw.peak_tflops(false) * 1e12 * target.calibration.gemm_share_of_best);
        row.fixed_s += s, row.step_time_s += s;
        row.comm_bytes.tp += muon_worst.tp_floats * 4;
        row.comm_bytes.dp += muon_worst.dp_floats * 4;
    }
}

PlanRow plan_one(const Deck& deck_in, int world, const PlanTarget& target, PlanCache& cache) {
    Deck deck = deck_in;
    auto& p = deck.parallel;
    PlanRow row;
    row.zero = p.zero, row.recompute = deck.train.recompute, row.micro_batch_size = deck.data.micro_batch_size;
    if (const int64_t tcp = int64_t(p.tp) * p.cp * p.pp; p.dp == 0 && tcp > 0 && world % tcp == 0) p.dp = int(world / tcp);
    // train.global_batch fixes the samples per step: each layout runs what its dp leaves.
    const int64_t gb = deck.train.global_batch, per = int64_t(std::max(p.dp, 1)) * deck.data.micro_batch_size;
    if (gb > 0 && gb % per == 0) p.microbatches = int(gb / per);
    row.microbatches = p.microbatches;
    row.tp = p.tp, row.cp = p.cp, row.dp = p.dp, row.pp = p.pp, row.ep = p.ep;
    try {
        deck_validate(deck, world, /*check_host_memory=*/false);
    } catch (const ConfigError& e) {
        row.reason = e.what();
        return row;
    }
    row.valid = true;
    const ModelConfig& m = deck.model;
    row.global_batch = int64_t(p.dp) * p.microbatches * deck.data.micro_batch_size;
    const ModelCounts& counts = cache.model(m);
    row.params_total = counts.total, row.params_active = counts.active;
    // FLOPs: the 6·N·P convention of the whole model (docs/math.md §1), attention included.
    const ModelDims d1 = model_dims(m, 1, 0);
    const double T = deck.data.seq_len;
    const double per_token = 6.0 * counts.active + 6.0 * (m.n_layers + m.mtp_depth) * T * d1.NH * double(d1.Dqk + d1.Dv);
    const double tokens_step = double(row.global_batch) * T;
    row.flops_per_step = per_token * tokens_step;
    if (target.hardware.host) plan_host(row, deck, world, target.machine, cache);
    else plan_gpu(row, deck, target, cache);
    row.tokens_per_s = tokens_step / row.step_time_s;
    row.tflops_per_device = row.flops_per_step / (double(world) * row.step_time_s) / 1e12;
    const bool bf16 = deck.train.precision == "bf16";
    double peak = 0;
    if (!target.hardware.host) peak = target.hardware.peak_tflops(bf16);
    else peak = target.machine.matmul_gflops_per_core * target.machine.cores * 1e-3;  // the node's sgemm rate
    row.mfu = peak > 0 ? row.tflops_per_device / peak : 0;
    const double limit = target.device_memory_bytes > 0 ? target.device_memory_bytes
                          : target.hardware.host    ? 0
                                                    : target.hardware.memory_bytes();
    row.fits = limit <= 0 || row.memory.total <= limit;
    return row;
}

std::vector<int> divisors(int n) {
    std::vector<int> out;
    for (int i = 1; int64_t(i) * i <= n; ++i)
        if (n % i == 0) {
            out.push_back(i);
            if (i != n / i) out.push_back(n / i);
        }
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

PlanRow plan_layout(const Deck& deck, int world, const PlanTarget& target) {
    PlanCache cache;
    return plan_one(deck, world, target, cache);
}

PlanRow plan_layout(const Deck& deck, int world, const MachineModel& machine) {
    PlanTarget t;
    t.machine = machine;
    return plan_layout(deck, world, t);
}

std::vector<PlanRow> plan_all(const Deck& deck, int world, const PlanTarget& target, const PlanSweep& sweep,
                              const PlanOnly& only) {
    const std::vector<int> mbs = sweep.microbatches.empty() ? std::vector<int>{deck.parallel.microbatches} : sweep.microbatches;
    const std::vector<int> zeros = sweep.zero.empty() ? std::vector<int>{deck.parallel.zero} : sweep.zero;
    const std::vector<std::string> recs = sweep.recompute.empty() ? std::vector<std::string>{deck.train.recompute} : sweep.recompute;
    const std::vector<int> sizes =
        sweep.micro_batch_size.empty() ? std::vector<int>{deck.data.micro_batch_size} : sweep.micro_batch_size;
    PlanCache cache;
    std::vector<PlanRow> rows;
    auto keep = [](int want, int v) { return want == 0 || want == v; };
    // tp, cp and pp each divide what the previous ones leave (their product never exceeds the
    // world, so it cannot overflow); dp is the rest; ep divides dp x cp.
    for (int tp : divisors(world)) {
        if (!keep(only.tp, tp)) continue;
        for (int cp : divisors(world / tp)) {
            if (!keep(only.cp, cp)) continue;
            for (int pp : divisors(world / tp / cp)) {
                if (!keep(only.pp, pp)) continue;
                const int dp = world / tp / cp / pp;
                if (!keep(only.dp, dp)) continue;
                for (int ep : divisors(dp * cp)) {
                    if (!keep(only.ep, ep)) continue;
                    if (ep > 1 && deck.model.moe.experts == 0) continue;  // no experts to split
                    for (int size : sizes)
                        for (int mb : mbs)
                            for (int z : zeros)
                                for (const auto& rc : recs) {
                                    Deck d = deck;
                                    d.parallel.tp = tp, d.parallel.cp = cp, d.parallel.pp = pp, d.parallel.dp = dp;
                                    d.parallel.ep = ep, d.parallel.microbatches = mb, d.parallel.zero = z;
                                    d.train.recompute = rc, d.data.micro_batch_size = size;
                                    rows.push_back(plan_one(d, world, target, cache));
                                }
                }
            }
        }
    }
    std::stable_sort(rows.begin(), rows.end(), [](const PlanRow& a, const PlanRow& b) {
        if (a.valid != b.valid) return a.valid;
        if (a.fits != b.fits) return a.fits;
        return a.tokens_per_s > b.tokens_per_s;
    });
    // Ties with the first row: a time per token within the planner's error of its.
    if (!rows.empty() && rows.front().valid) {
        const PlanRow& best = rows.front();
        const double err = plan_error(target);
        for (PlanRow& r : rows)
            r.tie = r.valid && r.fits == best.fits && r.tokens_per_s * (1 + err) >= best.tokens_per_s;
    }
    return rows;
}

double plan_error(const PlanTarget& target) { return target.hardware.host ? 0.10 : 0.125; }

std::vector<PlanRow> plan_all(const Deck& deck, int world, const MachineModel& machine, const PlanSweep& sweep,
                              double device_memory_bytes) {
    PlanTarget t;
    t.machine = machine;
    t.device_memory_bytes = device_memory_bytes;
    return plan_all(deck, world, t, sweep);
}

namespace {
std::string json_string(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\', o += c;
        else if (c == '\n') o += "\\n";
        else if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else o += c;
    }
    return o + "\"";
}
std::string num(double v) {
    if (!std::isfinite(v)) return "null";
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", v);
    return b;
}
std::string axes(const AxisFigures& a) {
    return "{\"tp\": " + num(a.tp) + ", \"cp\": " + num(a.cp) + ", \"dp\": " + num(a.dp) + ", \"ep\": " + num(a.ep) +
           ", \"pp\": " + num(a.pp) + "}";
}
}  // namespace

std::string plan_json(const std::vector<PlanRow>& rows) {
    std::ostringstream o;
    o << "[";
    for (size_t i = 0; i < rows.size(); ++i) {
        const PlanRow& r = rows[i];
        o << (i ? ",\n " : "\n ") << "{\"tp\": " << r.tp << ", \"cp\": " << r.cp << ", \"dp\": " << r.dp
          << ", \"pp\": " << r.pp << ", \"ep\": " << r.ep << ", \"micro_batch_size\": " << r.micro_batch_size
          << ", \"microbatches\": " << r.microbatches
          << ", \"zero\": " << r.zero << ", \"recompute\": " << json_string(r.recompute)
          << ", \"valid\": " << (r.valid ? "true" : "false") << ", \"reason\": "
          << (r.valid ? "null" : json_string(r.reason));
        if (r.valid) {
            const MemoryBytes& m = r.memory;
            o << ", \"fits\": " << (r.fits ? "true" : "false") << ", \"stage\": " << r.stage
              << ", \"memory_bytes\": {\"params\": " << num(m.params) << ", \"grads\": " << num(m.grads)
              << ", \"optimizer\": " << num(m.optimizer) << ", \"activations\": " << num(m.activations)
              << ", \"buffers\": " << num(m.buffers) << ", \"runtime\": " << num(m.runtime)
              << ", \"total\": " << num(m.total) << "}, \"comm_bytes\": " << axes(r.comm_bytes)
              << ", \"comm_s\": " << axes(r.comm_s) << ", \"links\": {";
            for (int a = 0; a < kNumPlanAxes; ++a)
                o << (a ? ", " : "") << "\"" << plan_axis_name(a) << "\": " << json_string(r.link[size_t(a)]);
            o << "}, \"bubble\": " << num(r.bubble) << ", \"compute_s\": " << num(r.compute_s)
              << ", \"step_time_s\": " << num(r.step_time_s) << ", \"tokens_per_s\": " << num(r.tokens_per_s)
              << ", \"global_batch\": " << r.global_batch << ", \"params_total\": " << num(r.params_total)
              << ", \"params_active\": " << num(r.params_active) << ", \"flops_per_step\": " << num(r.flops_per_step)
              << ", \"optimizer_flops\": " << num(r.optimizer_flops)
              << ", \"tflops_per_device\": " << num(r.tflops_per_device) << ", \"mfu\": " << num(r.mfu)
              << ", \"tie\": " << (r.tie ? "true" : "false");
        } else {
            o << ", \"fits\": null, \"stage\": null, \"memory_bytes\": null, \"comm_bytes\": null, \"comm_s\": null, "
                 "\"links\": null, \"bubble\": null, \"compute_s\": null, \"step_time_s\": null, \"tokens_per_s\": null, "
                 "\"global_batch\": null, \"params_total\": null, \"params_active\": null, \"flops_per_step\": null, \"optimizer_flops\": null, "
                 "\"tflops_per_device\": null, \"mfu\": null, \"tie\": null";
        }
        o << "}";
    }
    o << "\n]\n";
    return o.str();
}

double runtime_base_estimate() {
    static const double at_start = process_rss_bytes();
    return at_start;
}

}  // namespace quintet
