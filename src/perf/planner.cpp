// The planner: the trainer's memory and traffic, derived from the deck (docs/planner.md).
//
// Parameters, gradients and optimizer moments come from the same parameter table the trainer
// builds (model/params.cpp); activations and communication buffers from the same declarations
// of the layer modules, laid out the same way (model/buffers.hpp, chunk_buffers); the number of
// microbatches in flight per stage from simulating the schedule. So memory is the trainer's
// accounting exactly. Time is
// compute at a share of the measured sgemm rate, plus each axis's bytes over the link, plus
// the pipeline bubble.
#include "quintet/perf/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/model/config.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/transformer.hpp"
#include "quintet/parallel/context_parallel.hpp"
#include "quintet/parallel/expert_parallel.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/perf/host_peak.hpp"

namespace quintet {

namespace {

// Share of the sgemm rate a whole training step reaches on one rank (matmuls at the model's
// shapes, attention, element-wise kernels, the optimizer): measured on medium-sized models on
// this project's CPU hosts (docs/planner.md "Compute").
constexpr double kComputeEfficiency = 0.80;

struct Shape {
    double B, Tl, N, Nr, C;  // samples, local tokens per sample, rows, rows per tp rank (SP), width
    bool bf16, sp;
    Recompute recompute;
    int ep;
};

ShardPlan plan_for(const Deck& deck, int stage, int edp) {
    const auto& p = deck.parallel;
    ShardPlan sp;
    sp.tp = p.tp;
    sp.tp_rank = 0;
    sp.sequence_parallel = p.sequence_parallel;
    sp.pp = p.pp;
    sp.chunks = stage_chunks(deck.model.n_layers, p.pp, p.virtual_stages, stage, p.pp_layers,
                             schedule_placement(p.schedule));
    sp.ep = p.ep;
    sp.ep_rank = 0;
    sp.pad[int(Replicas::dense)] = p.dp * p.cp;
    sp.pad[int(Replicas::expert)] = edp;
    sp.zero = p.zero;
    return sp;
}

// The ZeRO-2/3 slices of a rank of `t` (their sizes are every rank's: rank 0 stands for all).
ZeroLayout zero_layout_for(const ParamTable& t, int dense_group, int expert_group) {
    const int size[kNumRegions] = {dense_group, expert_group, 1}, rank[kNumRegions] = {0, 0, 0};
    return zero_layout(t, size, rank);
}

struct StageFigures {
    MemoryBytes mem;
    double flops = 0;      // this stage's model FLOPs per microbatch and rank (fwd+bwd)
    double layers = 0, moe_layers = 0;
};

}  // namespace

PlanRow plan_layout(const Deck& deck_in, int world, const MachineModel& mm) {
    Deck deck = deck_in;
    auto& p = deck.parallel;
    PlanRow row;
    row.microbatches = p.microbatches, row.zero = p.zero, row.recompute = deck.train.recompute;
    if (p.dp == 0 && p.tp * p.cp * p.pp > 0 && world % (p.tp * p.cp * p.pp) == 0) p.dp = world / (p.tp * p.cp * p.pp);
    row.tp = p.tp, row.cp = p.cp, row.dp = p.dp, row.pp = p.pp, row.ep = p.ep;
    try {
        deck_validate(deck, world, /*check_host_memory=*/false);
    } catch (const ConfigError& e) {
        row.reason = e.what();
        return row;
    }
    row.valid = true;
    const ModelConfig& m = deck.model;
    const ModelDims d = model_dims(m, p.tp, 0);
    const int edp = p.dp * p.cp / p.ep;
    const bool moe = m.moe.experts > 0;
    Shape s;
    s.B = deck.data.micro_batch_size;
    s.Tl = double(deck.data.seq_len) / p.cp;
    s.N = s.B * s.Tl;
    s.sp = p.sequence_parallel && p.tp > 1;
    s.Nr = s.sp ? s.N / p.tp : s.N;
    s.C = m.d_model;
    s.bf16 = deck.train.precision == "bf16";
    s.recompute = deck.train.recompute == "full" ? Recompute::full
                  : deck.train.recompute == "selective" ? Recompute::selective : Recompute::none;
    s.ep = p.ep;
    const Simulation sim = simulate(p.schedule, p.pp, p.microbatches, p.virtual_stages);
    row.bubble = bubble_theory(p.schedule, p.pp, p.microbatches, p.virtual_stages);

    // FLOPs: the 6·N·P convention of the whole model (docs/math.md §1), split over the ranks that share
    // each token's work; each stage does its own layers' share.
    const ParamTable whole = make_param_table(m);
    const ModelDims d1 = model_dims(m, 1, 0);
    const double T = deck.data.seq_len;
    const double tokens_step = double(p.dp) * p.microbatches * deck.data.micro_batch_size * T;
    row.flops_per_step = model_flops_per_token(whole, d1, deck.data.seq_len) * tokens_step;
    const double head_params = double(m.vocab_size) * m.d_model;
    const double layer_params = (double(whole.matmul_params) - head_params) / m.n_layers;
    const double attn_flops_tok = 6.0 * T * d1.NH * double(d1.Dqk + d1.Dv);  // per layer

    const double threads = mm.threads_per_rank > 0 ? mm.threads_per_rank
                           : std::max(1.0, std::floor(double(mm.cores) / (mm.ranks_per_node > 0 ? mm.ranks_per_node : world)));
    const int per_node = mm.ranks_per_node > 0 ? std::min(mm.ranks_per_node, world) : world;
    // Ranks of a node share its cores: more threads than cores run at the cores' rate.
    const double busy = std::max(1.0, per_node * threads / mm.cores);
    const double rate = mm.matmul_gflops_per_core * 1e9 * threads / busy * kComputeEfficiency;

    double worst_total = -1, worst_compute = 0;
    for (int stage = 0; stage < p.pp; ++stage) {
        const ShardPlan sp = plan_for(deck, stage, edp);
        const ParamTable t = make_param_table(m, sp);
        MemoryBytes mem;
        mem.params = double(t.total) * 4 + (s.bf16 ? double(t.total) * 2 : 0);
        double state = 0, shards = 0;
        for (int r = 0; r < kNumRegions; ++r) {
            if (Replicas(r) == Replicas::none || t.region_used[r] == 0) continue;
            const double g = r == int(Replicas::expert) ? edp : p.dp * p.cp;
            const double shard = std::ceil(double(t.region_used[r]) / g);
            state += p.zero ? shard : double(t.region_used[r]);
            if (p.zero) shards += std::max(shard, 1.0);
        }
        mem.grads = double(t.total) * 4 + shards * 4;
        mem.optimizer = 2 * std::max(state, 1.0) * 4;
        if (p.zero >= 2) {  // this rank's slices of every unit, and the windows (train/zero_state)
            const ZeroLayout z = zero_layout_for(t, p.dp * p.cp, edp);
            mem.params = zero_param_bytes(t, z, p.zero, s.bf16);
            mem.grads = zero_grad_bytes(z);
            mem.optimizer = 2 * double(std::max<size_t>(z.trainable, 1)) * 4;
        }
        // Each chunk keeps as many slots as it had microbatches in flight at once (the executor
        // allocates them on demand): replay this stage's simulated compute order per chunk.
        std::vector<int> now(sp.chunks.size(), 0), peak(sp.chunks.size(), 0);
        for (const auto& [t0, t1, op, mbi, chunk] : sim.stages[size_t(stage)].slots) {
            const size_t c = size_t(chunk) < now.size() ? size_t(chunk) : 0;
            if (op == Op::forward) peak[c] = std::max(peak[c], ++now[c]);
            else if (op == Op::backward || op == Op::backward_weight) --now[c];  // W frees what F kept
        }
        // Activations: what the blocks declare, laid out as each chunk lays it out
        // (model/transformer.hpp chunk_buffers) -- the trainer's own accounting.
        BufferShape bs;
        bs.B = deck.data.micro_batch_size;
        bs.T = deck.data.seq_len / p.cp;
        bs.N = bs.B * bs.T;
        bs.Nr = s.sp ? bs.N / p.tp : bs.N;
        bs.bf16 = s.bf16, bs.sp = s.sp, bs.recompute = s.recompute;
        bs.cp = p.cp, bs.mla_latent = p.cp > 1 && p.cp_mla_kv == "latent", bs.ep = p.ep;
        bs.max_positions = deck.data.seq_len;
        bs.split_bw = schedule_splits_backward(p.schedule);
        double act_bytes = 0, stage_layers = 0, stage_moe = 0;
        size_t ring_kv = 0, ring_out = 0, ring_lse = 0, exchange = 0;
        bool last = false;
        for (size_t ci = 0; ci < sp.chunks.size(); ++ci) {
            const auto& c = sp.chunks[ci];
            const ChunkBuffers cb = chunk_buffers(m, d, c, bs, deck.data.document_mask);
            act_bytes += double(peak[ci]) * double(cb.slot_bytes()) + double(cb.workspace_bytes()) +
                         double(cb.shared_bytes());
            ring_kv = std::max(ring_kv, cb.ring_kv), ring_out = std::max(ring_out, cb.ring_out);
            ring_lse = std::max(ring_lse, cb.ring_lse), exchange = std::max(exchange, cb.exchange);
            stage_layers += c.layer_end - c.layer_begin;
            for (int l = c.layer_begin; l < c.layer_end; ++l) stage_moe += moe_layer(m, l) ? 1 : 0;
            last = last || c.last;
        }
        mem.activations = act_bytes;
        // Buffers: the pipeline's receive staging; the cp ring's K/V, dK/dV and partial outputs;
        // the ep exchange's staging (all reserved while the model is built, as declared).
        // (and zbv's turn of the V: the messages a stage sends itself, staged locally)
        const int locals = self_messages_in_flight(make_schedule(p.schedule, p.pp, stage, p.microbatches, p.virtual_stages),
                                                   p.pp, p.virtual_stages, stage, schedule_placement(p.schedule));
        mem.buffers = double(1 + locals) * double(bs.Nr) * s.C * sizeof(float);
        if (p.cp > 1) mem.buffers += double(ContextParallel::buffer_bytes(ring_kv, ring_out, ring_lse));
        if (p.ep > 1 && exchange > 0) mem.buffers += double(ExpertParallel::buffer_bytes(exchange));
        mem.runtime = mm.runtime_base_bytes + mm.data_bytes;
        mem.total = mem.params + mem.grads + mem.optimizer + mem.activations + mem.buffers + mem.runtime;
        // Compute of this stage, per microbatch: its layers' share and (last stage) the head,
        // over the tp x cp ranks sharing each token's work; recompute adds forwards.
        const double tok_mb = s.B * T;
        double fl = stage_layers * (6 * layer_params + attn_flops_tok) + (last ? 6 * head_params : 0);
        if (s.recompute == Recompute::full) fl += stage_layers * (2 * layer_params + attn_flops_tok / 3);
        if (s.recompute == Recompute::selective) fl += stage_layers * attn_flops_tok / 3;
        fl *= tok_mb / (p.tp * p.cp);
        const double compute = fl * p.microbatches / rate;
        if (mem.total > worst_total) {
            worst_total = mem.total;
            row.memory = mem;
            row.stage = stage;
        }
        worst_compute = std::max(worst_compute, compute);
    }
    row.compute_s = worst_compute;

    // Bytes one rank sends per step, by axis, with the trainer's conventions (ring collectives:
    // an all-reduce of S bytes over g ranks sends 2S(g-1)/g, a gather or a scatter S(g-1)/g).
    const double mb = p.microbatches, L_stage = double(m.n_layers) / p.pp;
    const double rowbytes = s.N * s.C * 4;  // one microbatch's activations of the full sequence
    const double g_tp = double(p.tp - 1) / p.tp;
    // Per layer: attention and FFN each gather their input and reduce their output, forward
    // and backward (without SP: one all-reduce each way, the same bytes); full recompute
    // repeats the forward's.
    const double tp_layer = 8 * rowbytes * g_tp * (s.bf16 && s.sp ? 0.75 : 1.0);
    row.comm_bytes.tp = p.tp > 1 ? mb * L_stage * tp_layer * (s.recompute == Recompute::full ? 1.5 : 1.0) : 0;
    // Gradients: dense over dp x cp, experts over edp (all-reduce; ZeRO-1: reduce-scatter plus the
    // parameters' all-gather, the same bytes). ZeRO-2/3 reduce-scatter every unit's gradient once
    // per microbatch; zero 2 all-gathers the updated parameters once per step, zero 3 gathers each
    // unit before its forward and each layer again before its backward (and before the W of a
    // split schedule under full recomputation), per microbatch -- an upper bound: a unit still in
    // a window is not gathered again.
    {
        const ShardPlan sp = plan_for(deck, row.stage, edp);
        const ParamTable t = make_param_table(m, sp);
        const double gd = p.dp * p.cp, ge = edp;
        double b = 0;
        if (p.zero >= 2) {
            const bool split_full = schedule_splits_backward(p.schedule) && s.recompute == Recompute::full;
            for (const auto& u : t.units) {
                const bool layer = u.name.rfind("layers.", 0) == 0;
                const double gathers = p.zero == 3 ? mb * (1 + (layer ? 1 : 0) + (layer && split_full ? 1 : 0)) : 1;
                for (int r = 0; r < kNumRegions; ++r) {
                    const double g = r == int(Replicas::dense) ? gd : r == int(Replicas::expert) ? ge : 1;
                    if (g <= 1) continue;
                    b += (mb + gathers) * double(u.part[r].size()) * 4 * (g - 1) / g;
                }
            }
        } else {
            if (gd > 1) b += 2 * double(t.region_used[int(Replicas::dense)]) * 4 * (gd - 1) / gd;
            if (ge > 1) b += 2 * double(t.region_used[int(Replicas::expert)]) * 4 * (ge - 1) / ge;
        }
        row.comm_bytes.dp = b;
    }
    // Context ring: forward sends this rank's K/V block cp-1 times; the backward sends K/V and
    // dK/dV around again.
    if (p.cp > 1) {
        const double kv = s.B * s.Tl * double(d.NKVl) * (d.Dqk + d.Dv) * 4;
        row.comm_bytes.cp = mb * L_stage * (p.cp - 1) * kv * 3;
    }
    // Experts: dispatch and combine, forward and backward, of the k rows per token that leave
    // the rank (a balanced router sends (ep-1)/ep of them).
    if (moe && p.ep > 1) {
        double moe_layers = 0;
        for (int l = 0; l < m.n_layers; ++l) moe_layers += moe_layer(m, l) ? 1 : 0;
        row.comm_bytes.ep = mb * moe_layers / p.pp * 4 * s.Nr * m.moe.top_k * s.C * 4 * (p.ep - 1) / p.ep;
    }
    // Pipeline: each microbatch's boundary activations forward and their gradient back.
    if (p.pp > 1) row.comm_bytes.pp = mb * 2 * s.Nr * s.C * 4 * (s.bf16 ? 1 : 1);

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
    row.step_time_s = busy_s + row.bubble_s + row.comm_s.dp;
    row.tokens_per_s = tokens_step / row.step_time_s;
    return row;
}

std::vector<PlanRow> plan_all(const Deck& deck, int world, const MachineModel& machine, const PlanSweep& sweep,
                              double device_memory_bytes) {
    std::vector<int> divs;
    for (int i = 1; i <= world; ++i)
        if (world % i == 0) divs.push_back(i);
    const std::vector<int> mbs = sweep.microbatches.empty() ? std::vector<int>{deck.parallel.microbatches} : sweep.microbatches;
    const std::vector<int> zeros = sweep.zero.empty() ? std::vector<int>{deck.parallel.zero} : sweep.zero;
    const std::vector<std::string> recs = sweep.recompute.empty() ? std::vector<std::string>{deck.train.recompute} : sweep.recompute;
    std::vector<PlanRow> rows;
    for (int tp : divs)
        for (int cp : divs)
            for (int pp : divs) {
                if (world % (tp * cp * pp) != 0) continue;
                const int dp = world / (tp * cp * pp);
                for (int ep : divs) {
                    if ((dp * cp) % ep != 0) continue;
                    if (ep > 1 && deck.model.moe.experts == 0) continue;  // no experts to split
                    for (int mb : mbs)
                        for (int z : zeros)
                            for (const auto& rc : recs) {
                                Deck d = deck;
                                d.parallel.tp = tp, d.parallel.cp = cp, d.parallel.pp = pp, d.parallel.dp = dp;
                                d.parallel.ep = ep, d.parallel.microbatches = mb, d.parallel.zero = z;
                                d.train.recompute = rc;
                                PlanRow r = plan_layout(d, world, machine);
                                if (r.valid && device_memory_bytes > 0) r.fits = r.memory.total <= device_memory_bytes;
                                rows.push_back(r);
                            }
                }
            }
    std::stable_sort(rows.begin(), rows.end(), [](const PlanRow& a, const PlanRow& b) {
        if (a.valid != b.valid) return a.valid;
        if (a.fits != b.fits) return a.fits;
        return a.tokens_per_s > b.tokens_per_s;
    });
    return rows;
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
}  // namespace

std::string plan_json(const std::vector<PlanRow>& rows) {
    std::ostringstream o;
    o << "[";
    for (size_t i = 0; i < rows.size(); ++i) {
        const PlanRow& r = rows[i];
        o << (i ? ",\n " : "\n ") << "{\"tp\": " << r.tp << ", \"cp\": " << r.cp << ", \"dp\": " << r.dp
          << ", \"pp\": " << r.pp << ", \"ep\": " << r.ep << ", \"microbatches\": " << r.microbatches
          << ", \"zero\": " << r.zero << ", \"recompute\": " << json_string(r.recompute)
          << ", \"valid\": " << (r.valid ? "true" : "false") << ", \"reason\": "
          << (r.valid ? "null" : json_string(r.reason));
        if (r.valid) {
            const MemoryBytes& m = r.memory;
            o << ", \"fits\": " << (r.fits ? "true" : "false") << ", \"stage\": " << r.stage
              << ", \"memory_bytes\": {\"params\": " << num(m.params) << ", \"grads\": " << num(m.grads)
              << ", \"optimizer\": " << num(m.optimizer) << ", \"activations\": " << num(m.activations)
              << ", \"buffers\": " << num(m.buffers) << ", \"runtime\": " << num(m.runtime)
              << ", \"total\": " << num(m.total) << "}, \"comm_bytes\": {\"tp\": " << num(r.comm_bytes.tp)
              << ", \"cp\": " << num(r.comm_bytes.cp) << ", \"dp\": " << num(r.comm_bytes.dp)
              << ", \"ep\": " << num(r.comm_bytes.ep) << ", \"pp\": " << num(r.comm_bytes.pp)
              << "}, \"bubble\": " << num(r.bubble) << ", \"step_time_s\": " << num(r.step_time_s)
              << ", \"tokens_per_s\": " << num(r.tokens_per_s);
        } else {
            o << ", \"fits\": null, \"stage\": null, \"memory_bytes\": null, \"comm_bytes\": null, \"bubble\": null, "
                 "\"step_time_s\": null, \"tokens_per_s\": null";
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
