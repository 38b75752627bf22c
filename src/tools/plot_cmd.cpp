// `quintet plot RUN_DIR... [-o FILE.png]`: metrics.h5 of one or several runs as one PNG
// (scripts/plot_metrics.py draws it with matplotlib).
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "quintet/core/error.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/tools/python.hpp"

namespace quintet {

namespace fs = std::filesystem;

std::string plotting_python() {
    std::vector<std::string> tried;
    if (const char* e = std::getenv("QUINTET_PYTHON"); e && *e) tried.push_back(e);
    tried.push_back("/usr/bin/python3");
    tried.push_back("python3");
    for (const auto& py : tried)
        if (run_process({py, "-c", "import matplotlib, h5py, numpy"}, "", true) == 0) return py;
    std::string list;
    for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
    throw ConfigError("no python3 with matplotlib, h5py and numpy found (tried " + list +
                      "); install python3-matplotlib python3-h5py (scripts/setup.sh does), or set QUINTET_PYTHON");
}

int run_python(const std::string& script, const std::vector<std::string>& args) {
    std::vector<std::string> cmd{plotting_python(), script};
    cmd.insert(cmd.end(), args.begin(), args.end());
    return run_process(cmd);
}

int plot_main(int argc, char** argv) {
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::cout << "usage: quintet plot RUN_DIR [RUN_DIR...] [-o FILE.png]\n"
                         "Plots loss, eval loss, learning rate, grad norm, tokens/s, MFU and (MoE) expert\n"
                         "load from each RUN_DIR/metrics.h5 into one PNG, runs overlaid; default output\n"
                         "RUN_DIR/metrics.png of the first run. Needs python3 with matplotlib and h5py\n"
                         "(/usr/bin/python3 from Debian's python3-matplotlib is preferred over PATH's;\n"
                         "QUINTET_PYTHON overrides).\n";
            return 0;
        }
        args.push_back(a);
    }
    if (args.empty()) throw ConfigError("plot: no RUN_DIR given (see quintet plot --help)");
    return run_python(project_script("plot_metrics.py"), args);
}

}  // namespace quintet
