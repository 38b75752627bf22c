#include "quintet/study/run_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "quintet/core/stats.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/io/metrics_schema.hpp"

namespace quintet {

namespace fs = std::filesystem;

double median(std::vector<double> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
    return v.empty() ? std::nan("") : median_of(v);
}

std::vector<double> steady(const std::vector<double>& v) {
    return v.size() > 3 ? std::vector<double>(v.begin() + 2, v.end()) : v;
}

RunResult read_run(const Study& st, const Case& c) {
    RunResult r;
    std::ifstream m(done_marker(st, c));
    if (!(m >> r.exit_status)) {
        std::ifstream failed(failed_marker(st, c));  // a run that ended with an error: its status, nothing else
        if (!(failed >> r.exit_status)) r.exit_status = -1;
        return r;
    }
    const std::string path = run_dir(st, c) + "/metrics.h5";
    if (!fs::exists(path)) return r;
    h5::silence_errors();
    h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!f.valid()) return r;
    namespace ms = metrics_schema;
    auto train = [&](const char* col) { return h5::read_f64(f, ms::path(ms::kTrain, col)); };
    r.step = train(ms::kStep);
    r.loss = train(ms::kLoss);
    r.grad_norm = train(ms::kGradNorm);
    r.tps = train(ms::kTokensPerS);
    r.mfu = train(ms::kMfu);
    r.mfu_matmul = train(ms::kMfuMatmul);
    r.step_time = train(ms::kStepTime);
    r.eval_loss = h5::read_f64(f, ms::path(ms::kEval, ms::kLoss));
    r.expert_load = h5::read_f64(f, ms::kExpertLoad);
    for (const char* k : {ms::kTpComm, ms::kCpExposed, ms::kTimeDpReduce, ms::kEpDispatch, ms::kEpCombine, ms::kTimePipelineWait})
        r.timing[k] = h5::read_f64(f, ms::path(ms::kTiming, k));
    std::vector<hsize_t> dims;
    std::vector<std::vector<double>> cols;
    for (const char* k : ms::kMemoryCategories) cols.push_back(h5::read_f64(f, ms::memory_path(k), &dims));
    if (dims.size() == 2 && dims[0] > 0) {
        r.ranks = int(dims[1]);
        const size_t last = size_t(dims[0] - 1) * dims[1];
        r.memory.assign(size_t(r.ranks) * 6, 0.0);
        // study.h5 keeps params, grads, optimizer, activations, buffers, peak_rss per rank.
        const int keep[6] = {0, 1, 2, 3, 4, 6};
        for (int q = 0; q < r.ranks; ++q)
            for (int j = 0; j < 6; ++j)
                r.memory[size_t(q) * 6 + j] = cols[size_t(keep[j])].size() > last + q ? cols[size_t(keep[j])][last + q] : std::nan("");
    }
    r.done = r.exit_status == 0 && !r.loss.empty();
    return r;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
    if (a.empty() || a.size() != b.size()) return std::nan("");
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-12));
    return m;
}

}  // namespace quintet
