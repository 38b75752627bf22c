// quintet_cuda_bench: throughput of the CUDA backend on one GPU, for scripts/gpu_check.sh.
// (1) GEMM rates: cuBLAS fp32 (TF32 off, then on) and cuBLASLt bf16 at one square size;
// (2) the dense Transformer's training step (forward + backward + AdamW, fp32) at seq 1024 for a
// ~125M ("small") and a ~350M ("medium") model: tokens/s, model FLOP/s and MFU against the
// card's bf16 dense peak (docs/math.md §1). It drives model/transformer (one ModelChunk holding
// the whole model, tp = 1) directly: the trainer does not use the CUDA backend yet
// (docs/cuda.md). Not a test: it checks only that losses are finite and that the steady state
// makes no cudaMalloc; (3) with --planner_gemms, the GEMMs the GPU planner costs for a layer and
// the LM head of published model shapes (per GPU after tensor parallelism), each measured beside
// the planner's own time for it (perf/gpu_cost.hpp gpu_gemm_seconds): the data a Hopper-specific
// GEMM efficiency needs (docs/planner.md §8). Output: key=value lines.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/kernels/cuda_backend.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/transformer.hpp"
#include "quintet/perf/gpu_cost.hpp"
#include "quintet/perf/hardware.hpp"

using namespace quintet;

namespace {

struct PlannerShape {
    int h, heads, tp, rows;  // rows: tokens of a microbatch
};

struct Options {
    std::string presets = "small,medium";
    std::string precisions = "bf16,fp32";
    int batch = 8, seq = 1024, steps = 10, gemm_size = 4096;
    double peak_tflops = 989.0;  // H100/H200 SXM bf16 dense
    bool gemm = true;
    std::string planner_gemms;  // h/heads/tp[/rows] items, or "mc24"
    std::string hardware = "h100-sxm";
    int planner_rows = 4096;    // tokens of a microbatch where an item does not give them
    int planner_vocab = 131072;
    std::vector<PlannerShape> planner_shapes;  // parsed from planner_gemms
};

const char* kUsage =
    "usage: quintet_cuda_bench [--presets small,medium] [--precisions bf16,fp32] [--batch 8]\n"
    "                          [--seq 1024] [--steps 10]\n"
    "                          [--gemm_size 4096] [--no_gemm] [--peak_tflops 989] [--device 0]\n"
    "                          [--planner_gemms mc24|h/heads/tp,...] [--planner_rows 4096]\n"
    "                          [--planner_vocab 131072] [--hardware h100-sxm]\n";


void bench_gemm(CudaBackend& be, int n, const Options&) {
    const size_t nn = size_t(n) * n;
    float* a = be.alloc(nn);
    float* b = be.alloc(nn);
    float* c = be.alloc(nn);
    bf16_bits* ah = be.alloc_bf16(nn);
    bf16_bits* bh = be.alloc_bf16(nn);
    bf16_bits* ch = be.alloc_bf16(nn);
    std::vector<float> host(nn);
    std::mt19937 g(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& x : host) x = d(g);
    be.from_host(a, host.data(), nn);
    be.from_host(b, host.data(), nn);
    be.to_bf16(ah, a, nn);
    be.to_bf16(bh, b, nn);
    const double flop = 2.0 * double(n) * n * n;
    auto timed = [&](const char* name, auto&& fn) {
        fn();  // warm-up (and cuBLASLt heuristics)
        be.synchronize();
        const int reps = 10;
        double t0 = now_s();
        for (int r = 0; r < reps; ++r) fn();
        be.synchronize();
        double s = (now_s() - t0) / reps;
        std::printf("gemm name=%s size=%d ms=%.3f tflops=%.2f\n", name, n, s * 1e3,
                    flop / s / 1e12);
        std::fflush(stdout);
    };
    timed("sgemm_fp32", [&] { be.gemm(false, true, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); });
    be.set_tf32(true);
    timed("sgemm_tf32", [&] { be.gemm(false, true, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); });
    be.set_tf32(false);
    timed("bf16_fp32out",
          [&] { be.gemm_bf16(false, true, n, n, n, 1.0f, ah, n, bh, n, 0.0f, c, n); });
    timed("bf16_bf16out",
          [&] { be.gemm_bf16(false, true, n, n, n, 1.0f, ah, n, bh, n, 0.0f, ch, n); });
    be.release(a);
    be.release(b);
    be.release(c);
    be.release_bf16(ah);
    be.release_bf16(bh);
    be.release_bf16(ch);
}

// The planner's GEMMs of one dense layer and the LM head (the h/heads/tp shapes of the Megatron-Core
// H100 runs the planner is validated on, docs/planner.md §8, when "mc24"), each timed with
// cuBLASLt in bf16 (fp32 accumulation; the weight gradient accumulated into fp32, as training
// does) beside the planner's time for the same product. The sums per model are the figure that
// matters: planned / measured below 1 where the planner is too optimistic.
// --planner_gemms: "mc24" (the Megatron-Core H100 runs C1-C9 of docs/planner.md §8, each with
// the rows of the micro-batch size the validation takes: 4 x 4096 for C1-C4, 2 x 4096 for C5,
// 4096 for C6-C9) or h/heads/tp[/rows] items. Checked before the GPU is touched.
std::vector<PlannerShape> parse_planner_shapes(const std::string& given, int default_rows) {
    std::vector<PlannerShape> shapes;
    const std::string list = given == "mc24" ? "2048/16/1/16384,4096/32/2/16384,6144/48/4/16384,7168/56/8/16384,"
                                               "8192/64/8/8192,10240/80/8/4096,12288/96/8/4096,16384/128/8/4096,"
                                               "18432/144/8/4096"
                                             : given;
    size_t pos = 0;
    while (pos <= list.size()) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        const std::string item = list.substr(pos, comma - pos);
        // Two to four '/'-separated positive integers, nothing else.
        std::vector<long> f;
        size_t at = 0;
        bool digits = !item.empty();
        while (digits && at <= item.size()) {
            size_t slash = item.find('/', at);
            if (slash == std::string::npos) slash = item.size();
            const std::string part = item.substr(at, slash - at);
            digits = !part.empty() && part.size() <= 9 && part.find_first_not_of("0123456789") == std::string::npos;
            if (digits) f.push_back(std::stol(part));
            at = slash + 1;
        }
        PlannerShape sh{0, 0, 0, default_rows};
        if (digits && (f.size() == 3 || f.size() == 4)) {
            sh.h = int(f[0]), sh.heads = int(f[1]), sh.tp = int(f[2]);
            if (f.size() == 4) sh.rows = int(f[3]);
        }
        if (sh.h <= 0 || sh.heads <= 0 || sh.tp <= 0 || sh.rows <= 0 || sh.h % sh.heads != 0 || sh.heads % sh.tp != 0)
            throw ConfigError("--planner_gemms = '" + given + "': item '" + item +
                              "' is not h/heads/tp[/rows] (positive integers, heads dividing h, tp dividing heads) "
                              "or mc24");
        shapes.push_back(sh);
        pos = comma + 1;
    }
    return shapes;
}

void bench_planner_gemms(CudaBackend& be, const Options& o) {
    const std::vector<PlannerShape>& shapes = o.planner_shapes;
    const Hardware hw = hardware_load(o.hardware);
    // Operands of random values, not the allocator's zeros: a GEMM on zeros draws less power and
    // can run at a higher clock than training's. One block of N(0, 1) values, repeated.
    const size_t block = size_t(1) << 20;
    std::vector<float> host(block);
    std::mt19937 g(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : host) v = nd(g);
    float* noise = be.alloc(block);
    be.from_host(noise, host.data(), block);
    auto fill = [&](bf16_bits* dst, size_t n) {
        for (size_t at = 0; at < n; at += block) be.to_bf16(dst + at, noise, std::min(block, n - at));
    };
    for (const PlannerShape& sh : shapes) {
        const double M = sh.rows;
        ModelConfig m;
        m.d_model = sh.h, m.n_heads = sh.heads, m.n_kv_heads = 0, m.n_layers = 2, m.ffn_dim = 0;
        m.vocab_size = o.planner_vocab, m.tie_embeddings = false;
        double measured_layer = 0, planned_layer = 0, measured_head = 0, planned_head = 0;
        for (const PlannedGemm& p : planned_layer_gemms(m, sh.tp, M, hw, true)) {
            // The weight is [out, in]; fwd's N is out and K in, dgrad's the other way round.
            const int rows = sh.rows, out = int(p.pass == "fwd" ? p.N : p.pass == "dgrad" ? p.K : p.M),
                      in = int(p.pass == "fwd" ? p.K : p.N);
            bf16_bits* x = be.alloc_bf16(size_t(rows) * in);   // the input rows (dgrad: their gradient)
            bf16_bits* w = be.alloc_bf16(size_t(out) * in);    // the weight [out, in]
            bf16_bits* y = be.alloc_bf16(size_t(rows) * out);  // the output (dgrad, wgrad: its gradient)
            float* dw = be.alloc(size_t(out) * in);
            fill(x, size_t(rows) * in), fill(w, size_t(out) * in), fill(y, size_t(rows) * out);
            auto run = [&] {
                if (p.pass == "fwd") be.gemm_bf16(false, true, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
                else if (p.pass == "dgrad") be.gemm_bf16(false, false, rows, in, out, 1.0f, y, out, w, in, 0.0f, x, in);
                else be.gemm_bf16(true, false, out, in, rows, 1.0f, y, out, x, in, 1.0f, dw, in);  // into fp32, accumulated
            };
            run();  // warm-up (and cuBLASLt's heuristics)
            be.synchronize();
            const int reps = std::max(3, std::min(200, int(std::ceil(0.02 / std::max(p.planned_s, 1e-6)))));
            const double t0 = now_s();
            for (int r = 0; r < reps; ++r) run();
            be.synchronize();
            const double measured = p.count * (now_s() - t0) / reps;
            (p.head ? measured_head : measured_layer) += measured;
            (p.head ? planned_head : planned_layer) += p.planned_s;
            const double flop = p.count * 2 * p.M * p.N * p.K;
            std::printf("planner_gemm h=%d tp=%d name=%s pass=%s M=%.0f N=%.0f K=%.0f count=%.0f ms=%.4f tflops=%.1f "
                        "planned_tflops=%.1f planned_over_measured=%.3f\n",
                        sh.h, sh.tp, p.name.c_str(), p.pass.c_str(), p.M, p.N, p.K, p.count, measured * 1e3,
                        flop / measured / 1e12, flop / p.planned_s / 1e12, p.planned_s / measured);
            std::fflush(stdout);
            be.release_bf16(x), be.release_bf16(w), be.release_bf16(y), be.release(dw);
        }
        std::printf("planner_layer h=%d heads=%d tp=%d rows=%.0f hardware=%s layer_ms=%.4f planned_layer_ms=%.4f "
                    "layer_rate=%.3f head_ms=%.4f planned_head_ms=%.4f head_rate=%.3f\n",
                    sh.h, sh.heads, sh.tp, M, hw.name.c_str(), measured_layer * 1e3, planned_layer * 1e3,
                    planned_layer / measured_layer, measured_head * 1e3, planned_head * 1e3, planned_head / measured_head);
        std::fflush(stdout);
    }
    be.release(noise);
}

void bench_model(CudaBackend& be, const std::string& preset, const std::string& precision,
                 const Options& o) {
    if (precision != "fp32" && precision != "bf16")
        throw ConfigError("quintet_cuda_bench: unknown precision '" + precision + "' (valid: fp32, bf16)");
    const Precision prec = precision == "bf16" ? Precision::bf16 : Precision::fp32;
    ModelConfig m;
    if (preset == "small") {  // GPT-2-small-like: ~124M matmul parameters
        m.d_model = 768;
        m.n_layers = 12;
        m.n_heads = 12;
        m.ffn_dim = 2048;
    } else if (preset == "medium") {  // ~355M matmul parameters
        m.d_model = 1024;
        m.n_layers = 24;
        m.n_heads = 16;
        m.ffn_dim = 2752;
    } else {
        throw ConfigError("quintet_cuda_bench: unknown preset '" + preset +
                          "' (valid: small, medium)");
    }
    m.n_kv_heads = m.n_heads;
    m.vocab_size = 50304;
    RopeConfig rope;
    InitConfig init;
    const int B = o.batch, T = o.seq, N = B * T;
    ParamTable table = make_param_table(m);
    ModelDims d = model_dims(m);

    std::vector<float> host(table.total);
    init_params(host.data(), table, m, init, 1234, 0, table.total);
    float* params = be.alloc(table.total);
    float* grads = be.alloc(table.total);
    float* mom1 = be.alloc(table.total);
    float* mom2 = be.alloc(table.total);
    be.from_host(params, host.data(), table.total);
    host.clear();
    host.shrink_to_fit();

    MpiCommunicator self(MPI_COMM_SELF);
    TensorParallel tp(self, false);
    ModelChunk model(be, m, rope, table, stage_chunks(m.n_layers, 1, 1, 0, {})[0], tp, B, T, ChunkOptions{prec});
    bf16_bits* shadow = nullptr;  // the trainer's bf16 copy of the weights, refreshed every step
    if (prec == Precision::bf16) {
        shadow = be.alloc_bf16(table.total);
        model.set_bf16_weights(params, shadow);
    }
    std::mt19937 g(7);
    std::vector<int32_t> ids(N), tgt(N);
    for (int i = 0; i < N; ++i) {
        ids[i] = int32_t(g() % uint32_t(m.vocab_size));
        tgt[i] = int32_t(g() % uint32_t(m.vocab_size));
    }
    int step = 0;
    auto train_step = [&] {
        ++step;
        be.zero(grads, table.total);
        if (shadow) be.to_bf16(shadow, params, table.total);
        double loss = model.forward_backward(params, grads, ids.data(), tgt.data(), 1.0f / N);
        const float bc1 = 1.0f - std::pow(0.9f, float(step)), bc2 = 1.0f - std::pow(0.95f, float(step));
        be.adamw(params, grads, mom1, mom2, table.total, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2);
        return loss / N;
    };
    double first = train_step();
    train_step();
    be.synchronize();
    const size_t mallocs_before = be.pool_stats().device_mallocs;
    double last = 0.0;
    const double t0 = now_s();
    for (int s = 0; s < o.steps; ++s) last = train_step();
    be.synchronize();
    const double dt = (now_s() - t0) / o.steps;
    const size_t steady_mallocs = be.pool_stats().device_mallocs - mallocs_before;
    // Forward only, for the split.
    const double f0 = now_s();
    for (int s = 0; s < 3; ++s) model.forward_loss(params, ids.data(), tgt.data());
    be.synchronize();
    const double fwd = (now_s() - f0) / 3;

    const double P = double(table.matmul_params);
    // PaLM's model FLOPs per token (docs/math.md §1.3).
    const double flops_per_token = 6.0 * P + 6.0 * d.L * double(T) * d.NH * double(d.Dqk + d.Dv);
    const double tps = double(N) / dt;
    const double tflops = tps * flops_per_token / 1e12;
    std::printf("model preset=%s precision=%s params=%zu matmul_params=%zu B=%d T=%d steps=%d step_ms=%.1f "
                "fwd_ms=%.1f tokens_per_s=%.0f model_tflops=%.2f mfu=%.4f peak_tflops=%.0f "
                "loss_first=%.4f loss_last=%.4f finite=%d steady_state_mallocs=%zu "
                "activation_gib=%.2f\n",
                preset.c_str(), precision.c_str(), table.total, table.matmul_params, B, T, o.steps, dt * 1e3,
                fwd * 1e3, tps, tflops, tflops / o.peak_tflops, o.peak_tflops, first, last,
                int(std::isfinite(first) && std::isfinite(last)), steady_mallocs,
                double(model.slot_bytes()) / double(1ull << 30));
    std::fflush(stdout);
    be.release(params);
    be.release(grads);
    be.release(mom1);
    be.release(mom2);
    if (shadow) be.release_bf16(shadow);
}

int run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);  // ModelChunk's tp communicator is MPI_COMM_SELF
    const int rc = run(argc, argv);
    MPI_Finalize();
    return rc;
}

namespace {

int run(int argc, char** argv) {
    Options o;
    int device = 0;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n%s", a.c_str(), kUsage);
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--presets") o.presets = next();
        else if (a == "--precisions") o.precisions = next();
        else if (a == "--batch") o.batch = std::atoi(next().c_str());
        else if (a == "--seq") o.seq = std::atoi(next().c_str());
        else if (a == "--steps") o.steps = std::atoi(next().c_str());
        else if (a == "--gemm_size") o.gemm_size = std::atoi(next().c_str());
        else if (a == "--peak_tflops") o.peak_tflops = std::atof(next().c_str());
        else if (a == "--device") device = std::atoi(next().c_str());
        else if (a == "--no_gemm") o.gemm = false;
        else if (a == "--planner_gemms") o.planner_gemms = next();
        else if (a == "--planner_rows") o.planner_rows = std::atoi(next().c_str());
        else if (a == "--planner_vocab") o.planner_vocab = std::atoi(next().c_str());
        else if (a == "--hardware") o.hardware = next();
        else {
            std::fprintf(stderr, "unknown argument '%s'\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (o.batch <= 0 || o.seq <= 0 || o.steps <= 0 || o.planner_rows <= 0 || o.planner_vocab <= 0) {
        std::fprintf(stderr, "--batch, --seq, --steps, --planner_rows and --planner_vocab must be positive\n");
        return 2;
    }
    try {
        if (!o.planner_gemms.empty()) {
            o.planner_shapes = parse_planner_shapes(o.planner_gemms, o.planner_rows);
            hardware_load(o.hardware);  // an unknown name fails here, naming the valid ones
        }
        auto be = make_cuda_backend_ext(device);
        std::printf("device name=\"%s\"\n", be->name().c_str());
        if (o.gemm) bench_gemm(*be, o.gemm_size, o);
        if (!o.planner_shapes.empty()) bench_planner_gemms(*be, o);
        auto split = [](const std::string& list) {
            std::vector<std::string> out;
            size_t pos = 0;
            while (pos <= list.size()) {
                size_t comma = list.find(',', pos);
                if (comma == std::string::npos) comma = list.size();
                if (comma > pos) out.push_back(list.substr(pos, comma - pos));
                pos = comma + 1;
            }
            return out;
        };
        for (const auto& p : split(o.presets))
            for (const auto& prec : split(o.precisions)) bench_model(*be, p, prec, o);
    } catch (const ConfigError& e) {  // bad input, or no usable GPU
        std::fprintf(stderr, "quintet_cuda_bench: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "quintet_cuda_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}

}  // namespace
