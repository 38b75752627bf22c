// The hardware peak behind MFU (docs/math.md §1.4): one core's fp32 FMA rate, measured once per
// host and CPU model and cached, so every run (and `quintet plan`) uses the same denominator.
#pragma once
#include <string>

#include "quintet/comm/mpi_communicator.hpp"

namespace quintet {

// How many runs read the FMA peak and the one-thread sgemm rate before the cached figures are
// used as they are: a reading on a busy host is low, and the highest of several taken at
// different times is the machine's.
constexpr int kPeakReadings = 3;

struct HostPeak {
    double gflops_per_core = 0;
    std::string isa, cpu;
    std::string source;             // where the figure came from: "cached in PATH, the highest of 3 readings",
                                    // "measured now (why), the highest of N readings"
    double ceiling_per_core = 0;    // the CPU's own bound (cpu_fma_ceiling), 0 when unknown
    std::string ceiling_what;       // how the bound is made
    std::string describe() const;   // source, and the share of the CPU's bound
};

// The cache file: $QUINTET_CACHE_DIR, else $XDG_CACHE_HOME/quintet, else ~/.cache/quintet, then
// fma_peak-<hostname>. An entry for another CPU model (a host name reused) is measured again.
std::string host_peak_cache_path();
// One core's FMA peak of this host: measured on all cores at once (their sum over the cores:
// SMT siblings sharing FMA units count once; about 0.5 s), then on one core alone, and cached
// with the count of readings. Measured again, the highest reading kept, while fewer than
// kPeakReadings runs have read it; when a run marked it low (host_peak_note_achieved); when the
// cached one-thread sgemm rate beats the one-core figure by more than 5% (an sgemm is FMAs; the
// one-core figure is then raised to that rate). A cached or measured figure above the CPU's own
// bound (kernels' cpu_fma_ceiling) is not used. `remeasure` starts the entry afresh;
// `add_reading` (quintet peak) measures and keeps the highest even when the entry is settled.
HostPeak host_fma_peak(bool remeasure = false, bool add_reading = false);
// A run's step reached `ratio` (> 1) times the FMA peak it was measured against: the cached
// figure rises by that ratio (within the CPU's bound) and is marked, so the next run measures
// again. Rank 0 of a run calls it; a missing cache is left alone.
void host_peak_note_achieved(double ratio);

// The intra-node link between two ranks as `quintet plan --measure` measured it (cached beside
// the FMA peak, file links-<hostname>): all-reduce bandwidth (ring bytes per rank / s) and the
// latency of a small message. false when never measured on this host.
struct LinkFigures {
    double gbs = 0, latency_s = 0;
};
bool read_link_cache(LinkFigures* out);
void write_link_cache(const LinkFigures& l);

// The sgemm rate of one thread (cached: sgemm_<blas>-<hostname>, the highest reading and their
// count; `quintet peak`, plan and study measure it). read: false when absent or above the CPU's
// bound; *readings is 0 when a run marked it low. write: keeps the higher of `g` and the cached
// rate unless `replace`, adds a reading, and returns the rate kept.
bool read_sgemm_cache(double* gflops_per_core, int* readings = nullptr);
double write_sgemm_cache(double gflops_per_core, bool replace = false);
// The one-thread sgemm rate for the planner: the cached one once kPeakReadings readings are
// in (and no run marked it low), else measured now (1024^3, best of 5, about 0.2 s) and kept
// with the others. *source says which.
double host_sgemm_gflops_per_core(std::string* source = nullptr);
// A run's step reached `gflops_per_core` per core, above the cached one-thread sgemm rate: the
// cached rate rises to it and is marked, so the next plan measures again.
void sgemm_note_achieved(double gflops_per_core);

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
