// The FMA peak behind MFU (train/host_peak.cpp): measured on all cores, cached per host and CPU
// model, the cached value the measured one; a cache of another CPU model is measured again; the
// sgemm rate behind "% of sgemm", the best measurement seen on the host.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "quintet/perf/host_peak.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;

TEST(HostPeak, MeasuredOnceThenCachedExactly) {
    const fs::path dir = quintet::testing::scratch_dir("host_peak");
    setenv("QUINTET_CACHE_DIR", dir.c_str(), 1);
    const quintet::HostPeak m = quintet::host_fma_peak(/*remeasure=*/true);
    EXPECT_EQ(m.source, "measured");
    EXPECT_GT(m.gflops_per_core, 0.5);  // any FMA unit at any clock
    EXPECT_LT(m.gflops_per_core, 1000);
    const quintet::HostPeak c = quintet::host_fma_peak();
    EXPECT_NE(c.source.find("cached in"), std::string::npos) << c.source;
    EXPECT_NEAR(c.gflops_per_core, m.gflops_per_core, 1e-3 * m.gflops_per_core);  // the same figure, per core
    EXPECT_EQ(c.isa, m.isa);
    // An entry written for another CPU model (a host name reused) is not trusted.
    {
        std::ofstream o(quintet::host_peak_cache_path());
        o << "gflops_per_core=12345 isa=avx2+fma cpu=Some Other CPU\n";
    }
    const quintet::HostPeak again = quintet::host_fma_peak();
    EXPECT_EQ(again.source, "measured");
    EXPECT_LT(again.gflops_per_core, 1000);
    unsetenv("QUINTET_CACHE_DIR");
}

// A peak read on a busy host (below what an sgemm on one thread reached here) is not kept: it
// would inflate every MFU on the host. Seen on a Zen 4 host, whose first reading right after the
// build was half its peak (58 against 105 GFLOP/s of sgemm per core).
TEST(HostPeak, APeakBelowTheSgemmRateIsMeasuredAgain) {
    const fs::path dir = quintet::testing::scratch_dir("host_peak_low");
    fs::remove_all(dir);
    fs::create_directories(dir);
    setenv("QUINTET_CACHE_DIR", dir.c_str(), 1);
    const quintet::HostPeak m = quintet::host_fma_peak(/*remeasure=*/true);
    std::string line;
    std::getline(std::ifstream(quintet::host_peak_cache_path()), line);
    const std::string cpu = line.substr(line.find(" cpu="));
    ASSERT_NE(line.find(" one_core="), std::string::npos) << line;
    quintet::write_sgemm_cache(0.01);  // one thread's sgemm, far below any real FMA rate
    auto write_entry = [&](double per_core, double one) {
        std::ofstream o(quintet::host_peak_cache_path());
        o << "gflops_per_core=" << per_core << " isa=" << m.isa << " one_core=" << one << cpu << "\n";
    };
    // Consistent with the sgemm: trusted as it is.
    write_entry(0.002, 0.02);
    const quintet::HostPeak kept = quintet::host_fma_peak();
    EXPECT_NE(kept.source.find("cached in"), std::string::npos) << kept.source;
    EXPECT_DOUBLE_EQ(kept.gflops_per_core, 0.002);
    // Below it: measured again, and the new (higher) reading is what is cached.
    write_entry(0.002, 0.005);
    const quintet::HostPeak fixed = quintet::host_fma_peak();
    EXPECT_EQ(fixed.source, "measured");
    EXPECT_GT(fixed.gflops_per_core, 0.5);
    const quintet::HostPeak after = quintet::host_fma_peak();
    EXPECT_NE(after.source.find("cached in"), std::string::npos) << after.source;
    EXPECT_NEAR(after.gflops_per_core, fixed.gflops_per_core, 1e-3 * fixed.gflops_per_core);
    // An entry without the one-core figure (written before it existed) is measured again.
    {
        std::ofstream o(quintet::host_peak_cache_path());
        o << "gflops_per_core=0.002 isa=" << m.isa << cpu << "\n";
    }
    EXPECT_EQ(quintet::host_fma_peak().source, "measured");
    unsetenv("QUINTET_CACHE_DIR");
}

// The sgemm rate behind "% of sgemm": the measurement, but no less than the best one seen on
// this host for the same arrangement (a short measurement on a busy host reads low).
TEST(HostPeak, SgemmRateIsTheBestMeasurementSeenHere) {
    const fs::path dir = quintet::testing::scratch_dir("host_sgemm");
    fs::remove_all(dir);
    fs::create_directories(dir);
    setenv("QUINTET_CACHE_DIR", dir.c_str(), 1);
    double measured = 0;
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
    unsetenv("QUINTET_CACHE_DIR");
}
