// The hardware peak behind MFU (docs/math.md §1.4): one core's fp32 FMA rate, measured once per
// host and CPU model and cached, so every run (and `quintet plan`) uses the same denominator.
#pragma once
#include <string>

#include "quintet/comm/mpi_communicator.hpp"

namespace quintet {

struct HostPeak {
    double gflops_per_core = 0;
    std::string isa, cpu, source;  // source: "cached in PATH" or "measured"
};

// The cache file: $QUINTET_CACHE_DIR, else $XDG_CACHE_HOME/quintet, else ~/.cache/quintet, then
// fma_peak-<hostname>. An entry for another CPU model (a host name reused) is measured again.
std::string host_peak_cache_path();
// One core's FMA peak of this host: the cache, else measured on all cores at once (their sum
// over the cores: SMT siblings sharing FMA units count once; about 0.5 s), then on one core
// alone, and cached. A cached entry whose one-core figure is below the cached one-thread sgemm
// rate (read_sgemm_cache) was read on a busy host: it is measured again and the higher of the
// readings kept; `remeasure` replaces the entry outright.
HostPeak host_fma_peak(bool remeasure = false);

// The intra-node link between two ranks as `quintet plan --measure` measured it (cached beside
// the FMA peak, file links-<hostname>): all-reduce bandwidth (ring bytes per rank / s) and the
// latency of a small message. false when never measured on this host.
struct LinkFigures {
    double gbs = 0, latency_s = 0;
};
bool read_link_cache(LinkFigures* out);
void write_link_cache(const LinkFigures& l);

// The sgemm rate of one thread, as `quintet peak` measured it (cached: sgemm-<hostname>).
bool read_sgemm_cache(double* gflops_per_core);
void write_sgemm_cache(double gflops_per_core);

// This process's resident set now (VmRSS) and at its peak (VmHWM), bytes; 0 without /proc.
double process_rss_bytes();
double process_peak_rss_bytes();
// The memory this node can still give, bytes: MemAvailable, or less when the process's memory
// cgroup (v1 or v2) has a limit (its limit less its usage); -1 when neither can be read.
double host_available_memory_bytes();

// Cores of this host (online), QUINTET_CORES overriding (as threads_per_rank does).
int host_cores();

// The peak FLOP/s of the cores a job's ranks run on: per node, one core's FMA peak times
// min(cores, threads of the node's ranks), summed over nodes. Collective over `world`; each
// node's first rank measures or reads the cache. Also returns this rank's node's peak in *info.
double job_fma_peak_flops(const MpiCommunicator& world, int threads_per_rank, HostPeak* info = nullptr);

// The sgemm rate behind "% of sgemm" (the progress line, the planner check): the sum of every
// rank's `measured_gflops` (taken at once, so shared cores are not counted twice), but per node
// the best such sum seen on this host for the same ranks x threads (cached beside the FMA peak,
// sgemm_<blas>_r<ranks>t<threads>-<host>): a 0.1 s measurement on a busy host reads 30-40% low,
// which put steady-state steps at "128% of sgemm". FLOP/s; *measured_flops gets this run's
// measurements alone. Collective over `world`.
double job_sgemm_flops(const MpiCommunicator& world, double measured_gflops, int threads_per_rank,
                       double* measured_flops = nullptr);

}  // namespace quintet
