// Small subcommands: `quintet deck` (the option table as a reference deck or Markdown) and
// `quintet peak` (this host's FMA peak behind MFU, and its sgemm rate; --links: two ranks' link).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/train/deck.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/train/host_peak.hpp"

namespace quintet {

int deck_main(int argc, char** argv) {
    std::string what = argc > 1 ? argv[1] : "--reference";
    if (what == "--reference") std::cout << deck_reference_text();
    else if (what == "--markdown") std::cout << deck_markdown_table();
    else {
        std::cout << "usage: quintet deck [--reference | --markdown]\n"
                     "  --reference  every key with its default and meaning, as a deck file\n"
                     "  --markdown   the same as a Markdown table (docs/deck.md)\n";
        return what == "--help" || what == "-h" ? 0 : 2;
    }
    return 0;
}

int peak_main(int argc, char** argv) {
    int threads = 0, size = 2048;
    bool remeasure = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::cout << "usage: quintet peak [--threads N] [--size N] [--remeasure]\n"
                         "       mpirun -n 2 quintet peak --links\n"
                         "Measures this host's fp32 FMA peak (one core, a loop of independent FMAs in the\n"
                         "widest vector ISA; cached per host and CPU model: the denominator of MFU) and the\n"
                         "sgemm rate of the CPU backend's matmul (the AVX-512 kernel where the host has it,\n"
                         "else the BLAS; N x N x N, best of 5) with N threads (default OMP_NUM_THREADS\n"
                         "or all cores) and with one (cached for `quintet plan`). Prints\n"
                         "fma_peak_gflops=<all cores> fma_gflops_per_core=<x> sgemm_gflops=<rate> ...\n"
                         "--links (under mpirun, 2 ranks): all-reduce bandwidth and message latency\n"
                         "between two ranks, cached for `quintet plan`.\n";
            return 0;
        } else if (a.rfind("--threads=", 0) == 0) threads = std::atoi(a.c_str() + 10);
        else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (a.rfind("--size=", 0) == 0) size = std::atoi(a.c_str() + 7);
        else if (a == "--size" && i + 1 < argc) size = std::atoi(argv[++i]);
        else if (a == "--remeasure") remeasure = true;
        else throw ConfigError("peak: unknown argument '" + a + "' (see quintet peak --help)");
    }
    auto be = make_cpu_backend(threads);
    const double g = cpu_measure_sgemm_gflops(*be, size, 5);
    auto one = make_cpu_backend(1);
    const double g1 = cpu_measure_sgemm_gflops(*one, 1024, 5);
    write_sgemm_cache(g1);
    // After the sgemm: a cached peak below it is measured again (host_peak.hpp).
    const HostPeak hp = host_fma_peak(remeasure);
    be = make_cpu_backend(threads);  // restore the thread count for the process
    const int cores = host_cores();
    std::printf("cpu: %s, %d cores, %s\n", hp.cpu.c_str(), cores, hp.isa.c_str());
    std::printf("backend: %s\n", be->name().c_str());
    std::printf("fma_peak_gflops=%.1f fma_gflops_per_core=%.1f (%s) sgemm_gflops=%.1f threads=%d size=%d "
                "sgemm_gflops_per_core=%.1f sgemm_share_of_peak=%.2f\n",
                hp.gflops_per_core * cores, hp.gflops_per_core, hp.source.c_str(), g, be->threads(), size, g1,
                g / (hp.gflops_per_core * std::min(cores, be->threads())));
    return 0;
}

int links_main(MPI_Comm world) {
    int rank = 0, size = 1;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    if (size != 2) throw ConfigError("peak --links: run it on 2 ranks (mpirun -n 2 quintet peak --links)");
    // Bandwidth: a 64 MiB all-reduce, whose ring counts 2S(p-1)/p = S bytes per rank at p = 2.
    const size_t n = size_t(16) << 20;
    std::vector<float> buf(n, 1.0f);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        MPI_Barrier(world);
        const double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(n), MPI_FLOAT, MPI_SUM, world);
        best = std::min(best, MPI_Wtime() - t0);
    }
    double t = best;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world);
    // Latency: half a round trip of one float, median of 2000.
    std::vector<double> rt;
    float x = 0;
    for (int i = 0; i < 2000; ++i) {
        const double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(&x, 1, MPI_FLOAT, 1, 0, world);
            MPI_Recv(&x, 1, MPI_FLOAT, 1, 0, world, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&x, 1, MPI_FLOAT, 0, 0, world, MPI_STATUS_IGNORE);
            MPI_Send(&x, 1, MPI_FLOAT, 0, 0, world);
        }
        rt.push_back((MPI_Wtime() - t0) / 2);
    }
    std::nth_element(rt.begin(), rt.begin() + rt.size() / 2, rt.end());
    double lat = rt[rt.size() / 2];
    MPI_Bcast(&lat, 1, MPI_DOUBLE, 0, world);
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
