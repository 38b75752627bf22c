// Small subcommands: `quintet deck` (the option table as a reference deck or Markdown) and
// `quintet peak` (this host's FMA peak behind MFU, and its sgemm rate; --links: two ranks' link).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/perf/host_peak.hpp"

namespace quintet {

int deck_main(int argc, char** argv) {
    std::string what = argc > 1 ? argv[1] : "--reference";
    if (what == "--reference") std::cout << deck_reference_text();
    else if (what == "--markdown") std::cout << deck_markdown_table();
    else if (what == "--get" && argc > 2) {
        // For scripts: a key's value after the deck file and the overrides, as quintet train sees it.
        const std::string key = argv[2];
        std::string path;
        std::vector<std::string> overrides;
        for (int i = 3; i < argc; ++i) {
            const std::string a = argv[i];
            if (a.rfind("--", 0) == 0) overrides.push_back(a);
            else if (path.empty()) path = a;
            else throw ConfigError("quintet deck --get: one deck file, got '" + path + "' and '" + a + "'");
        }
        Deck deck = deck_load(path, overrides);
        bool known = false;
        for (const auto& o : deck_options(deck)) known = known || o.key == key;
        if (!known) throw ConfigError("quintet deck --get: '" + key + "' is not a deck key (see quintet deck --reference)");
        std::cout << deck_value(deck, key) << "\n";
    } else {
        std::cout << "usage: quintet deck [--reference | --markdown | --get KEY [DECK] [--section.key=value ...]]\n"
                     "  --reference  every key with its default and meaning, as a deck file\n"
                     "  --markdown   the same as a Markdown table (docs/deck.md)\n"
                     "  --get KEY    the value of KEY after DECK and the overrides (for scripts)\n";
        return what == "--help" || what == "-h" ? 0 : 2;
    }
    return 0;
}

int peak_main(int argc, char** argv) {
    int threads = 0, size = 2048;
    bool remeasure = false, memory = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::cout << "usage: quintet peak [--threads N] [--size N] [--remeasure]\n"
                         "       quintet peak --memory [--threads N]\n"
                         "       mpirun -n 2 quintet peak --links\n"
                         "Measures this host's fp32 FMA peak (one core, a loop of independent FMAs in the\n"
                         "widest vector ISA; cached per host and CPU model: the denominator of MFU) and the\n"
                         "sgemm rate of the CPU backend's matmul (the AVX-512 kernel where the host has it,\n"
                         "else the BLAS; N x N x N, best of 5) with N threads (default OMP_NUM_THREADS\n"
                         "or all cores) and with one (cached for `quintet plan`). Prints\n"
                         "fma_peak_gflops=<all cores> fma_gflops_per_core=<x> sgemm_gflops=<rate> ...\n"
                         "--links (under mpirun, 2 ranks): all-reduce bandwidth and message latency\n"
                         "between two ranks, cached for `quintet plan`.\n"
                         "--memory: what bounds a decoder step (quintet generate): the rate at which 1 and N\n"
                         "threads read a 256 MiB array, and at which products of 1, 2, 4, 8 and 16 rows with\n"
                         "a 256 MiB [out, in] weight read it (medians of 7), each as a share of the read rate.\n";
            return 0;
        } else if (a.rfind("--threads=", 0) == 0) threads = std::atoi(a.c_str() + 10);
        else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (a.rfind("--size=", 0) == 0) size = std::atoi(a.c_str() + 7);
        else if (a == "--size" && i + 1 < argc) size = std::atoi(argv[++i]);
        else if (a == "--remeasure") remeasure = true;
        else if (a == "--memory") memory = true;
        else throw ConfigError("peak: unknown argument '" + a + "' (see quintet peak --help)");
    }
    auto be = make_cpu_backend(threads);
    if (memory) {
        for (int t : {1, be->threads()}) {
            auto b = make_cpu_backend(t);
            const double read = cpu_measure_read_gbs(*b);
            std::printf("threads=%d read_gbs=%.1f\n", t, read);
            for (int rows : {1, 2, 4, 8, 16}) {
                const double r = cpu_measure_rows_gbs(*b, rows);
                std::printf("threads=%d rows=%d weight_gbs=%.1f share_of_read=%.2f\n", t, rows, r, r / read);
            }
            if (be->threads() == 1) break;
        }
        return 0;
    }
    const double g = cpu_measure_sgemm_gflops(*be, size, 5);
    auto one = make_cpu_backend(1);
    const double g1 = cpu_measure_sgemm_gflops(*one, 1024, 5);
    // Kept with the earlier readings (the highest stands), or afresh with --remeasure.
    const double g1_kept = write_sgemm_cache(g1, remeasure);
    // After the sgemm: a cached peak below it is measured again (host_peak.hpp). `quintet peak`
    // always adds a reading.
    const HostPeak hp = host_fma_peak(remeasure, /*add_reading=*/true);
    be = make_cpu_backend(threads);  // restore the thread count for the process
    const int cores = host_cores();
    std::printf("cpu: %s, %d cores, %s\n", hp.cpu.c_str(), cores, hp.isa.c_str());
    std::printf("backend: %s\n", be->name().c_str());
    std::printf("cpu_bound_gflops_per_core=%.1f (%s)\n", hp.ceiling_per_core, hp.ceiling_what.c_str());
    std::printf("fma peak per core: %s\n", hp.describe().c_str());
    std::printf("sgemm per core (1 thread): this reading %.1f, the highest kept %.1f\n", g1, g1_kept);
    std::printf("fma_peak_gflops=%.1f fma_gflops_per_core=%.1f sgemm_gflops=%.1f threads=%d size=%d "
                "sgemm_gflops_per_core=%.1f sgemm_share_of_peak=%.2f\n",
                hp.gflops_per_core * cores, hp.gflops_per_core, g, be->threads(), size, g1_kept,
                g / (hp.gflops_per_core * std::min(cores, be->threads())));
    return 0;
}

int links_main(MPI_Comm world_handle) {
    const MpiCommunicator world(world_handle, "world");
    const int rank = world.rank(), size = world.size();
    if (size != 2) throw ConfigError("peak --links: run it on 2 ranks (mpirun -n 2 quintet peak --links)");
    // Bandwidth: a 64 MiB all-reduce, whose ring counts 2S(p-1)/p = S bytes per rank at p = 2.
    const size_t n = size_t(16) << 20;
    std::vector<float> buf(n, 1.0f);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        world.barrier();
        const double t0 = now_s();
        world.all_reduce_sum(buf.data(), n);
        best = std::min(best, now_s() - t0);
    }
    double t = best;
    world.all_reduce_max(&t, 1);
    // Latency: half a round trip of one float, median of 2000.
    std::vector<double> rt;
    float x = 0;
    for (int i = 0; i < 2000; ++i) {
        const double t0 = now_s();
        if (rank == 0) {
            world.send(&x, 1, 1, 0);
            world.recv(&x, 1, 1, 0, "peak --links");
        } else {
            world.recv(&x, 1, 0, 0, "peak --links");
            world.send(&x, 1, 0, 0);
        }
        rt.push_back((now_s() - t0) / 2);
    }
    std::nth_element(rt.begin(), rt.begin() + rt.size() / 2, rt.end());
    double lat = rt[rt.size() / 2];
    world.broadcast(&lat, sizeof lat, 0);
    if (rank == 0) {
        LinkFigures l;
        l.gbs = double(n) * sizeof(float) / t / 1e9;
        l.latency_s = lat;
        write_link_cache(l);
        std::printf("link_gbs=%.3f latency_s=%.3g\n", l.gbs, l.latency_s);
    }
    return 0;
}

}  // namespace quintet
