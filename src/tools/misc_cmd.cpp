// Small subcommands: `quintet deck` (the option table as a reference deck or Markdown) and
// `quintet peak` (this machine's measured sgemm rate, the default peak behind MFU).
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "quintet/core/error.hpp"
#include "quintet/train/deck.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/tools/commands.hpp"

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
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::cout << "usage: quintet peak [--threads N] [--size N]\n"
                         "Measures OpenBLAS sgemm GFLOP/s (N x N x N, best of 5) with N threads\n"
                         "(default OMP_NUM_THREADS or all cores); prints sgemm_gflops=<rate>.\n";
            return 0;
        } else if (a.rfind("--threads=", 0) == 0) threads = std::atoi(a.c_str() + 10);
        else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (a.rfind("--size=", 0) == 0) size = std::atoi(a.c_str() + 7);
        else if (a == "--size" && i + 1 < argc) size = std::atoi(argv[++i]);
        else throw ConfigError("peak: unknown argument '" + a + "' (see quintet peak --help)");
    }
    auto be = make_cpu_backend(threads);
    double g = cpu_measure_sgemm_gflops(*be, size, 5);
    std::printf("sgemm_gflops=%.1f threads=%d size=%d\n", g, be->threads(), size);
    return 0;
}

}  // namespace quintet
