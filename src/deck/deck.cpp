#include "quintet/deck/deck.hpp"

#include <boost/program_options.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <unistd.h>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"

namespace po = boost::program_options;

namespace quintet {

namespace {

std::string fmt_double(double v) {
    std::ostringstream s;
    s.precision(10);
    s << v;
    return s.str();
}

// --- typed binders: parse text, check range, name key/value/valid on failure ---------------

DeckOption opt_int(const std::string& key, int* field, long lo, long hi, std::string help) {
    std::string valid = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return {key, help + " (" + valid + ")",
            [=](const std::string& v) {
                size_t pos = 0;
                long x = 0;
                try { x = std::stol(v, &pos); } catch (...) { pos = 0; }
                if (pos == 0 || pos != v.size() || x < lo || x > hi) config_fail(key, v, "expected " + valid);
                *field = int(x);
            },
            [=] { return std::to_string(*field); }};
}

DeckOption opt_i64(const std::string& key, int64_t* field, std::string help) {
    return {key, help,
            [=](const std::string& v) {
                size_t pos = 0;
                long long x = 0;
                try { x = std::stoll(v, &pos); } catch (...) { pos = 0; }
                if (pos == 0 || pos != v.size() || x < 0) config_fail(key, v, "expected a non-negative integer");
                *field = x;
            },
            [=] { return std::to_string(*field); }};
}

DeckOption opt_double(const std::string& key, double* field, double lo, double hi, std::string help,
                      bool lo_open = false, bool hi_open = false) {
    std::string valid = std::string("a number in ") + (lo_open ? "(" : "[") + fmt_double(lo) + ", " +
                        fmt_double(hi) + (hi_open ? ")" : "]");
    return {key, help + " (" + valid + ")",
            [=](const std::string& v) {
                size_t pos = 0;
                double x = 0;
                try { x = std::stod(v, &pos); } catch (...) { pos = 0; }
                if (pos == 0 || pos != v.size() || !std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo) ||
                    (hi_open && x == hi))
                    config_fail(key, v, "expected " + valid);
                *field = x;
            },
            [=] { return fmt_double(*field); }};
}

DeckOption opt_bool(const std::string& key, bool* field, std::string help) {
    return {key, help + " (true | false)",
            [=](const std::string& v) {
                if (v == "true" || v == "1" || v == "yes" || v == "on") *field = true;
                else if (v == "false" || v == "0" || v == "no" || v == "off") *field = false;
                else config_fail(key, v, "expected true or false");
            },
            [=] { return std::string(*field ? "true" : "false"); }};
}

DeckOption opt_enum(const std::string& key, std::string* field, std::vector<std::string> choices,
                    std::string help) {
    std::string valid;
    for (auto& c : choices) valid += (valid.empty() ? "" : " | ") + c;
    return {key, help + " (" + valid + ")",
            [=](const std::string& v) {
                for (auto& c : choices)
                    if (v == c) { *field = v; return; }
                config_fail(key, v, "expected one of " + valid);
            },
            [=] { return *field; }};
}

// A set of layers: "all" or indices with ranges ("0,3-60"); indices checked in deck_validate.
DeckOption opt_layers(const std::string& key, LayerSet* field, std::string help) {
    return {key, help + " (all, or a comma list of indices with ranges: 0,3-60)",
            [=](const std::string& v) {
                if (!field->parse(v)) config_fail(key, v, "expected all, or a comma list of layer indices with ranges, e.g. 0,3-60");
            },
            [=] { return field->text(); }};
}

// Positive integers in a comma list (empty = none given).
DeckOption opt_counts(const std::string& key, std::vector<int>* field, std::string help) {
    return {key, help,
            [=](const std::string& v) {
                if (v.empty()) {
                    field->clear();
                    return;
                }
                const auto list = parse_int_list(v, /*ranges=*/true);
                if (!list || std::any_of(list->begin(), list->end(), [](int c) { return c < 1; }))
                    config_fail(key, v, "expected a comma list of positive layer counts with ranges, e.g. 3,5 or 7,8-8,7");
                *field = *list;
            },
            [=] {
                std::string s;
                for (int c : *field) s += (s.empty() ? "" : ",") + std::to_string(c);
                return s;
            }};
}

// A range of steps "A-B" (or one step "A"), 1 <= A <= B; empty = none (0-0). The run's end is
// checked in deck_validate.
DeckOption opt_steps(const std::string& key, int* from, int* to, std::string help) {
    return {key, help + " (A-B with 1 <= A <= B, one step A, or empty for none)",
            [=](const std::string& v) {
                if (v.empty()) {
                    *from = *to = 0;
                    return;
                }
                long a = 0, b = 0;
                char dash = 0, extra = 0;
                const int n = std::sscanf(v.c_str(), "%ld%c%ld%c", &a, &dash, &b, &extra);
                if (n == 1) b = a;
                if (!(n == 1 || (n == 3 && dash == '-')) || a < 1 || b < a || b > (1L << 30) ||
                    v.find_first_not_of("0123456789-") != std::string::npos)
                    config_fail(key, v, "expected a range of steps A-B with 1 <= A <= B (e.g. 10-12), one step, or "
                                        "empty for none");
                *from = int(a), *to = int(b);
            },
            [=] {
                return *from == 0 ? std::string() : *from == *to ? std::to_string(*from)
                                                                 : std::to_string(*from) + "-" + std::to_string(*to);
            }};
}

DeckOption opt_string(const std::string& key, std::string* field, std::string help) {
    return {key, help, [=](const std::string& v) { *field = v; }, [=] { return *field; }};
}

// A parameter group's multiplier groups.<name>_lr (lr) or groups.<name>_wd: "auto" (the scheme's,
// stored as -1) or a number >= 0.
DeckOption opt_group(GroupOverrides& g, ParamGroup group, bool lr, const std::string& what) {
    double* field = lr ? &g.lr[size_t(group)] : &g.wd[size_t(group)];
    const std::string key = std::string("groups.") + group_name(group) + (lr ? "_lr" : "_wd");
    return {key,
            std::string(lr ? "learning-rate" : "weight-decay") + " multiplier of " + what +
                " (auto = init.scheme's, or a number >= 0)",
            [=](const std::string& v) {
                if (v == "auto") {
                    *field = -1;
                    return;
                }
                size_t pos = 0;
                double x = -1;
                try { x = std::stod(v, &pos); } catch (...) { pos = 0; }
                if (pos == 0 || pos != v.size() || !std::isfinite(x) || x < 0)
                    config_fail(key, v, "expected auto or a number >= 0");
                *field = x;
            },
            [=] { return *field < 0 ? std::string("auto") : fmt_double(*field); }};
}

std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

}  // namespace

std::vector<DeckOption> deck_options(Deck& d) {
    auto& m = d.model; auto& r = d.rope; auto& e = d.model.moe; auto& p = d.parallel; auto& da = d.data;
    auto& t = d.train; auto& in = d.init; auto& ev = d.eval; auto& c = d.checkpoint; auto& o = d.output;
    const long big = 1L << 30;
    return {
        opt_int("model.d_model", &m.d_model, 1, big, "width of the residual stream C"),
        opt_int("model.n_layers", &m.n_layers, 1, 4096, "decoder layers L"),
        opt_int("model.n_heads", &m.n_heads, 1, 65536, "query heads NH (d_model must be divisible by it)"),
        opt_int("model.n_kv_heads", &m.n_kv_heads, 0, 65536, "key/value heads NKV for GQA; 0 = n_heads"),
        opt_int("model.ffn_dim", &m.ffn_dim, 0, big, "SwiGLU hidden width; 0 = 8/3*d_model rounded up to 64"),
        opt_double("model.norm_eps", &m.norm_eps, 0, 1, "RMSNorm epsilon", true),
        opt_int("model.vocab_size", &m.vocab_size, 0, big,
                "vocabulary size V; 0 = the token file's (data.path); when set it must equal the token file's "
                "(`quintet plan` needs no token file when it is set)"),
        opt_bool("model.tie_embeddings", &m.tie_embeddings, "LM head shares the token embedding"),
        opt_enum("model.attention", &m.attention, {"mha", "mla"}, "attention kind: mha = grouped-query attention, mla = DeepSeek-V2 Multi-head Latent Attention"),
        opt_int("model.kv_lora_rank", &m.kv_lora_rank, 0, big, "MLA: rank of the compressed KV latent c_kv (> 0 with mla)"),
        opt_int("model.q_lora_rank", &m.q_lora_rank, 0, big, "MLA: rank of the compressed query; 0 = none"),
        opt_int("model.qk_nope_dim", &m.qk_nope_dim, 0, big, "MLA: per-head q/k dims without RoPE (> 0 with mla)"),
        opt_int("model.qk_rope_dim", &m.qk_rope_dim, 0, big, "MLA: per-head q/k dims with RoPE, one k_rope shared by the heads (even, > 0 with mla)"),
        opt_int("model.v_head_dim", &m.v_head_dim, 0, big, "MLA: per-head value dims (> 0 with mla)"),
        opt_int("model.mtp_depth", &m.mtp_depth, 0, 64,
                "multi-token prediction modules after the last decoder layer (DeepSeek-V3's MTP, HF "
                "num_nextn_predict_layers): module k predicts the token k+1 ahead; 0 = none"),
        opt_double("rope.theta", &r.theta, 1, 1e12, "RoPE base", true),
        opt_enum("rope.scaling", &r.scaling, {"none", "yarn"}, "RoPE frequency scaling"),
        opt_double("rope.factor", &r.factor, 1, 1e6, "YaRN context extension factor s"),
        opt_int("rope.original_max_position", &r.original_max_position, 0, big,
                "YaRN: context length L the model was trained at; 0 = the trained context of the "
                "checkpoint the weights come from (init_from, resume), or data.seq_len from scratch"),
        opt_double("rope.beta_fast", &r.beta_fast, 0, 1e6, "YaRN: rotations above which a dim is left alone", true),
        opt_double("rope.beta_slow", &r.beta_slow, 0, 1e6, "YaRN: rotations below which a dim is fully interpolated", true),
        opt_double("rope.mscale", &r.mscale, 0, 1e3,
                   "YaRN attention temperature as DeepSeek defines it, with m(c) = 0.1 c ln(factor) + 1: cos and sin "
                   "times m(rope.mscale) / m(rope.mscale_all_dim) (HF rope_scaling.mscale)"),
        opt_double("rope.mscale_all_dim", &r.mscale_all_dim, 0, 1e3,
                   "YaRN: the attention softmax scale times m(rope.mscale_all_dim)^2 (HF rope_scaling.mscale_all_dim; "
                   "with model.attention = mha it cancels: the logits are times m(rope.mscale)^2)"),
        opt_bool("rope.document_positions", &r.document_positions,
                 "RoPE positions restart at each document of a packed sample (documents end at data.eos_id)"),
        opt_int("moe.experts", &e.experts, 0, 1 << 20, "routed experts E; 0 = dense FFN"),
        opt_int("moe.top_k", &e.top_k, 1, 1 << 20, "experts chosen per token"),
        opt_int("moe.shared_experts", &e.shared_experts, 0, 1 << 20, "always-on shared experts"),
        opt_int("moe.ffn_dim", &e.ffn_dim, 0, big, "hidden width of each expert; 0 = model.ffn_dim"),
        opt_layers("moe.layers", &e.layers, "layers with MoE"),
        opt_bool("moe.norm_topk", &e.norm_topk, "renormalise the chosen weights to sum 1 (HF norm_topk_prob)"),
        opt_enum("moe.scoring", &e.scoring, {"softmax", "sigmoid"},
                 "router scores: softmax over the experts (DeepSeek-V2) or a sigmoid per expert (DeepSeek-V3) "
                 "(HF scoring_func)"),
        opt_enum("moe.topk_method", &e.topk_method, {"greedy", "group_limited_greedy", "noaux_tc"},
                 "top-k: greedy over all experts; or first the moe.group_top_k of moe.groups expert groups, ranked "
                 "by their best score (group_limited_greedy, DeepSeek-V2) or by the sum of their two best biased "
                 "scores (noaux_tc, DeepSeek-V3) (HF topk_method)"),
        opt_int("moe.groups", &e.groups, 1, 64, "expert groups of the group-limited top-k; divides moe.experts (HF n_group)"),
        opt_int("moe.group_top_k", &e.group_top_k, 1, 64,
                "groups a token's experts may come from (HF topk_group)"),
        opt_double("moe.routed_scaling", &e.routed_scaling, 0, 1e6,
                   "the routed experts' weights are multiplied by this (HF routed_scaling_factor)", true),
        opt_enum("moe.balance", &e.balance, {"aux_loss", "aux_free", "none"}, "load balancing"),
        opt_double("moe.aux_coef", &e.aux_coef, 0, 1e3, "weight of the load-balancing loss"),
        opt_double("moe.bias_rate", &e.bias_rate, 0, 1e3, "aux-free bias update rate"),
        opt_enum("moe.bias_update", &e.bias_update, {"sign", "proportional"},
                 "aux-free bias rule: sign = bias_rate * sign(mean load - load) (DeepSeek-V3); "
                 "proportional = bias_rate * (mean load - load) / mean load"),
        opt_double("moe.capacity_factor", &e.capacity_factor, 0, 1e6,
                   "0 = dropless; > 0: each expert takes at most ceil(cf*k*N/E) of a rank's N rows, the "
                   "lowest-weight choices beyond are dropped and counted"),
        opt_int("moe.dead_after", &e.dead_after, 1, 1 << 30,
                "an expert with no tokens for this many steps counts in /moe/dead_experts"),
        opt_int("parallel.tp", &p.tp, 1, 1 << 20, "tensor-parallel ranks (Megatron-style column/row split)"),
        opt_int("parallel.pp", &p.pp, 1, 1 << 20, "pipeline stages"),
        opt_int("parallel.cp", &p.cp, 1, 1 << 20, "context-parallel ranks: each sample's sequence in 2*cp chunks, ring attention"),
        opt_int("parallel.ep", &p.ep, 1, 1 << 20, "expert-parallel ranks, carved from dp x cp; divides moe.experts"),
        opt_int("parallel.dp", &p.dp, 0, 1 << 20, "data-parallel replicas; 0 = world / (tp*pp*cp)"),
        opt_int("parallel.microbatches", &p.microbatches, 1, 1 << 20, "microbatches per DP replica per step"),
        opt_int("parallel.zero", &p.zero, 0, 3,
                "shard over each replica group (dp x cp for dense tensors, the expert-data-parallel group for experts): "
                "1 = the AdamW state (ZeRO-1); 2 = and the gradients, reduce-scattered unit by unit during the backward; "
                "3 = and the parameters, each layer gathered before its forward and its backward"),
        opt_bool("parallel.sequence_parallel", &p.sequence_parallel, "shard norm/residual activations over tp (reduce-scatter + all-gather)"),
        opt_enum("parallel.schedule", &p.schedule, {"1f1b", "interleaved", "gpipe", "zb_h1", "zbv"},
                 "pipeline schedule; zb_h1 and zbv split each backward into its input and weight parts and "
                 "fill the bubble with the latter (zbv: parallel.virtual_stages = 2, in a V)"),
        opt_int("parallel.virtual_stages", &p.virtual_stages, 1, 1 << 20,
                "layer chunks per stage (interleaved; zbv needs 2, which is then the default)"),
        opt_counts("parallel.pp_layers", &p.pp_layers,
                   "layers per stage as a comma list; a range a-b stands for a, a+1, ..., b (the syntax of moe.layers); "
                   "empty = even split"),
        opt_double("parallel.bucket_mb", &p.bucket_mb, 0, 1e6, "DP gradient bucket size in MiB", true),
        opt_enum("parallel.cp_mla_kv", &p.cp_mla_kv, {"ring", "latent"},
                 "MLA under cp: ring = per-head K/V round the ring; latent = all-gather the compressed "
                 "latent (c_kv and k_rope) and expand it locally (fewer bytes, more compute and memory)"),
        opt_bool("parallel.overlap_dp", &p.overlap_dp, "start each DP bucket's all-reduce during the backward, once its gradients are final (not with zero = 1)"),
        opt_string("data.path", &da.path,
                   "training data: a comma list of sources, each a token file made by `quintet prepare`, a "
                   "directory (its *.h5, sorted) or a glob, optionally preceded by a weight: \"0.7 web/, 0.3 "
                   "code/*.h5\"; without weights sources are weighted by their tokens (docs/data.md)"),
        opt_string("data.val_path", &da.val_path,
                   "validation sources (the syntax of data.path), each evaluated and reported on its own; empty = "
                   "the last data.val_fraction of each training source"),
        opt_int("data.seq_len", &da.seq_len, 1, 1 << 24, "sequence length T"),
        opt_int("data.micro_batch_size", &da.micro_batch_size, 1, 1 << 20, "samples per microbatch B"),
        opt_enum("data.order", &da.order, {"random", "sequential", "shuffle"},
                 "sample offsets: random draws them with replacement, sequential walks each source, shuffle visits "
                 "every sample of each source once per epoch in a seeded permutation"),
        opt_double("data.val_fraction", &da.val_fraction, 0, 0.9,
                   "share of each source's tokens held out for validation (not used with data.val_path)"),
        opt_bool("data.document_mask", &da.document_mask,
                 "a token attends only to earlier tokens of its own document (packed samples; documents end at data.eos_id)"),
        opt_int("data.eos_id", &da.eos_id, -1, 1 << 30,
                "the token that ends a document; -1 = the token file's eos_id (set by `quintet prepare --split-on` or several inputs)"),
        opt_bool("data.allow_incomplete", &da.allow_incomplete,
                 "use a corpus directory that has no complete manifest, or whose files disagree with it (an "
                 "interrupted or hand-made corpus), as it is: its *.h5 files by their headers (docs/data.md)"),
        opt_int("train.steps", &t.steps, 0, big, "optimizer steps; 0 = write the step-0 checkpoint and stop"),
        opt_int("train.global_batch", &t.global_batch, 0, big,
                "samples per step; 0 = dp x parallel.microbatches x data.micro_batch_size; when set, each "
                "layout's microbatches = global_batch / (dp x micro_batch_size), which must divide"),
        opt_double("train.lr", &t.lr, 0, 10, "peak learning rate"),
        opt_double("train.lr_min", &t.lr_min, 0, 10, "final learning rate of the cosine"),
        opt_int("train.warmup", &t.warmup, 0, big, "linear warm-up steps"),
        opt_double("train.weight_decay", &t.weight_decay, 0, 10, "AdamW decoupled weight decay (rank>=2 params)"),
        opt_double("train.beta1", &t.beta1, 0, 0.999999, "AdamW beta1"),
        opt_double("train.beta2", &t.beta2, 0, 0.999999999, "AdamW beta2"),
        opt_double("train.eps", &t.eps, 0, 1, "AdamW epsilon", true),
        opt_enum("train.optimizer", &t.optimizer, {"adamw", "muon"},
                 "adamw for every tensor, or muon: orthogonalised momentum (Newton-Schulz) for the 2-D hidden and "
                 "expert matrices, AdamW with the keys above for the embedding, the LM head, the norms and the router "
                 "(docs/math.md, \"Muon\")"),
        opt_double("train.muon_momentum", &t.muon_momentum, 0, 1, "muon: Nesterov momentum mu", false, true),
        opt_int("train.muon_ns_steps", &t.muon_ns_steps, 1, 100, "muon: Newton-Schulz iterations"),
        opt_double("train.muon_scale", &t.muon_scale, 0, 1e3,
                   "muon: the update is lr * (muon_scale * sqrt(max(rows, cols)) * O + weight_decay * W), O the "
                   "orthogonalised momentum; 0.2 matches AdamW's update RMS, so AdamW's lr and weight decay carry over",
                   true),
        opt_double("train.grad_clip", &t.grad_clip, 0, 1e12, "global gradient-norm clip; 0 = off"),
        opt_i64("train.seed", &t.seed, "seed of initialisation and data order"),
        opt_enum("train.device", &t.device, {"cpu", "cuda"}, "compute device"),
        opt_enum("train.precision", &t.precision, {"fp32", "bf16"}, "fp32, or bf16 GEMMs with fp32 master weights and gradients (docs/cuda.md)"),
        opt_double("train.peak_tflops", &t.peak_tflops, 0, 1e9, "device peak for MFU; 0 = backend default"),
        opt_enum("train.on_nonfinite", &t.on_nonfinite, {"stop", "skip"},
                 "a non-finite loss or gradient norm (confirmed by re-running the step once): stop "
                 "with exit status 3, or skip the update"),
        opt_int("train.max_skips", &t.max_skips, 1, big,
                "consecutive rejected steps (non-finite under on_nonfinite = skip, spikes under on_spike) before "
                "stopping with exit status 3"),
        opt_enum("train.on_spike", &t.on_spike, {"none", "skip", "rerun"},
                 "a step whose loss or pre-clip gradient norm is above mean + spike_sigma x std of the last "
                 "spike_window accepted steps (once that many are in): skip drops its update, rerun runs it once "
                 "more from the same state (kept if within the limits now, else skipped); none only records it"),
        opt_int("train.spike_window", &t.spike_window, 2, 1 << 20,
                "accepted steps the spike statistics cover; also the warm-up before any step is judged"),
        opt_double("train.spike_sigma", &t.spike_sigma, 0, 1e6, "spike limit in standard deviations above the mean", true),
        opt_bool("train.profile", &t.profile,
                 "time every operation (GEMMs by role, attention, norms, RoPE, SwiGLU, loss, optimizer, "
                 "each axis's communication): /timing/op/<name> in metrics.h5 for every step, and a table at "
                 "the end over the steady state (the steps past the first two, as the tokens/s median)"),
        opt_steps("train.trace_steps", &t.trace_from, &t.trace_to,
                  "steps (as the progress line counts them) whose timeline every rank writes to "
                  "run_dir/trace/rank<r>.json in the Trace Event format; `quintet trace RUN_DIR` merges them "
                  "(docs/observability.md)"),
        opt_double("train.straggler_ratio", &t.straggler_ratio, 1, 1e6,
                   "a rank whose compute time of a step exceeds the median of its peers (the ranks of its "
                   "pipeline stage) by this factor for several steps in a row is named in the log "
                   "(docs/observability.md)",
                   true),
        opt_bool("train.probe_rms", &t.probe_rms,
                 "record the root mean square of each kind of layer output (embedding, attention scores, "
                 "attention and feed-forward outputs, the last residual stream, the logits) over every step's tokens "
                 "in /probe/<kind>: the coordinate check of quintet mup-check (costs host copies: a diagnostic)"),
        opt_double("train.mtp_weight", &t.mtp_weight, 0, 1e3,
                   "multi-token prediction: the loss is the main cross-entropy plus mtp_weight / model.mtp_depth "
                   "times the sum of the MTP modules' cross-entropies (DeepSeek-V3's lambda)"),
        opt_int("train.exit_after", &t.exit_after, 0, big,
                "stop after this many steps of this run, with a checkpoint (time-limited jobs); 0 = never"),
        opt_int("train.threads", &t.threads, 0, 4096, "threads per rank; 0 = OMP_NUM_THREADS or cores/local ranks"),
        opt_enum("train.recompute", &t.recompute, {"none", "selective", "full"},
                 "activation recomputation in the backward: selective = the attention core, full = "
                 "whole layers from their inputs (the same curve, less memory, more compute)"),
        opt_double("train.collective_timeout_s", &t.collective_timeout_s, 0, 1e7,
                   "deadline of every collective and point-to-point wait in seconds; past it the "
                   "job ends with exit status 4 naming the axis and operation; 0 = none"),
        opt_enum("init.scheme", &in.scheme, {"normal", "scaled", "fan_in", "mup"},
                 "weight initialisation: normal = N(0, init.std); scaled = and the residual branches' output "
                 "projections / sqrt(2 n_layers); fan_in = 1/sqrt(fan-in); mup = scaled at the base shape "
                 "(init.base_*) with the maximal update parametrisation's width rules, so that a learning rate "
                 "tuned at the base width carries to others (docs/scaling-laws.md)"),
        opt_double("init.std", &in.std, 0, 10, "std of normal/scaled/mup init (mup: at the base width)", true),
        opt_int("init.base_width", &in.base_width, 0, big,
                "mup: d_model of the base model the hyperparameters were tuned at; 0 = this model's (width multiplier 1)"),
        opt_int("init.base_ffn", &in.base_ffn, 0, big,
                "mup: the base model's SwiGLU width (dense and experts scale together); 0 = scales with the width"),
        opt_int("init.base_head_dim", &in.base_head_dim, 0, big,
                "mup: the base model's q.k head dim; the attention scale is sqrt(base)/head_dim; 0 = this model's "
                "(1/sqrt(head_dim))"),
        opt_group(d.groups, ParamGroup::embedding, true, "the token embedding (and a tied head)"),
        opt_group(d.groups, ParamGroup::embedding, false, "the token embedding (and a tied head)"),
        opt_group(d.groups, ParamGroup::hidden, true, "the attention and MLA projections, the dense and shared-expert FFN matrices"),
        opt_group(d.groups, ParamGroup::hidden, false, "the attention and MLA projections, the dense and shared-expert FFN matrices"),
        opt_group(d.groups, ParamGroup::output, true, "the untied LM head"),
        opt_group(d.groups, ParamGroup::output, false, "the untied LM head"),
        opt_group(d.groups, ParamGroup::norm, true, "the RMSNorm weights (never weight-decayed)"),
        opt_group(d.groups, ParamGroup::router, true, "the MoE router"),
        opt_group(d.groups, ParamGroup::router, false, "the MoE router"),
        opt_group(d.groups, ParamGroup::expert, true, "the routed experts' matrices"),
        opt_group(d.groups, ParamGroup::expert, false, "the routed experts' matrices"),
        opt_int("eval.every", &ev.every, 0, big, "validation every N steps; 0 = never"),
        opt_int("eval.batches", &ev.batches, 0, big,
                "validation batches of micro_batch_size samples per validation source; 0 = all its whole batches"),
        opt_int("checkpoint.every", &c.every, 0, big, "checkpoint every N steps; 0 = only at the end"),
        opt_string("checkpoint.resume", &c.resume, "auto (from run_dir/checkpoints/latest) | none | PATH"),
        opt_string("checkpoint.init_from", &c.init_from,
                   "start from the weights of this checkpoint (any layout; seq_len and [rope] may "
                   "differ) at step 0 with a fresh optimizer; a checkpoint in run_dir (resume) wins"),
        opt_int("checkpoint.keep", &c.keep, 0, big, "complete checkpoints kept; 0 = all"),
        opt_bool("checkpoint.async", &c.async,
                 "copy each rank's checkpoint values into a staging buffer (its share of the weights and "
                 "optimizer state, allocated at the start and counted as buffers memory) and write them on a thread "
                 "of their own while training goes on; the next checkpoint, a stop and the end of the run wait "
                 "for it. false: every rank waits for each write"),
        opt_bool("checkpoint.allow_tokenizer_change", &c.allow_tokenizer_change,
                 "resume or init_from on a token file whose tokenizer is not the checkpoint's; init_from may "
                 "extend the vocabulary (new embedding and output rows start as the mean of the trained ones). "
                 "`quintet train --allow-tokenizer-change` sets it; false: exit 2 naming both tokenizers"),
        opt_bool("checkpoint.allow_optimizer_change", &c.allow_optimizer_change,
                 "resume a checkpoint written under another train.optimizer: the new optimizer's state starts at "
                 "zero (Muon's momentum, or AdamW's moments of the matrices Muon had) and the change is reported; "
                 "false: exit 2 naming the change"),
        opt_string("output.run_dir", &o.run_dir, "directory for metrics.h5 and checkpoints/"),
        opt_int("output.log_every", &o.log_every, 1, big, "progress line every N steps"),
    };
}

namespace {

po::options_description make_description(const std::vector<DeckOption>& opts) {
    po::options_description desc("deck keys");
    for (auto& o : opts) desc.add_options()(o.key.c_str(), po::value<std::string>(), o.help.c_str());
    return desc;
}

std::string keys_of_section(const std::vector<DeckOption>& opts, const std::string& section) {
    std::string s;
    for (auto& o : opts)
        if (section_of(o.key) == section) s += (s.empty() ? "" : ", ") + o.key.substr(section.size() + 1);
    return s;
}

[[noreturn]] void unknown_key(const std::vector<DeckOption>& opts, const std::string& key,
                              const std::string& where) {
    std::string sect = section_of(key);
    std::string known = keys_of_section(opts, sect);
    std::string valid;
    if (key.find('.') == std::string::npos || known.empty()) {
        valid = "unknown key (sections: model, rope, moe, parallel, data, train, init, eval, checkpoint, output)";
    } else {
        valid = "unknown key in [" + sect + "] (valid: " + known + ")";
    }
    throw ConfigError(where + ": '" + key + "': " + valid);
}

void apply(std::vector<DeckOption>& opts, const po::parsed_options& parsed, const std::string& where,
           std::map<std::string, std::string>* given) {
    for (auto& o : parsed.options) {
        if (o.unregistered) unknown_key(opts, o.string_key, where);
        std::string v = o.value.empty() ? "" : o.value.back();
        // trim spaces and an optional trailing comment
        auto hash = v.find('#');
        if (hash != std::string::npos) v = v.substr(0, hash);
        while (!v.empty() && std::isspace((unsigned char)v.back())) v.pop_back();
        while (!v.empty() && std::isspace((unsigned char)v.front())) v.erase(0, 1);
        for (auto& d : opts)
            if (d.key == o.string_key) d.set(v);
        if (given) (*given)[o.string_key] = v;
    }
}

// A key given twice in one deck file is refused, naming both lines (Boost would keep the last
// silently). Keys are "section.key" after [section] headers, as Boost reads them.
void refuse_duplicate_keys(std::istream& in, const std::string& path) {
    std::map<std::string, int> first;
    std::string line, section;
    for (int n = 1; std::getline(in, line); ++n) {
        const size_t a = line.find_first_not_of(" \t");
        if (a == std::string::npos || line[a] == '#' || line[a] == ';') continue;
        if (line[a] == '[') {
            const size_t b = line.find(']', a);
            section = line.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
            continue;
        }
        const size_t eq = line.find('=', a);
        if (eq == std::string::npos) continue;
        std::string key = line.substr(a, eq - a);
        while (!key.empty() && std::isspace((unsigned char)key.back())) key.pop_back();
        if (!section.empty()) key = section + "." + key;
        const auto [it, fresh] = first.emplace(key, n);
        if (!fresh)
            throw ConfigError("deck file '" + path + "': key '" + key + "' is given twice, on lines " +
                              std::to_string(it->second) + " and " + std::to_string(n) +
                              " (only one value can hold: keep one of the lines)");
    }
}

// The forward's µP multipliers follow from [init] (model/param_groups.hpp): every deck read
// derives them, so every model built from a deck (train, eval, generate, export) computes alike.
void derive_model(Deck& deck) {
    const MupShape s = mup_shape(deck.model, deck.init);
    deck.model.logit_mult = 1.0 / s.width;
    deck.model.attn_mult = s.attn;
}

}  // namespace

Deck deck_load(const std::string& deck_path, const std::vector<std::string>& overrides) {
    Deck deck;
    auto opts = deck_options(deck);
    auto desc = make_description(opts);
    if (!deck_path.empty()) {
        std::ifstream f(deck_path);
        if (!f) throw ConfigError("deck file '" + deck_path + "': cannot be opened (does it exist?)");
        refuse_duplicate_keys(f, deck_path);
        f.clear();
        f.seekg(0);
        try {
            apply(opts, po::parse_config_file(f, desc, true), "deck file '" + deck_path + "'", &deck.given);
        } catch (const po::error& e) {
            throw ConfigError("deck file '" + deck_path + "': " + e.what());
        }
    }
    std::vector<std::string> args;
    std::map<std::string, size_t> last;  // each key's last override: the one that holds
    for (size_t i = 0; i < overrides.size(); ++i) {
        const std::string& a = overrides[i];
        if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos)
            throw ConfigError("command line: '" + a + "': overrides are written --section.key=value");
        last[a.substr(2, a.find('=') - 2)] = i;
        if (a.back() != '=') args.push_back(a);  // Boost refuses "--key=": empty values are set below
    }
    try {
        auto parsed = po::command_line_parser(args).options(desc).allow_unregistered().style(
            po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent).run();
        apply(opts, parsed, "command line", &deck.given);
    } catch (const po::error& e) {
        throw ConfigError(std::string("command line: ") + e.what());
    }
    // An empty value (--data.val_path=): the key's own parser decides whether it is one.
    for (size_t i = 0; i < overrides.size(); ++i) {
        const std::string& a = overrides[i];
        const std::string key = a.substr(2, a.find('=') - 2);
        if (a.back() != '=' || last[key] != i) continue;
        bool known = false;
        for (auto& d : opts)
            if (d.key == key) d.set(""), known = true;
        if (!known) unknown_key(opts, key, "command line");
        deck.given[key] = "";
    }
    deck_schedule_defaults(deck, deck.given.count("parallel.virtual_stages") > 0);
    derive_model(deck);
    return deck;
}

void deck_schedule_defaults(Deck& deck, bool virtual_stages_given) {
    // ZB-V runs two chunks per stage in a V and nothing else: its virtual_stages need not be spelled out.
    if (deck.parallel.schedule == "zbv" && !virtual_stages_given) deck.parallel.virtual_stages = 2;
}

std::string deck_value(const Deck& deck, const std::string& key) {
    if (const auto it = deck.given.find(key); it != deck.given.end()) return it->second;
    Deck copy = deck;
    for (auto& o : deck_options(copy))
        if (o.key == key) return o.get();
    return "?";
}

std::vector<DeckChange> deck_diff(const Deck& before, const Deck& after) {
    Deck a = before, b = after;
    const auto oa = deck_options(a), ob = deck_options(b);
    std::vector<DeckChange> out;
    for (size_t i = 0; i < oa.size(); ++i)
        if (oa[i].get() != ob[i].get()) out.push_back({oa[i].key, oa[i].get(), ob[i].get()});
    return out;
}

std::string deck_to_text(const Deck& deck) {
    Deck copy = deck;
    auto opts = deck_options(copy);
    std::string out, section;
    for (auto& o : opts) {
        std::string s = section_of(o.key);
        if (s != section) {
            out += (out.empty() ? "" : "\n") + std::string("[") + s + "]\n";
            section = s;
        }
        out += o.key.substr(s.size() + 1) + " = " + o.get() + "\n";
    }
    return out;
}

Deck deck_parse_text(const std::string& text) {
    Deck deck;
    auto opts = deck_options(deck);
    std::istringstream in(text);
    std::string line, section;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        if (line[0] == '[') {
            section = line.substr(1, line.find(']') - 1);
            continue;
        }
        auto eq = line.find(" = ");
        if (eq == std::string::npos) continue;
        std::string key = section + "." + line.substr(0, eq), val = line.substr(eq + 3);
        for (auto& o : opts)
            if (o.key == key) o.set(val);
    }
    derive_model(deck);
    return deck;
}

std::string deck_reference_text() {
    Deck deck;
    auto opts = deck_options(deck);
    std::string out =
        "# quintet reference deck: every key with its default value and meaning.\n"
        "# Generated from the option table (quintet deck --reference); a test keeps it in sync.\n"
        "# Any key can be overridden on the command line as --section.key=value.\n";
    std::string section;
    for (auto& o : opts) {
        std::string s = section_of(o.key);
        if (s != section) {
            out += "\n[" + s + "]\n";
            section = s;
        }
        out += "# " + o.help + "\n" + o.key.substr(s.size() + 1) + " = " + o.get() + "\n";
    }
    return out;
}

std::string deck_markdown_table() {
    Deck deck;
    auto opts = deck_options(deck);
    std::string out = "| key | default | meaning |\n|---|---|---|\n";
    for (auto& o : opts) {
        std::string dflt = o.get();
        out += "| `" + o.key + "` | `" + (dflt.empty() ? " " : dflt) + "` | " + o.help + " |\n";
    }
    return out;
}

std::string deck_resolve_global_batch(Deck& d, int world) {
    if (d.train.global_batch <= 0) return "";
    const auto& p = d.parallel;
    const Layout layout = make_layout(world, p.tp, p.cp, p.pp, p.dp, p.ep);
    const int64_t per = int64_t(layout.size[kDP]) * d.data.micro_batch_size;
    if (d.train.global_batch % per != 0) return "";  // deck_validate names the keys
    const int m = int(d.train.global_batch / per);
    std::string note;
    if (d.given.count("parallel.microbatches") && d.parallel.microbatches != m)
        note = "parallel.microbatches = " + std::to_string(m) + ", not " + deck_value(d, "parallel.microbatches") +
               ": train.global_batch = " + std::to_string(d.train.global_batch) + " over dp " +
               std::to_string(layout.size[kDP]) + " x data.micro_batch_size " + std::to_string(d.data.micro_batch_size) +
               " (the global batch decides; set train.global_batch = 0 to choose microbatches)";
    d.parallel.microbatches = m;
    return note;
}

int64_t deck_global_batch(const Deck& d, int world) {
    if (d.train.global_batch > 0) return d.train.global_batch;
    const auto& p = d.parallel;
    const Layout layout = make_layout(world, p.tp, p.cp, p.pp, p.dp, p.ep);
    return int64_t(layout.size[kDP]) * p.microbatches * d.data.micro_batch_size;
}

void deck_validate(const Deck& d, int world, bool check_host_memory) {
    auto S = [](auto v) { return std::to_string(v); };
    const auto& m = d.model;
    const auto& p = d.parallel;
    const int kv = m.n_kv_heads == 0 ? m.n_heads : m.n_kv_heads;
    // Muon's keys under AdamW: every matrix would silently stay under AdamW.
    if (d.train.optimizer != "muon")
        for (const char* k : {"train.muon_momentum", "train.muon_ns_steps", "train.muon_scale"})
            if (d.given.count(k))
                config_fail(k, deck_value(d, k),
                            "is Muon's, but train.optimizer = " + d.train.optimizer +
                                " puts every tensor under AdamW; set train.optimizer = muon, or drop the key");
    if (p.ep > 1 && m.moe.experts == 0)
        config_fail("parallel.ep", S(p.ep), "expert parallelism needs MoE layers (moe.experts > 0); valid here: 1");
    if (p.ep > 1 && m.moe.experts % p.ep != 0)
        config_fail("parallel.ep", S(p.ep),
                    "must divide moe.experts = " + S(m.moe.experts) + " (each ep rank holds E/ep experts)");
    if (m.moe.experts > 0) {  // docs/math.md §9
        const auto& e = m.moe;
        if (e.top_k > e.experts)
            config_fail("moe.top_k", S(e.top_k), "must be at most moe.experts = " + S(e.experts));
        for (int v : e.layers.list())
            if (v < 0 || v >= m.n_layers)
                config_fail("moe.layers", e.layers.text(),
                            "expected all, or layer indices in [0, " + S(m.n_layers) + ") (model.n_layers = " +
                                S(m.n_layers) + ")");
        if (e.topk_method == "greedy" && (e.groups != 1 || e.group_top_k != 1))
            config_fail(e.groups != 1 ? "moe.groups" : "moe.group_top_k",
                        S(e.groups != 1 ? e.groups : e.group_top_k),
                        "groups limit moe.topk_method = group_limited_greedy or noaux_tc; with greedy: 1");
        if (e.experts % e.groups != 0)
            config_fail("moe.groups", S(e.groups), "must divide moe.experts = " + S(e.experts));
        if (e.group_top_k > e.groups)
            config_fail("moe.group_top_k", S(e.group_top_k), "must be at most moe.groups = " + S(e.groups));
        if (e.top_k > e.group_top_k * (e.experts / e.groups))
            config_fail("moe.top_k", S(e.top_k),
                        "must be at most the experts of moe.group_top_k groups, " +
                            S(e.group_top_k * (e.experts / e.groups)));
        if (e.topk_method == "noaux_tc" && e.experts / e.groups < 2)
            config_fail("moe.groups", S(e.groups),
                        "noaux_tc ranks a group by the sum of its two best scores: each group needs at least 2 "
                        "experts (moe.experts / moe.groups >= 2)");
        if (p.tp > 1 && !p.sequence_parallel)
            config_fail("parallel.sequence_parallel", "false",
                        "MoE layers with parallel.tp > 1 need sequence parallelism (each tp rank routes its "
                        "own rows, as in Megatron-Core): set parallel.sequence_parallel = true");
    }
    if (m.mtp_depth > 0) {  // docs/math.md §11
        if (d.data.seq_len <= m.mtp_depth)
            config_fail("model.mtp_depth", S(m.mtp_depth),
                        "module k predicts the token k+1 ahead: data.seq_len = " + S(d.data.seq_len) +
                            " leaves the last module nothing to predict (model.mtp_depth < data.seq_len)");
    }
    if (d.train.device == "cuda") {
#ifndef QUINTET_WITH_CUDA
        config_fail("train.device", "cuda",
                    "this quintet was built without CUDA (configure with -DQUINTET_CUDA=ON on a "
                    "machine with the CUDA toolkit); valid here: cpu");
#endif
        if (d.train.peak_tflops <= 0)
            config_fail("train.peak_tflops", "0",
                        "with train.device = cuda give the GPU's peak in TFLOP/s for MFU, e.g. 67 "
                        "(H100/H200 fp32) or 989 (dense bf16)");
    }
    // Model shape.
    if (m.attention == "mla") {
        // MLA's own dims (docs/math.md §7.2); d_model need not divide by n_heads.
        const std::pair<const char*, int> dims[] = {{"model.kv_lora_rank", m.kv_lora_rank},
                                                    {"model.qk_nope_dim", m.qk_nope_dim},
                                                    {"model.qk_rope_dim", m.qk_rope_dim},
                                                    {"model.v_head_dim", m.v_head_dim}};
        for (const auto& [key, v] : dims)
            if (v <= 0) config_fail(key, S(v), "must be > 0 with model.attention = mla");
        if (m.qk_rope_dim % 2 != 0)
            config_fail("model.qk_rope_dim", S(m.qk_rope_dim), "must be even (RoPE rotates pairs), e.g. " +
                                                                   S(m.qk_rope_dim + 1));
        if (m.n_kv_heads != 0 && m.n_kv_heads != m.n_heads)
            config_fail("model.n_kv_heads", S(m.n_kv_heads),
                        "is a GQA key; MLA has one latent per token shared by all heads (valid with "
                        "mla: 0 or n_heads)");
    } else {
        const std::pair<const char*, int> dims[] = {{"model.kv_lora_rank", m.kv_lora_rank},
                                                    {"model.q_lora_rank", m.q_lora_rank},
                                                    {"model.qk_nope_dim", m.qk_nope_dim},
                                                    {"model.qk_rope_dim", m.qk_rope_dim},
                                                    {"model.v_head_dim", m.v_head_dim}};
        for (const auto& [key, v] : dims)
            if (v != 0)
                config_fail(key, S(v), "is an MLA key; with model.attention = " + m.attention +
                                           " it must be 0 (or set model.attention = mla)");
        if (p.cp_mla_kv != "ring")
            config_fail("parallel.cp_mla_kv", p.cp_mla_kv, "applies to model.attention = mla only (valid: ring)");
    }
    if (m.attention == "mha" && m.d_model % m.n_heads != 0)
        config_fail("model.n_heads", S(m.n_heads), "must divide model.d_model = " + S(m.d_model));
    if (m.n_heads % kv != 0)
        config_fail("model.n_kv_heads", S(m.n_kv_heads), "must divide model.n_heads = " + S(m.n_heads));
    if (m.attention == "mha" && m.head_dim() % 2 != 0)
        config_fail("model.n_heads", S(m.n_heads),
                    "head_dim = d_model/n_heads = " + S(m.head_dim()) + " must be even for RoPE");
    if (d.rope.scaling == "yarn" && d.rope.factor <= 1.0)
        config_fail("rope.factor", deck_value(d, "rope.factor"), "YaRN needs a factor > 1");
    if (d.data.seq_len < 2) config_fail("data.seq_len", S(d.data.seq_len), "must be at least 2");
    // Tensor parallelism: heads, kv heads and the ffn split evenly over tp.
    const int F = m.ffn_width();
    if (m.n_heads % p.tp != 0)
        config_fail("model.n_heads", S(m.n_heads), "must be divisible by parallel.tp = " + S(p.tp));
    if (kv % p.tp != 0 && p.tp % kv != 0)
        config_fail("model.n_kv_heads", S(kv),
                    "must be divisible by parallel.tp = " + S(p.tp) +
                        ", or divide it (then each kv head is replicated over tp/n_kv_heads ranks)");
    if (F % p.tp != 0)
        config_fail("model.ffn_dim", S(F), "must be divisible by parallel.tp = " + S(p.tp));
    if (p.tp > m.vocab_size && m.vocab_size > 0)
        config_fail("parallel.tp", S(p.tp), "exceeds the vocabulary size " + S(m.vocab_size));
    // Context parallelism: 2*cp equal chunks per sample (docs/math.md §8).
    if (d.data.seq_len % (2 * p.cp) != 0)
        config_fail("data.seq_len", S(d.data.seq_len),
                    "must be divisible by 2*parallel.cp = " + S(2 * p.cp) +
                        " (each sample is cut into 2*cp equal chunks); valid e.g. " +
                        S((d.data.seq_len / (2 * p.cp) + 1) * 2 * p.cp));
    if (p.sequence_parallel && p.tp > 1 && (d.data.seq_len / p.cp) % p.tp != 0)
        config_fail("data.seq_len", S(d.data.seq_len),
                    "seq_len/cp must be divisible by parallel.tp = " + S(p.tp) +
                        " under parallel.sequence_parallel (cp = " + S(p.cp) + ")");
    if ((d.data.document_mask || d.rope.document_positions) && d.data.eos_id < 0)
        config_fail(d.data.document_mask ? "data.document_mask" : "rope.document_positions", "true",
                    "needs an end-of-document token: data.eos_id, or a token file that records "
                    "one (quintet prepare with several --input files or --split-on)");
    if (d.data.eos_id >= m.vocab_size && m.vocab_size > 0)
        config_fail("data.eos_id", S(d.data.eos_id), "must be below the vocabulary size " + S(m.vocab_size));
    // Pipeline: layers per stage, and the schedule's own conditions.
    if (!p.pp_layers.empty()) {
        std::string text;
        for (int c : p.pp_layers) text += (text.empty() ? "" : ",") + S(c);
        if (p.virtual_stages != 1)
            config_fail("parallel.pp_layers", text, "only with parallel.virtual_stages = 1");
        int sum = 0;
        for (int c : p.pp_layers) sum += c;
        if (int(p.pp_layers.size()) != p.pp || sum != m.n_layers)
            config_fail("parallel.pp_layers", text,
                        "needs parallel.pp = " + S(p.pp) + " counts summing to model.n_layers = " + S(m.n_layers));
    } else if (p.virtual_stages == 1 && m.n_layers % p.pp != 0) {
        config_fail("model.n_layers", S(m.n_layers),
                    "must be divisible by parallel.pp = " + S(p.pp) + " (or give parallel.pp_layers)");
    }
    std::string why = schedule_check(p.schedule, p.pp, p.microbatches, p.virtual_stages, m.n_layers);
    if (!why.empty()) throw ConfigError(why);
    // ZeRO-2/3 reduce each unit's gradient when a chunk is done with it; zbv's stage 0 finishes
    // a tied head (its second chunk) long before the embedding it shares (its first).
    if (p.zero >= 2 && m.tie_embeddings && p.schedule == "zbv")
        config_fail("parallel.zero", S(p.zero),
                    "with model.tie_embeddings = true and parallel.schedule = zbv the valid levels are 0 and 1 "
                    "(or untie the embeddings, or choose another schedule)");
    // A model whose weights, gradients and AdamW moments (16 bytes a parameter, spread over the
    // model-parallel ranks at best) cannot fit this machine's memory stops here, not in bad_alloc.
    {
        const double C = m.d_model, V = std::max(m.vocab_size, 1), L = m.n_layers;
        const double F = m.ffn_width(), Fe = m.expert_ffn_width();
        const double ffn = m.moe.experts > 0 ? (double(m.moe.experts) + m.moe.shared_experts) * 3 * C * Fe + m.moe.experts * C
                                             : 3 * C * F;
        const double params = V * C * (m.tie_embeddings ? 1 : 2) + L * (4 * C * C + ffn);
        const double split = double(std::max(1, p.tp)) * std::max(1, p.pp) * std::max(1, p.ep);
        const double need = params * 16 / split;
        const double mem = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
        if (check_host_memory && mem > 0 && need > mem)
            config_fail("model.d_model", S(m.d_model),
                        "the model has about " + std::to_string(int64_t(params / 1e6)) + "M parameters: at 16 bytes "
                        "each (weights, gradients, AdamW moments) that is " + std::to_string(int64_t(need / 1073741824.0)) +
                        " GiB per rank even spread over tp x pp x ep = " + std::to_string(int64_t(split)) +
                        ", and this machine has " + std::to_string(int64_t(mem / 1073741824.0)) +
                        " GiB; make the model smaller (model.d_model, model.n_layers, moe.experts) or split it further");
    }
    // Layout (the world size, dp, ep): checked where the layout is made.
    const Layout layout = make_layout(world, p.tp, p.cp, p.pp, p.dp, p.ep);
    if (d.train.global_batch > 0) {
        const int64_t per = int64_t(layout.size[kDP]) * d.data.micro_batch_size;
        if (d.train.global_batch % per != 0)
            config_fail("train.global_batch", S(d.train.global_batch),
                        "must be a multiple of dp x data.micro_batch_size = " + S(layout.size[kDP]) + " x " +
                            S(d.data.micro_batch_size) + " = " + S(per) + " (each replica runs global_batch / (dp x "
                            "micro_batch_size) microbatches)");
    }
    // The spike policy judges a step only after a full window of accepted steps.
    if (d.train.on_spike != "none" && d.train.steps > 0 && d.train.spike_window > d.train.steps)
        config_fail("train.spike_window", S(d.train.spike_window),
                    "exceeds train.steps = " + S(d.train.steps) + ": train.on_spike = " + d.train.on_spike +
                        " would never judge a step (it waits for a full window of accepted steps); valid: 2 .. " +
                        S(d.train.steps));
    if (d.train.lr_min > d.train.lr)
        config_fail("train.lr_min", deck_value(d, "train.lr_min"), "must not exceed train.lr = " + deck_value(d, "train.lr"));
    // A warm-up longer than the run never reaches train.lr. The default (10) is let through
    // with a warning by the trainer; a value the user gave is an error.
    if (d.train.trace_from > 0 && d.train.trace_to > d.train.steps)
        config_fail("train.trace_steps", deck_value(d, "train.trace_steps"),
                    "lies outside the run's steps 1-" + S(d.train.steps) + " (train.steps = " + S(d.train.steps) +
                        "); valid: A-B with 1 <= A <= B <= " + S(d.train.steps) + ", or empty for none");
    if (d.given.count("train.warmup") && d.train.steps > 0 && d.train.warmup > d.train.steps)
        config_fail("train.warmup", deck_value(d, "train.warmup"),
                    "must not exceed train.steps = " + S(d.train.steps) + " (valid: 0 to " + S(d.train.steps) +
                        "; a longer warm-up never reaches train.lr)");
}

}  // namespace quintet
