// The FMA peak behind MFU (perf/host_peak.cpp): measured on all cores and cached per host and CPU
// model; measured again, the highest reading kept, until three runs have read it, when a run's
// step went faster than it, and when one thread's sgemm beat it; a cached or measured figure
// above the CPU's own bound (cores x clock x FMA units x lanes x 2) is not used; a cache of
// another CPU model is measured again. The sgemm rates, the best measurement seen on the host,
// bounded the same way.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "quintet/kernels/backend.hpp"
#include "quintet/perf/host_peak.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;

namespace {

// A fresh cache folder for one test.
struct ScratchCache {
    explicit ScratchCache(const std::string& name) {
        const fs::path dir = quintet::testing::scratch_dir(name);
        setenv("QUINTET_CACHE_DIR", dir.c_str(), 1);
    }
    ~ScratchCache() { unsetenv("QUINTET_CACHE_DIR"); }
};

std::string cache_line(const std::string& path) {
    std::string line;
    std::getline(std::ifstream(path), line);
    return line;
}

// " cpu=<this host's model>", the end of every entry.
std::string cpu_suffix() {
    const std::string line = cache_line(quintet::host_peak_cache_path());
    return line.substr(line.find(" cpu="));
}

void write_fma_entry(double per_core, double one, const std::string& isa, int readings, const std::string& cpu) {
    std::ofstream o(quintet::host_peak_cache_path());
    o << "gflops_per_core=" << per_core << " isa=" << isa << " one_core=" << one << " readings=" << readings << cpu
      << "\n";
}

double cached_value(const std::string& path, const std::string& key) {
    const std::string line = cache_line(path);
    const size_t at = line.find(key + "=");
    return at == std::string::npos ? 0 : std::atof(line.c_str() + at + key.size() + 1);
}

}  // namespace

// The CPU's own figures: a bound that no real measurement here exceeds.
TEST(HostPeak, TheCpuBoundIsAboveWhatTheCoreDoes) {
    const quintet::FmaCeiling c = quintet::cpu_fma_ceiling();
    std::printf("[ peak ] CPU bound %.1f GFLOP/s per core: %s\n", c.gflops_per_core, c.describe().c_str());
    if (c.gflops_per_core <= 0) GTEST_SKIP() << "this host reports no clock";
    EXPECT_GE(c.lanes, 4);
    EXPECT_EQ(c.fma_units, 2);
    EXPECT_GE(c.allowance, 1.0);
    const quintet::FmaPeak one = quintet::cpu_measure_fma_peak(1);
    EXPECT_LT(one.gflops, c.gflops_per_core) << c.describe();
    auto be = quintet::make_cpu_backend(1);
    EXPECT_LT(quintet::cpu_measure_sgemm_gflops(*be, 512, 3), c.gflops_per_core) << c.describe();
}

// Three runs read the peak (a first reading on a busy host is low); then the highest is used as
// it is, exactly.
TEST(HostPeak, MeasuredThreeTimesThenCachedExactly) {
    ScratchCache cache("host_peak");
    const quintet::HostPeak m = quintet::host_fma_peak(/*remeasure=*/true);
    EXPECT_NE(m.source.find("measured now (--remeasure), the highest of 1 readings"), std::string::npos) << m.source;
    EXPECT_GT(m.gflops_per_core, 0.5);  // any FMA unit at any clock
    EXPECT_LT(m.gflops_per_core, 1000);
    const quintet::HostPeak r2 = quintet::host_fma_peak();
    EXPECT_NE(r2.source.find("reading 2 of 3"), std::string::npos) << r2.source;
    const quintet::HostPeak r3 = quintet::host_fma_peak();
    EXPECT_NE(r3.source.find("reading 3 of 3"), std::string::npos) << r3.source;
    EXPECT_GE(r3.gflops_per_core, r2.gflops_per_core);  // readings only go up
    EXPECT_GE(r2.gflops_per_core, m.gflops_per_core);
    const quintet::HostPeak c = quintet::host_fma_peak();
    EXPECT_NE(c.source.find("cached in"), std::string::npos) << c.source;
    EXPECT_NE(c.source.find("the highest of 3 readings"), std::string::npos) << c.source;
    EXPECT_NEAR(c.gflops_per_core, r3.gflops_per_core, 1e-3 * r3.gflops_per_core);
    EXPECT_EQ(c.isa, m.isa);
    // An entry written for another CPU model (a host name reused) is not trusted.
    write_fma_entry(12345, 12345, "avx2+fma", 3, " cpu=Some Other CPU");
    const quintet::HostPeak again = quintet::host_fma_peak();
    EXPECT_NE(again.source.find("nothing cached"), std::string::npos) << again.source;
    EXPECT_LT(again.gflops_per_core, 1000);
}

// A peak cached from a measurement on a busy machine is corrected upward by the next readings,
// and a settled one is measured again once a run's step went faster than it.
TEST(HostPeak, ALowCachedPeakIsCorrectedUpward) {
    ScratchCache cache("host_peak_upward");
    const quintet::HostPeak m = quintet::host_fma_peak(/*remeasure=*/true);
    const std::string cpu = cpu_suffix();
    write_fma_entry(0.002, 0.002, m.isa, 1, cpu);
    const quintet::HostPeak fixed = quintet::host_fma_peak();
    EXPECT_NE(fixed.source.find("reading 2 of 3"), std::string::npos) << fixed.source;
    EXPECT_GT(fixed.gflops_per_core, 0.5);
    EXPECT_GT(cached_value(quintet::host_peak_cache_path(), "gflops_per_core"), 0.5);
    EXPECT_EQ(cached_value(quintet::host_peak_cache_path(), "readings"), 2);
    // Settled (three readings) but low: a step at twice the figure raises it and marks it ...
    write_fma_entry(0.002, 0.002, m.isa, 3, cpu);
    EXPECT_DOUBLE_EQ(quintet::host_fma_peak().gflops_per_core, 0.002);
    quintet::host_peak_note_achieved(2.0);
    EXPECT_DOUBLE_EQ(cached_value(quintet::host_peak_cache_path(), "gflops_per_core"), 0.004);
    EXPECT_NE(cache_line(quintet::host_peak_cache_path()).find(" low=1"), std::string::npos);
    // ... so the next run measures again, and the mark goes.
    const quintet::HostPeak remeasured = quintet::host_fma_peak();
    EXPECT_NE(remeasured.source.find("a run's step went faster"), std::string::npos) << remeasured.source;
    EXPECT_GT(remeasured.gflops_per_core, 0.5);
    EXPECT_EQ(cache_line(quintet::host_peak_cache_path()).find(" low=1"), std::string::npos);
}

// A cached figure above what the CPU can do by its own figures is an error: measured again.
TEST(HostPeak, APeakAboveTheCpuBoundIsRejected) {
    ScratchCache cache("host_peak_bound");
    const double bound = quintet::cpu_fma_ceiling().gflops_per_core;
    if (bound <= 0) GTEST_SKIP() << "this host reports no clock";
    const quintet::HostPeak m = quintet::host_fma_peak(/*remeasure=*/true);
    write_fma_entry(1.5 * bound, 1.5 * bound, m.isa, 3, cpu_suffix());
    const quintet::HostPeak p = quintet::host_fma_peak();
    EXPECT_NE(p.source.find("above the CPU's bound"), std::string::npos) << p.source;
    EXPECT_LT(p.gflops_per_core, bound);
    EXPECT_LT(cached_value(quintet::host_peak_cache_path(), "one_core"), bound);
    EXPECT_DOUBLE_EQ(p.ceiling_per_core, bound);
    EXPECT_NE(p.describe().find("of the CPU's bound"), std::string::npos) << p.describe();
    // A one-thread sgemm faster than the bound is not read either.
    quintet::write_sgemm_cache(2 * bound, /*replace=*/true);
    double g = 0;
    EXPECT_FALSE(quintet::read_sgemm_cache(&g));
}

// One thread's sgemm (FMAs on one core) beating the cached one-core figure says that figure was
// read on a busy host: measured again, and the one-core figure is at least the sgemm's rate. Seen
// on a Zen 4 host, whose first reading right after the build was half its peak (58 against 105
// GFLOP/s of sgemm per core).
TEST(HostPeak, APeakBelowTheSgemmRateIsMeasuredAgain) {
    ScratchCache cache("host_peak_low");
    const quintet::HostPeak m = quintet::host_fma_peak(/*remeasure=*/true);
    const std::string cpu = cpu_suffix();
    quintet::write_sgemm_cache(0.01, /*replace=*/true);  // far below any real FMA rate
    // Consistent with the sgemm and settled: trusted as it is.
    write_fma_entry(0.002, 0.02, m.isa, 3, cpu);
    const quintet::HostPeak kept = quintet::host_fma_peak();
    EXPECT_NE(kept.source.find("cached in"), std::string::npos) << kept.source;
    EXPECT_DOUBLE_EQ(kept.gflops_per_core, 0.002);
    // Below it: measured again, and the new (higher) reading is what is cached.
    write_fma_entry(0.002, 0.005, m.isa, 3, cpu);
    const quintet::HostPeak fixed = quintet::host_fma_peak();
    EXPECT_NE(fixed.source.find("sgemm"), std::string::npos) << fixed.source;
    EXPECT_GT(fixed.gflops_per_core, 0.5);
    const quintet::HostPeak after = quintet::host_fma_peak();
    EXPECT_NE(after.source.find("cached in"), std::string::npos) << after.source;
    EXPECT_NEAR(after.gflops_per_core, fixed.gflops_per_core, 1e-3 * fixed.gflops_per_core);
    // An sgemm rate above any one-core reading here (but within the CPU's bound) becomes the
    // one-core figure: the core did that much.
    if (const double bound = quintet::cpu_fma_ceiling().gflops_per_core; bound > 0) {
        quintet::write_sgemm_cache(0.9 * bound, /*replace=*/true);
        quintet::host_fma_peak();
        EXPECT_GE(cached_value(quintet::host_peak_cache_path(), "one_core"), 0.9 * bound * (1 - 1e-4));
    }
    // An entry without the one-core figure (written before it existed) is measured again.
    {
        std::ofstream o(quintet::host_peak_cache_path());
        o << "gflops_per_core=0.002 isa=" << m.isa << cpu << "\n";
    }
    EXPECT_NE(quintet::host_fma_peak().source.find("measured now"), std::string::npos);
}

// The one-thread sgemm rate: the highest reading kept, three readings before the cached one is
// used as it is, measured again after a run's step went faster.
TEST(HostPeak, TheSgemmRateKeepsTheHighestReading) {
    ScratchCache cache("host_sgemm_one");
    double g = 0;
    int n = 0;
    EXPECT_FALSE(quintet::read_sgemm_cache(&g));
    EXPECT_DOUBLE_EQ(quintet::write_sgemm_cache(5.0), 5.0);
    EXPECT_DOUBLE_EQ(quintet::write_sgemm_cache(1.0), 5.0);  // a lower reading does not replace it
    ASSERT_TRUE(quintet::read_sgemm_cache(&g, &n));
    EXPECT_DOUBLE_EQ(g, 5.0);
    EXPECT_EQ(n, 2);
    EXPECT_DOUBLE_EQ(quintet::write_sgemm_cache(7.0), 7.0);
    EXPECT_DOUBLE_EQ(quintet::write_sgemm_cache(2.0, /*replace=*/true), 2.0);  // quintet peak --remeasure
    // Fewer than three readings: the planner's figure is measured now, and kept if higher.
    std::string from;
    const double planned = quintet::host_sgemm_gflops_per_core(&from);
    EXPECT_NE(from.find("measured now"), std::string::npos) << from;
    EXPECT_GT(planned, 2.0);
    quintet::host_sgemm_gflops_per_core(&from);
    EXPECT_NE(from.find("the highest of 3 readings"), std::string::npos) << from;
    const double settled = quintet::host_sgemm_gflops_per_core(&from);
    EXPECT_NE(from.find("cached in"), std::string::npos) << from;
    // A step faster per core than the cached rate marks it: measured again, kept at least that.
    quintet::sgemm_note_achieved(settled * 1.1);
    ASSERT_TRUE(quintet::read_sgemm_cache(&g, &n));
    EXPECT_NEAR(g, settled * 1.1, 1e-4 * settled);
    EXPECT_EQ(n, 0);
    EXPECT_GE(quintet::host_sgemm_gflops_per_core(&from), settled * 1.1 * (1 - 1e-4));
    EXPECT_NE(from.find("measured now"), std::string::npos) << from;
}

// The sgemm rate behind "% of sgemm": the measurement, but no less than the best one seen on
// this host for the same arrangement (a short measurement on a busy host reads low).
TEST(HostPeak, SgemmRateIsTheBestMeasurementSeenHere) {
    ScratchCache cache("host_sgemm");
    double measured = 0;
    // A peak cached low (a busy host) must not make real sgemm rates "impossible": the bound is
    // the CPU's own, not the measured peak.
    const quintet::HostPeak m = quintet::host_fma_peak(/*remeasure=*/true);
    write_fma_entry(0.002, 0.002, m.isa, 3, cpu_suffix());
    quintet::write_sgemm_cache(0.001, /*replace=*/true);
    // Nothing cached: the measurement as it is (and it is kept).
    EXPECT_DOUBLE_EQ(quintet::job_sgemm_flops(quintet::MpiCommunicator(MPI_COMM_WORLD), 50.0, 2, &measured), 50e9);
    EXPECT_DOUBLE_EQ(measured, 50e9);
    // A lower one reads as the best seen; the measurement itself is reported.
    EXPECT_DOUBLE_EQ(quintet::job_sgemm_flops(quintet::MpiCommunicator(MPI_COMM_WORLD), 10.0, 2, &measured), 50e9);
    EXPECT_DOUBLE_EQ(measured, 10e9);
    // A higher one stands and becomes the best.
    EXPECT_DOUBLE_EQ(quintet::job_sgemm_flops(quintet::MpiCommunicator(MPI_COMM_WORLD), 60.0, 2, &measured), 60e9);
    EXPECT_DOUBLE_EQ(quintet::job_sgemm_flops(quintet::MpiCommunicator(MPI_COMM_WORLD), 55.0, 2, &measured), 60e9);
    // Another arrangement (threads per rank) has its own figure.
    EXPECT_DOUBLE_EQ(quintet::job_sgemm_flops(quintet::MpiCommunicator(MPI_COMM_WORLD), 20.0, 1, &measured), 20e9);
    // One above the CPU's bound for the cores used is a measurement error: not used, not kept.
    if (const double bound = quintet::cpu_fma_ceiling().gflops_per_core; bound > 0) {
        const int cores = std::min(quintet::host_cores(), 2);
        EXPECT_DOUBLE_EQ(
            quintet::job_sgemm_flops(quintet::MpiCommunicator(MPI_COMM_WORLD), 3 * bound * cores, 2, &measured), 60e9);
        EXPECT_DOUBLE_EQ(quintet::job_sgemm_flops(quintet::MpiCommunicator(MPI_COMM_WORLD), 10.0, 2, &measured), 60e9);
    }
}
