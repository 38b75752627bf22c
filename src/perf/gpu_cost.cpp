// The GPU step-time model (docs/planner.md §7 derives each term; §8 validates it).
#include "quintet/perf/gpu_cost.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"

namespace quintet {

namespace {

// ---- constants (docs/planner.md §7 "Constants") ------------------------------------------------
// A GEMM's output is computed in tiles of 128 x 256, one tile per SM at a time: a grid that does
// not fill the last wave leaves SMs idle (assumed tile; the largest of CUTLASS's sm80/sm90 bf16
// kernels).
constexpr double kTileRows = 128, kTileCols = 256;
// The attention core (FlashAttention-style, fused) runs at GpuCalibration::attention_share of the
// dense peak (calibrated: docs/planner.md §8). Its backward does 2.5 times the forward's FLOPs
// (5 matmuls against 2: the scores are recomputed).
constexpr double kFlashBackwardRatio = 2.5;
// The attention kernels' own rate, which bounds how much of the cp ring hides behind them: the
// calibrated share also carries work that is not attention (docs/planner.md §8), so the ring's
// window is counted at what the kernels reach in isolation -- FlashAttention-2 50-73% of an
// A100's peak (arXiv 2307.08691), FlashAttention-3 up to 75% on an H100 where FlashAttention-2
// reached 35% (arXiv 2407.08608).
constexpr double kAttentionKernelShare = 0.50;
// Memory-bound kernels reach this share of the memory bandwidth (an assumption: stream-like
// kernels; not measured here).
constexpr double kMemoryFraction = 0.85;
// Collectives reach these shares of the line rate: NCCL's ring all-reduce bus bandwidth within a
// DGX is ~230 GB/s of NVLink 3's 300 (A100) and ~370 of NVLink 4's 450 (H100); a 400 Gb/s NIC
// carries 46-48 of its 50 GB/s (NVIDIA's answers in nccl-tests issues 149, 212, 290).
constexpr double kLinkFraction = 0.80;
constexpr double kNetworkFraction = 0.94;
// The fixed latency of one collective (NCCL's tuning model, ring/Simple: 8.4 us), plus a step
// latency (the hardware's) per hop.
constexpr double kCollectiveBaseS = 8.4e-6;

struct Link {
    std::string name;
    double bw = 0, lat = 0;  // a collective's bandwidth per rank (bytes/s), s per hop
    double nic = 0, nvlink = 0;  // one device's network and NVLink rates (all-to-all, point-to-point)
    int local = 1;           // the group's members per node
};

// A group's link. Across nodes, a collective's rings run over every NIC of the group's members
// on a node (NCCL spreads its channels over the NICs), so k members per node move k NICs' worth,
// up to what NVLink carries inside the node.
Link link_of(int stride, int size, const Hardware& hw) {
    Link l;
    l.name = group_link(stride, size, hw.devices_per_node);
    l.nvlink = hw.link_gbs * 1e9 * kLinkFraction;
    l.nic = hw.network_gbs * 1e9 * kNetworkFraction;
    if (l.name == "nvlink") {
        l.bw = l.nvlink, l.lat = hw.link_latency_us * 1e-6, l.local = size;
    } else {
        l.local = stride < hw.devices_per_node ? std::max(1, std::min(size, hw.devices_per_node / stride)) : 1;
        l.bw = std::min(l.local * l.nic, l.nvlink), l.lat = hw.network_latency_us * 1e-6;
    }
    return l;
}

// An all-to-all (the ep exchange): of the bytes a rank sends, the share for members on its own
// node goes over NVLink, the rest through its NIC.
double all_to_all_s(double bytes, int g, const Link& l) {
    if (g <= 1 || bytes <= 0) return 0;
    const double local = double(std::min(l.local, g) - 1) / (g - 1);
    return std::max(bytes * local / l.nvlink, bytes * (1 - local) / (l.name == "nvlink" ? l.nvlink : l.nic)) +
           kCollectiveBaseS + l.lat;
}

// One collective: `bytes` sent by a rank over the link, `hops` steps (a ring's g - 1 per phase,
// a tree's 2 log2 g: NCCL picks trees at scale).
double coll_s(double bytes, int g, const Link& l, int phases = 1) {
    if (g <= 1 || bytes <= 0) return 0;
    const double hops = std::min(double(g - 1) * phases, 2.0 * std::ceil(std::log2(double(g))));
    return bytes / l.bw + kCollectiveBaseS + hops * l.lat;
}

struct Rates {
    double peak, bw, eb;  // FLOP/s, bytes/s of memory, bytes of an element
    const Hardware* hw;
    double gemm_share;       // GpuCalibration::gemm_share_of_best
    double attention_share;  // GpuCalibration::attention_share
};

Rates rates_of(const Hardware& hw, bool bf16, const GpuCalibration& cal) {
    return Rates{hw.peak_tflops(bf16) * 1e12, hw.memory_gbs * 1e9 * kMemoryFraction, bf16 ? 2.0 : 4.0, &hw,
                 cal.gemm_share_of_best, cal.attention_share};
}

double gemm_s(double M, double N, double K, const Rates& r) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    double eta = r.hw->matmul_fraction * r.gemm_share;
    if (r.hw->sms > 0) {
        const double tiles = std::ceil(M / kTileRows) * std::ceil(N / kTileCols);
        const double waves = std::ceil(tiles / r.hw->sms);
        eta *= tiles / (waves * r.hw->sms);
    }
    const double compute = 2 * M * N * K / (r.peak * eta);
    const double memory = r.eb * (M * K + K * N + M * N) / r.bw;
    return std::max(compute, memory);
}

// A weight's three products over `rows` rows: forward (rows x out x in), input gradient
// (rows x in x out), weight gradient (out x in x rows), as M, N, K.
struct Product {
    double M, N, K;
};
std::array<Product, 3> products_of(double rows, double out, double in) {
    return {{{rows, out, in}, {rows, in, out}, {out, in, rows}}};
}
double product_s(const Product& p, const Rates& r) { return gemm_s(p.M, p.N, p.K, r); }

// One layer's work per microbatch on this rank.
struct LayerWork {
    double gemm_fwd = 0, gemm_bwd = 0, attn_fwd = 0, attn_bwd = 0, elem_fwd = 0, elem_bwd = 0;
    double attn_kernels = 0;   // fwd + bwd at the kernels' own rate: the cp ring's window
    double shared_expert = 0;  // fwd + bwd GEMM time of the shared experts (the ep exchange hides behind it)
    double fwd() const { return gemm_fwd + attn_fwd + elem_fwd; }
    double bwd() const { return gemm_bwd + attn_bwd + elem_bwd; }
};

LayerWork layer_work(const GpuLayout& l, const LayerKind& kind, bool moe, const Rates& r,
                     const FrameworkModel& fw) {
    const ModelConfig& m = *l.model;
    const ModelDims d = model_dims(m, l.tp, 0);
    const double N = double(l.B) * l.T / l.cp, Nr = l.sp ? N / l.tp : N, Tq = double(l.T) / l.cp;
    const double E = std::max(1, m.moe.experts), k = m.moe.top_k;
    const double expert_rows = Nr * k * l.ep / E;  // one local expert's share of the rows (balanced router)
    LayerWork w;
    for (const Gemm& g : kind.gemms) {
        const double M = g.rows == GemmRows::gathered ? N : g.rows == GemmRows::own ? Nr : expert_rows;
        const auto p = products_of(M, g.out, g.in);
        const double f = g.count * product_s(p[0], r), b = g.count * (product_s(p[1], r) + product_s(p[2], r));
        w.gemm_fwd += f, w.gemm_bwd += b;
        if (g.name.find("shared_experts") != std::string::npos) w.shared_expert += f + b;
    }
    // Attention core.
    const double heads = d.NHl, dqk = d.Dqk, dv = d.Dv;
    if (!fw.unfused_attention) {
        const double flops = 2 * l.B * Tq * (double(l.T) / 2) * heads * (dqk + dv);  // causal: half the pairs
        w.attn_fwd = flops / (r.peak * r.attention_share);
        w.attn_bwd = kFlashBackwardRatio * w.attn_fwd;
        w.attn_kernels = std::min(1.0, r.attention_share / kAttentionKernelShare) * (w.attn_fwd + w.attn_bwd);
    } else {
        // Batched GEMMs over the whole s x s score matrix (masked, not skipped) and a softmax
        // that reads and writes it: forward 2 passes over the scores, backward 3.
        const double scores = l.B * heads * Tq * l.T;
        const double g1 = gemm_s(Tq, l.T, dqk, r) * l.B * heads, g2 = gemm_s(Tq, dv, l.T, r) * l.B * heads;
        w.attn_fwd = g1 + g2 + 2 * r.eb * scores / r.bw;
        w.attn_bwd = 2 * (g1 + g2) + 3 * r.eb * scores / r.bw;
        w.attn_kernels = w.attn_fwd + w.attn_bwd;
    }
    // Element-wise work (values read and written): the two norms and residual adds on this
    // rank's rows, RoPE on q and k, the SwiGLU product; the backward about twice that.
    const double C = d.C, qk = (d.NHl + d.NKVl) * dqk;
    double fwd = 10 * Nr * C + 2 * N * qk, bwd = 12 * Nr * C + 2 * N * qk;
    if (!moe) {
        fwd += 3 * N * d.Fl, bwd += 5 * N * d.Fl;
    } else {
        const double Fe = m.expert_ffn_width(), Fs = double(m.moe.shared_experts) * Fe;
        // Routing (softmax over E), the dispatch and combine copies, the experts' and shared
        // experts' SwiGLU products, on this rank's own rows.
        fwd += Nr * (2 * E + 4 * k * C + 3 * k * Fe + 3 * Fs);
        bwd += Nr * (2 * E + 4 * k * C + 5 * k * Fe + 5 * Fs);
    }
    w.elem_fwd = fwd * r.eb / r.bw, w.elem_bwd = bwd * r.eb / r.bw;
    return w;
}

}  // namespace

double gpu_gemm_seconds(double M, double N, double K, const Hardware& hw, bool bf16, const GpuCalibration& cal) {
    return gemm_s(M, N, K, rates_of(hw, bf16, cal));
}

std::vector<PlannedGemm> planned_layer_gemms(const ModelConfig& m, int tp, double rows, const Hardware& hw, bool bf16,
                                             const GpuCalibration& cal) {
    const ModelInventory inv(m, tp, 1, tp > 1);
    std::vector<Gemm> gemms = inv.dense().gemms;
    gemms.push_back(inv.head());
    const Rates r = rates_of(hw, bf16, cal);
    const char* passes[3] = {"fwd", "dgrad", "wgrad"};
    std::vector<PlannedGemm> out;
    for (size_t i = 0; i < gemms.size(); ++i) {
        const Gemm& g = gemms[i];
        const auto products = products_of(rows, g.out, g.in);
        for (int p = 0; p < 3; ++p) {
            PlannedGemm pg;
            pg.name = g.name, pg.pass = passes[p], pg.count = g.count, pg.head = i + 1 == gemms.size();
            pg.M = products[size_t(p)].M, pg.N = products[size_t(p)].N, pg.K = products[size_t(p)].K;
            pg.planned_s = g.count * product_s(products[size_t(p)], r);
            out.push_back(pg);
        }
    }
    return out;
}

const char* plan_axis_name(int axis) {
    static const char* names[kNumPlanAxes] = {"tp", "cp", "dp", "ep", "pp"};
    return axis >= 0 && axis < kNumPlanAxes ? names[axis] : "?";
}

FrameworkModel parse_overlap(const std::string& list, FrameworkModel fw) {
    fw.overlap.fill(false);
    fw.overlap_given = true;
    if (list == "none") return fw;
    const auto items = split_list(list, ',');
    if (items.empty()) throw ConfigError("plan: --overlap = '" + list + "': expected none or a comma list of tp, cp, dp, ep, pp");
    for (const auto& it : items) {
        int a = 0;
        while (a < kNumPlanAxes && it != plan_axis_name(a)) ++a;
        if (a == kNumPlanAxes)
            throw ConfigError("plan: --overlap = '" + list + "': '" + it + "' is not an axis (valid: none, or a comma list of "
                              "tp, cp, dp, ep, pp)");
        fw.overlap[size_t(a)] = true;
    }
    return fw;
}

std::string group_link(int stride, int size, int devices_per_node) {
    if (size <= 1) return "none";
    const double span = double(stride) * size;
    return span <= devices_per_node && devices_per_node % int(span) == 0 ? "nvlink" : "network";
}

GpuStepTime gpu_step_time(const GpuLayout& l, const Hardware& hw, const FrameworkModel& fw, const GpuCalibration& cal) {
    const ModelConfig& m = *l.model;
    const ModelDims d = model_dims(m, l.tp, 0);
    const Rates r = rates_of(hw, l.bf16, cal);
    GpuStepTime out;
    const double N = double(l.B) * l.T / l.cp, Nr = l.sp ? N / l.tp : N, Tq = double(l.T) / l.cp, C = d.C;
    const double mb = l.microbatches, k = m.moe.top_k;
    const bool full = l.recompute == Recompute::full, selective = l.recompute == Recompute::selective;

    // The links: rank = tp + TP (cp + CP (dp + DP pp)); ep groups are ep consecutive dp x cp
    // positions, edp groups the positions ep apart (parallel/layout.hpp).
    const Link ltp = link_of(1, l.tp, hw), lcp = link_of(l.tp, l.cp, hw), ldp = link_of(l.tp, l.dp * l.cp, hw),
               lep = link_of(l.tp, l.ep, hw), ledp = link_of(l.tp * l.ep, l.dp * l.cp / l.ep, hw),
               lpp = link_of(l.tp * l.cp * l.dp, l.pp, hw);
    out.link = {ltp.name, lcp.name, ldp.name, lep.name, lpp.name};
    if (l.dp * l.cp / l.ep > 1 && ledp.name == "network") out.link[kAxisDp] = "network";

    const LayerWork dense = layer_work(l, l.inv->dense(), false, r, fw), moe = layer_work(l, l.inv->moe(), true, r, fw);
    // Per layer and microbatch: tp collectives (attention and a dense FFN each gather their
    // input and reduce their output, forward and backward; a MoE FFN routes its own rows).
    const double tp_bytes_one = l.tp > 1 ? N * C * r.eb * (l.tp - 1) / l.tp : 0;
    auto tp_of = [&](bool is_moe, double* bytes) {
        const int per_pass = is_moe ? 2 : 4;
        const int passes = 2 + (full ? 1 : 0);
        *bytes = tp_bytes_one * per_pass * passes;
        return coll_s(tp_bytes_one, l.tp, ltp) * per_pass * passes;
    };
    // cp ring: K|V blocks cp - 1 times forward, K|V and dK|dV backward (MLA under
    // parallel.cp_mla_kv = latent all-gathers the latent instead).
    double kv_width;
    if (m.attention == "mla") {
        kv_width = d.NHl * double(d.Dqk + d.Dv);
    } else {
        kv_width = d.NKVl * double(d.Dqk + d.Dv);
    }
    const double cp_block = l.cp > 1 ? double(l.B) * Tq * kv_width * r.eb : 0;
    const double cp_passes = 3 + (full || selective ? 1 : 0);
    // ep exchange: dispatch and combine, forward and backward, of the (ep - 1)/ep of the k rows
    // per token that leave the rank.
    const double ep_bytes_layer = l.ep > 1 ? (4 + (full ? 2 : 0)) * Nr * k * C * r.eb * (l.ep - 1) / l.ep : 0;

    double busiest = -1;
    std::array<double, kNumPlanAxes> bytes{}, exposed{};
    double t_mb_busiest = 0, opt_s = 0;
    for (size_t s = 0; s < l.stages.size(); ++s) {
        const auto& st = l.stages[s];
        double t = 0, tpb = 0, cpb = 0, epb = 0, tp_t = 0, cp_t = 0, ep_t = 0;
        for (int kind = 0; kind < 2; ++kind) {
            const int n = kind ? st.moe_layers : st.dense_layers;
            if (n == 0) continue;
            const LayerWork& w = kind ? moe : dense;
            double b = 0;
            const double tpl = tp_of(kind == 1, &b);
            const double compute = w.fwd() * (full ? 2 : 1) + w.bwd() + (selective ? w.attn_fwd : 0);
            // Overlapped (Megatron-Core's --tp-comm-overlap, inside a node): assumed cut into tp
            // chunks pipelined with the GEMMs, one chunk in tp exposed, the rest hidden up to the
            // layer's GEMM time (all of its GEMMs pooled); a tp group across nodes stays exposed.
            const double tp_exp = fw.overlap[kAxisTp] && ltp.name == "nvlink"
                                      ? std::max(tpl / l.tp, tpl - (w.gemm_fwd * (full ? 2 : 1) + w.gemm_bwd))
                                      : tpl;
            const double cpl = l.cp > 1 ? coll_s(cp_block, l.cp, lcp, 1) * (l.cp - 1) * cp_passes : 0;
            const double cp_exp = fw.overlap[kAxisCp] ? std::max(0.0, cpl - w.attn_kernels) : cpl;
            double epl = 0, ep_exp = 0;
            if (kind == 1 && l.ep > 1) {
                epl = all_to_all_s(ep_bytes_layer, l.ep, lep);
                ep_exp = fw.overlap[kAxisEp] ? std::max(0.0, epl - w.shared_expert) : epl;
            }
            t += n * (compute + tp_exp + cp_exp + ep_exp);
            tpb += n * b, cpb += n * cp_block * (l.cp - 1) * cp_passes, epb += n * (kind == 1 ? ep_bytes_layer : 0);
            tp_t += n * tp_exp, cp_t += n * cp_exp, ep_t += n * ep_exp;
        }
        if (st.last) {
            // The LM head and the loss (reads the logits and writes their gradient in fp32).
            const Gemm& h = l.inv->head();
            const auto p = products_of(N, h.out, h.in);
            t += product_s(p[0], r) * (full ? 2 : 1) + product_s(p[1], r) + product_s(p[2], r);
            t += 3 * 4 * N * h.out / r.bw;
        }
        if (st.first) t += 2 * N * C * r.eb / r.bw;  // the embedding's lookup and its gradient
        // Pipeline: this stage's boundary activations forward and their gradient back.
        double pp_t = 0, ppb = 0;
        if (l.pp > 1) {
            ppb = 2 * Nr * C * r.eb * l.v;
            const double p2p = lpp.name == "nvlink" ? lpp.nvlink : lpp.nic;  // one device's link
            pp_t = fw.overlap[kAxisPp] ? 0 : 2 * l.v * (Nr * C * r.eb / p2p + kCollectiveBaseS + lpp.lat);
        }
        const double stage_t = mb * (t + pp_t);
        // The optimizer once per step: AdamW reads gradient, master and moments and writes them
        // back (28 bytes a parameter, 30 with the bf16 copy), over its shard under ZeRO-1; the
        // gradient norm reads every gradient and the next step's accumulation zeroes them (8).
        const double Pd = st.params.r[0], Pe = st.params.r[1];
        const double shard = l.zero ? Pd / (l.dp * l.cp) + Pe / (l.dp * l.cp / l.ep) : Pd + Pe;
        const double o = (shard * (l.bf16 ? 30 : 28) + (Pd + Pe) * 8) / r.bw;
        opt_s = std::max(opt_s, o);
        if (stage_t > busiest) {
            busiest = stage_t;
            out.busiest_stage = int(s);
            t_mb_busiest = t + pp_t;
            bytes[kAxisTp] = mb * tpb, bytes[kAxisCp] = mb * cpb, bytes[kAxisEp] = mb * epb, bytes[kAxisPp] = mb * ppb;
            exposed[kAxisTp] = mb * tp_t, exposed[kAxisCp] = mb * cp_t, exposed[kAxisEp] = mb * ep_t,
            exposed[kAxisPp] = mb * pp_t;
            out.compute_s = mb * (t - tp_t - cp_t - ep_t);
        }
    }
    // Gradients: dense tensors over dp x cp, experts over edp; all-reduce, or under ZeRO-1 a
    // reduce-scatter of the fp32 gradients and an all-gather of the updated weights.
    {
        const auto& st = l.stages[size_t(out.busiest_stage)];
        const double gd = double(l.dp) * l.cp, ge = gd / l.ep;
        double dp_t = 0, dp_b = 0;
        const double bucket = std::max(1.0, l.bucket_mb * 1048576.0);
        for (int reg = 0; reg < 2; ++reg) {
            const double P = st.params.r[size_t(reg)], g = reg ? ge : gd;
            if (P <= 0 || g <= 1) continue;
            const Link& lk = reg ? ledp : ldp;
            // ZeRO-2: the fp32 gradients reduce-scattered once per microbatch, the weights gathered
            // once; ZeRO-3: the weights gathered for every forward and backward too.
            const double b = l.zero >= 2 ? P * (4 * mb + r.eb * (l.zero == 3 ? 2 * mb : 1)) * (g - 1) / g
                             : l.zero    ? P * (4 + r.eb) * (g - 1) / g
                                         : 2 * P * 4 * (g - 1) / g;
            const double buckets = std::ceil(P * 4 / bucket);
            dp_b += b;
            dp_t += b / lk.bw + buckets * (kCollectiveBaseS + std::min(2.0 * (g - 1), 2.0 * std::ceil(std::log2(g))) * lk.lat);
        }
        bytes[kAxisDp] = dp_b;
        // Overlapped: the reductions run during the last microbatch's backward (and ZeRO-1's
        // gathers during the first one's forward); the last bucket stays exposed.
        const bool overlapped = fw.overlap[kAxisDp] && (fw.overlap_given || (l.overlap_dp && l.zero == 0) || l.zero >= 2);
        if (overlapped && dp_t > 0) {
            const double grads = (st.params.r[0] + st.params.r[1]) * 4;
            const double last_bucket = std::min(1.0, bucket / std::max(grads, 1.0));
            exposed[kAxisDp] = std::max(dp_t - t_mb_busiest, dp_t * last_bucket);
        } else {
            exposed[kAxisDp] = dp_t;
        }
    }
    out.comm_bytes = bytes;
    out.comm_s = exposed;
    out.bubble = bubble_theory(l.schedule, l.pp, l.microbatches, l.v);
    out.bubble_s = out.bubble < 1 ? busiest * out.bubble / (1 - out.bubble) : 0;
    out.optimizer_s = opt_s;
    out.step_s = busiest + out.bubble_s + exposed[kAxisDp] + opt_s;
    return out;
}

}  // namespace quintet
