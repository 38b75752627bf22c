// quintet_cuda_bench: throughput of the CUDA backend on one GPU, for scripts/gpu_check.sh.
// (1) GEMM rates: cuBLAS fp32 (TF32 off, then on) and cuBLASLt bf16 at one square size;
// (2) the dense Transformer's training step (forward + backward + AdamW, fp32) at seq 1024 for a
// ~125M ("small") and a ~350M ("medium") model: tokens/s, model FLOP/s and MFU against the
// card's bf16 dense peak (docs/math.md §1). It drives model/transformer (one ModelChunk holding
// the whole model, tp = 1) directly: the trainer does not use the CUDA backend yet
// (docs/cuda.md). Not a test: it checks only that losses are finite and that the steady state
// makes no cudaMalloc. Output: key=value lines.
#include <mpi.h>

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

using namespace quintet;

namespace {

struct Options {
    std::string presets = "small,medium";
    std::string precisions = "bf16,fp32";
    int batch = 8, seq = 1024, steps = 10, gemm_size = 4096;
    double peak_tflops = 989.0;  // H100/H200 SXM bf16 dense
    bool gemm = true;
};

const char* kUsage =
    "usage: quintet_cuda_bench [--presets small,medium] [--precisions bf16,fp32] [--batch 8]\n"
    "                          [--seq 1024] [--steps 10]\n"
    "                          [--gemm_size 4096] [--no_gemm] [--peak_tflops 989] [--device 0]\n";


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
        else {
            std::fprintf(stderr, "unknown argument '%s'\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (o.batch <= 0 || o.seq <= 0 || o.steps <= 0) {
        std::fprintf(stderr, "--batch, --seq and --steps must be positive\n");
        return 2;
    }
    try {
        auto be = make_cuda_backend_ext(device);
        std::printf("device name=\"%s\"\n", be->name().c_str());
        if (o.gemm) bench_gemm(*be, o.gemm_size, o);
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
    } catch (const std::exception& e) {
        std::fprintf(stderr, "quintet_cuda_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}

}  // namespace
