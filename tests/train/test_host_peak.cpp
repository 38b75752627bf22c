// The FMA peak behind MFU (train/host_peak.cpp): measured on all cores, cached per host and CPU
// model, the cached value the measured one; a cache of another CPU model is measured again.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "quintet/train/host_peak.hpp"
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
